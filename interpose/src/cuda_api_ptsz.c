/* cuda_api_ptsz.c -- the per-thread-default-stream twins of cuda_api.c.
 *
 * Code built with `nvcc --default-stream per-thread` calls cudaEventRecord_ptsz,
 * cudaMemcpy_ptds and so on, where stream 0 means the calling thread's own
 * default stream.  Defining CUDA_API_PER_THREAD_DEFAULT_STREAM before the
 * real header makes it rename the declarations, so each definition below is
 * the _ptsz/_ptds function, checked against NVIDIA's prototype (the
 * __cudaLaunchKernel_ptsz prototype is in cuda_wrap.h: nvcc declares it only
 * in a C++ header). */

#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include "cuda_wrap.h"

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return wrap_event_record(forward_fn(&next_cudaEventRecord_ptsz), event, stream, 1);
}

EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                            unsigned int flags)
{
    return wrap_event_record_flags(forward_fn(&next_cudaEventRecordWithFlags_ptsz), event, stream,
                                   flags, 1);
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    return wrap_stream_wait_event(forward_fn(&next_cudaStreamWaitEvent_ptsz), stream, event, flags,
                                  1);
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return wrap_stream_synchronize(forward_fn(&next_cudaStreamSynchronize_ptsz), stream, 1);
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return wrap_memcpy(forward_fn(&next_cudaMemcpy_ptds), forward_fn(&next_cudaMemcpyAsync_ptsz),
                       forward_fn(&next_cudaStreamSynchronize_ptsz), dst, src, count, kind, 1);
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                   enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return wrap_memcpy_async(forward_fn(&next_cudaMemcpyAsync_ptsz), dst, src, count, kind, stream,
                             1);
}

EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return wrap_memcpy2d(forward_fn(&next_cudaMemcpy2D_ptds),
                         forward_fn(&next_cudaMemcpy2DAsync_ptsz),
                         forward_fn(&next_cudaStreamSynchronize_ptsz), dst, dpitch, src, spitch,
                         width, height, kind, 1);
}

EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                     size_t width, size_t height, enum cudaMemcpyKind kind,
                                     cudaStream_t stream)
{
    return wrap_memcpy2d_async(forward_fn(&next_cudaMemcpy2DAsync_ptsz), dst, dpitch, src, spitch,
                               width, height, kind, stream, 1);
}

EXPORT cudaError_t cudaMemset(void *ptr, int value, size_t count)
{
    return wrap_memset(forward_fn(&next_cudaMemset_ptds), forward_fn(&next_cudaMemsetAsync_ptsz),
                       ptr, value, count, 1);
}

EXPORT cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    return wrap_memset_async(forward_fn(&next_cudaMemsetAsync_ptsz), ptr, value, count, stream, 1);
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream)
{
    return wrap_launch(forward_fn(&next_cudaLaunchKernel_ptsz), func, gridDim, blockDim, args,
                       sharedMem, stream, 1);
}

EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                           void **args, size_t sharedMem, cudaStream_t stream)
{
    return wrap_launch_hidden(forward_fn(&next___cudaLaunchKernel_ptsz), kernel, gridDim,
                              blockDim, args, sharedMem, stream, 1);
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                       void **args)
{
    return wrap_launch_ex(forward_fn(&next_cudaLaunchKernelExC_ptsz), config, func, args, 1);
}
