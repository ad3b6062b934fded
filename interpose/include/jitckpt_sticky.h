/* jitckpt_sticky.h -- which CUDA errors are sticky device errors: the context is lost and every later call
 * fails, which transparent recovery repairs with a new proxy (interpose/remote/recover.c; the proxy's
 * serve.c, for a library call that failed because of one).  Include after cuda_runtime_api.h. */
#ifndef JITCKPT_STICKY_H
#define JITCKPT_STICKY_H

static inline int jitckpt_sticky_cuda_error(int e)
{
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorDevicesUnavailable ||
           e == cudaErrorECCUncorrectable || e == cudaErrorHardwareStackError || e == cudaErrorIllegalInstruction ||
           e == cudaErrorMisalignedAddress || e == cudaErrorInvalidAddressSpace || e == cudaErrorInvalidPc ||
           e == cudaErrorLaunchTimeout;
}

#endif
