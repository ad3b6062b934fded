/* cuda_api.c -- the CUDA runtime entry points the library takes the place of.
 *
 * Exported in version node libcudart.so.13 (interpose.map), like the real
 * runtime's, so CUDA 13 binaries that import cudaEventRecord@libcudart.so.13
 * bind here.  Each forwards to the next definition (forward.c) after its
 * bookkeeping (cuda_wrap.h):
 *
 *   cudaEventRecord[WithFlags]   note records on NCCL streams (event_watch.c)
 *   cudaStreamWaitEvent          put waited-for NCCL events on the watch-list,
 *                                start the watchdog at the first call
 *   cudaEventSynchronize         the same for a host thread's wait; may block
 *   cudaEventDestroy             forget the event
 *   cudaStreamDestroy            forget an NCCL stream
 *   cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpy[2D][Async]
 *                                may block the host: tracked for the GIL
 *                                release (gil_release.c)
 *   copies, sets, launches       redirected during a save (redirect.c)
 *
 * The _ptsz/_ptds twins are in cuda_api_ptsz.c.  Every other runtime
 * function is not defined here and binds directly to the real runtime. */

#include "cuda_wrap.h"

/* The helper types of cuda_wrap.h are NVIDIA's prototypes, checked here. */
#define SAME_TYPE(fn, type) \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type *), #fn " prototype changed")
SAME_TYPE(cudaEventRecord, event_record_fn);
SAME_TYPE(cudaEventRecordWithFlags, event_record_flags_fn);
SAME_TYPE(cudaStreamWaitEvent, stream_wait_event_fn);
SAME_TYPE(cudaStreamSynchronize, stream_sync_fn);
SAME_TYPE(cudaMemcpy, memcpy_fn);
SAME_TYPE(cudaMemcpyAsync, memcpy_async_fn);
SAME_TYPE(cudaMemcpy2D, memcpy2d_fn);
SAME_TYPE(cudaMemcpy2DAsync, memcpy2d_async_fn);
SAME_TYPE(cudaMemset, memset_fn);
SAME_TYPE(cudaMemsetAsync, memset_async_fn);
SAME_TYPE(cudaLaunchKernel, launch_fn);
SAME_TYPE(__cudaLaunchKernel, launch_hidden_fn);
SAME_TYPE(cudaLaunchKernelExC, launch_ex_fn);

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return wrap_event_record(forward_fn(&next_cudaEventRecord), event, stream, 0);
}

EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                            unsigned int flags)
{
    return wrap_event_record_flags(forward_fn(&next_cudaEventRecordWithFlags), event, stream,
                                   flags, 0);
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    return wrap_stream_wait_event(forward_fn(&next_cudaStreamWaitEvent), stream, event, flags, 0);
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return wrap_stream_synchronize(forward_fn(&next_cudaStreamSynchronize), stream, 0);
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    __typeof__(cudaEventSynchronize) *next = forward_fn(&next_cudaEventSynchronize);
    if (unlikely(next == NULL))
        return NO_NEXT;
    event_watch_on_host_wait(event);
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(event);
    blocking_exit(slot);
    return err;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    __typeof__(cudaDeviceSynchronize) *next = forward_fn(&next_cudaDeviceSynchronize);
    if (unlikely(next == NULL))
        return NO_NEXT;
    /* A saving thread waits only for the save-time streams: the rest of the
     * device waits for the hung collective. */
    if (unlikely(interpose_special()) && config.redirect && this_thread_saving())
        return redirect_sync_all();
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next();
    blocking_exit(slot);
    return err;
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    __typeof__(cudaEventDestroy) *next = forward_fn(&next_cudaEventDestroy);
    if (unlikely(next == NULL))
        return NO_NEXT;
    event_watch_on_destroy(event);
    return next(event);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    __typeof__(cudaStreamDestroy) *next = forward_fn(&next_cudaStreamDestroy);
    if (unlikely(next == NULL))
        return NO_NEXT;
    uintptr_t canon = stream_canon(stream, 0);
    if (nccl_stream_is(canon))
        nccl_stream_forget(canon);
    return next(stream);
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return wrap_memcpy(forward_fn(&next_cudaMemcpy), forward_fn(&next_cudaMemcpyAsync),
                       forward_fn(&next_cudaStreamSynchronize), dst, src, count, kind, 0);
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                   enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return wrap_memcpy_async(forward_fn(&next_cudaMemcpyAsync), dst, src, count, kind, stream, 0);
}

EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return wrap_memcpy2d(forward_fn(&next_cudaMemcpy2D), forward_fn(&next_cudaMemcpy2DAsync),
                         forward_fn(&next_cudaStreamSynchronize), dst, dpitch, src, spitch, width,
                         height, kind, 0);
}

EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                     size_t width, size_t height, enum cudaMemcpyKind kind,
                                     cudaStream_t stream)
{
    return wrap_memcpy2d_async(forward_fn(&next_cudaMemcpy2DAsync), dst, dpitch, src, spitch,
                               width, height, kind, stream, 0);
}

EXPORT cudaError_t cudaMemset(void *ptr, int value, size_t count)
{
    return wrap_memset(forward_fn(&next_cudaMemset), forward_fn(&next_cudaMemsetAsync), ptr,
                       value, count, 0);
}

EXPORT cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    return wrap_memset_async(forward_fn(&next_cudaMemsetAsync), ptr, value, count, stream, 0);
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream)
{
    return wrap_launch(forward_fn(&next_cudaLaunchKernel), func, gridDim, blockDim, args,
                       sharedMem, stream, 0);
}

EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                      void **args, size_t sharedMem, cudaStream_t stream)
{
    return wrap_launch_hidden(forward_fn(&next___cudaLaunchKernel), kernel, gridDim, blockDim,
                              args, sharedMem, stream, 0);
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                       void **args)
{
    return wrap_launch_ex(forward_fn(&next_cudaLaunchKernelExC), config, func, args, 0);
}
