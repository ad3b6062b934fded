/* cuda_wrap.h -- the bodies of the CUDA runtime wrappers, shared by
 * cuda_api.c (the plain entry points) and cuda_api_ptsz.c (the _ptsz/_ptds
 * entry points of code built with --default-stream per-thread).
 *
 * Each helper takes the next definition of its function and `ptds`, which
 * says what stream 0 means (legacy default, or per-thread default).  The
 * fast path of every helper is: one atomic load of the next function, one
 * relaxed load of interpose_mode, and for records and waits one hash probe;
 * for calls that can block, a few stores to the thread's slot.
 *
 * When interpose_mode is non-zero (a save is or was in progress, or a JIT
 * event fired) the slow path asks redirect.c whether the calling thread's
 * work on this stream must go to the save-time stream instead. */
#ifndef JITCKPT_INTERPOSE_CUDA_WRAP_H
#define JITCKPT_INTERPOSE_CUDA_WRAP_H

#include "interpose.h"

#define NO_NEXT cudaErrorSharedObjectSymbolNotFound

/* nvcc's hidden launch entry points; not declared in any C header. */
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void **args, size_t sharedMem, cudaStream_t stream);

typedef cudaError_t event_record_fn(cudaEvent_t, cudaStream_t);
typedef cudaError_t event_record_flags_fn(cudaEvent_t, cudaStream_t, unsigned int);
typedef cudaError_t stream_wait_event_fn(cudaStream_t, cudaEvent_t, unsigned int);
typedef cudaError_t stream_sync_fn(cudaStream_t);
typedef cudaError_t memcpy_fn(void *, const void *, size_t, enum cudaMemcpyKind);
typedef cudaError_t memcpy_async_fn(void *, const void *, size_t, enum cudaMemcpyKind,
                                    cudaStream_t);
typedef cudaError_t memcpy2d_fn(void *, size_t, const void *, size_t, size_t, size_t,
                                enum cudaMemcpyKind);
typedef cudaError_t memcpy2d_async_fn(void *, size_t, const void *, size_t, size_t, size_t,
                                      enum cudaMemcpyKind, cudaStream_t);
typedef cudaError_t memset_fn(void *, int, size_t);
typedef cudaError_t memset_async_fn(void *, int, size_t, cudaStream_t);
typedef cudaError_t launch_fn(const void *, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t launch_hidden_fn(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t launch_ex_fn(const cudaLaunchConfig_t *, const void *, void **);

static inline cudaStream_t maybe_redirect(cudaStream_t stream, int ptds)
{
    if (unlikely(interpose_special()))
        return redirect_stream(stream, ptds);
    return stream;
}

static inline cudaError_t wrap_event_record(event_record_fn *next, cudaEvent_t event,
                                            cudaStream_t stream, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    stream = maybe_redirect(stream, ptds);
    event_watch_on_record(event, stream, ptds);     /* before the record: see event_watch.c */
    return next(event, stream);
}

static inline cudaError_t wrap_event_record_flags(event_record_flags_fn *next, cudaEvent_t event,
                                                  cudaStream_t stream, unsigned int flags,
                                                  int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    stream = maybe_redirect(stream, ptds);
    event_watch_on_record(event, stream, ptds);
    return next(event, stream, flags);
}

static inline cudaError_t wrap_stream_wait_event(stream_wait_event_fn *next, cudaStream_t stream,
                                                 cudaEvent_t event, unsigned int flags, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special())) {
        cudaStream_t to = redirect_stream(stream, ptds);
        if (to != stream) {
            /* The save's stream must never wait for the hung collective. */
            if (event_watch_is_watched(event))
                return cudaSuccess;
            return next(to, event, flags);
        }
    }
    cudaError_t err = next(stream, event, flags);
    if (err == cudaSuccess)
        event_watch_on_wait(stream, event, ptds);
    return err;
}

static inline cudaError_t wrap_stream_synchronize(stream_sync_fn *next, cudaStream_t stream,
                                                  int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special())) {
        cudaStream_t to = redirect_stream(stream, ptds);
        if (to != stream)
            return next(to);
    }
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(stream);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t wrap_memcpy(memcpy_fn *next, memcpy_async_fn *next_async,
                                      stream_sync_fn *next_sync, void *dst, const void *src,
                                      size_t count, enum cudaMemcpyKind kind, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special())) {
        cudaStream_t to = redirect_stream(0, ptds);
        if (to != 0 && next_async != NULL && next_sync != NULL) {
            cudaError_t err = next_async(dst, src, count, kind, to);
            return err == cudaSuccess ? next_sync(to) : err;
        }
    }
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, src, count, kind);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t wrap_memcpy_async(memcpy_async_fn *next, void *dst, const void *src,
                                            size_t count, enum cudaMemcpyKind kind,
                                            cudaStream_t stream, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special())) {
        cudaStream_t to = redirect_stream(stream, ptds);
        if (to != stream)
            return next(dst, src, count, kind, to);
    }
    /* Into pageable memory, an "async" copy returns only when it is done. */
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, src, count, kind, stream);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t wrap_memcpy2d(memcpy2d_fn *next, memcpy2d_async_fn *next_async,
                                        stream_sync_fn *next_sync, void *dst, size_t dpitch,
                                        const void *src, size_t spitch, size_t width,
                                        size_t height, enum cudaMemcpyKind kind, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special())) {
        cudaStream_t to = redirect_stream(0, ptds);
        if (to != 0 && next_async != NULL && next_sync != NULL) {
            cudaError_t err = next_async(dst, dpitch, src, spitch, width, height, kind, to);
            return err == cudaSuccess ? next_sync(to) : err;
        }
    }
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, dpitch, src, spitch, width, height, kind);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t wrap_memcpy2d_async(memcpy2d_async_fn *next, void *dst, size_t dpitch,
                                              const void *src, size_t spitch, size_t width,
                                              size_t height, enum cudaMemcpyKind kind,
                                              cudaStream_t stream, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special())) {
        cudaStream_t to = redirect_stream(stream, ptds);
        if (to != stream)
            return next(dst, dpitch, src, spitch, width, height, kind, to);
    }
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, dpitch, src, spitch, width, height, kind, stream);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t wrap_memset(memset_fn *next, memset_async_fn *next_async,
                                      void *ptr, int value, size_t count, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special())) {
        cudaStream_t to = redirect_stream(0, ptds);
        if (to != 0 && next_async != NULL)
            return next_async(ptr, value, count, to);
    }
    return next(ptr, value, count);
}

static inline cudaError_t wrap_memset_async(memset_async_fn *next, void *ptr, int value,
                                            size_t count, cudaStream_t stream, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    return next(ptr, value, count, maybe_redirect(stream, ptds));
}

static inline cudaError_t wrap_launch(launch_fn *next, const void *func, dim3 grid, dim3 block,
                                      void **args, size_t shmem, cudaStream_t stream, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    return next(func, grid, block, args, shmem, maybe_redirect(stream, ptds));
}

static inline cudaError_t wrap_launch_hidden(launch_hidden_fn *next, cudaKernel_t kernel,
                                             dim3 grid, dim3 block, void **args, size_t shmem,
                                             cudaStream_t stream, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    return next(kernel, grid, block, args, shmem, maybe_redirect(stream, ptds));
}

static inline cudaError_t wrap_launch_ex(launch_ex_fn *next, const cudaLaunchConfig_t *config,
                                         const void *func, void **args, int ptds)
{
    if (unlikely(next == NULL))
        return NO_NEXT;
    if (unlikely(interpose_special()) && config != NULL) {
        cudaStream_t to = redirect_stream(config->stream, ptds);
        if (to != config->stream) {
            cudaLaunchConfig_t copy = *config;
            copy.stream = to;
            return next(&copy, func, args);
        }
    }
    return next(config, func, args);
}

#endif
