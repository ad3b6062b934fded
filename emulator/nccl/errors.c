/* errors.c -- NCCL result strings and the last-error message.
 *
 * Every failure that has a cause worth telling (a bad argument, a missing
 * peer, a mismatch between ranks) goes through report_error(), which keeps the
 * message for ncclGetLastError() and, like NCCL with NCCL_DEBUG=WARN, prints
 * it on stderr. */

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[512];

ncclResult_t report_error(ncclResult_t err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&last_lock);
    snprintf(last_error, sizeof last_error, "%s", msg);
    pthread_mutex_unlock(&last_lock);
    jitckpt_simdev_log("NCCL %s: %s", ncclGetErrorString(err), msg);
    return err;
}

ncclResult_t device_result(int device)
{
    return jitckpt_simdev_device_error(device) == cudaSuccess ? ncclSuccess
                                                              : ncclUnhandledCudaError;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
#if SIMDEV_HAS_NCCL_TIMEOUT
    case ncclTimeout: return "operation timed out";
#endif
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    static __thread char copy[512];
    pthread_mutex_lock(&last_lock);
    snprintf(copy, sizeof copy, "%s", last_error);
    pthread_mutex_unlock(&last_lock);
    return copy;
}
