/* hooks.h -- the hand-written bodies of the functions the library wraps.
 *
 * The entry points themselves are generated (tools/gen_interpose.py, from
 * NVIDIA's headers and the facts table tools/api_facts.py, into build/gen/:
 * cuda_entry.c, cuda_entry_ptsz.c, nccl_entry.c).  Each one fetches the real
 * function (forward.c), returns the library's "symbol not found" error if
 * there is none, and makes one call to the hook the facts table names, in
 * one of two forms:
 *
 *   hook_<hook>(next, <needs>..., <the call's parameters>..., ptds)
 *       makes the call itself and returns its result.  `next` is the real
 *       function, never NULL; the functions in <needs> are of the same
 *       default-stream flavour and may be NULL.  `ptds` says what stream 0
 *       means: the legacy default stream (0), or the calling thread's
 *       per-thread default stream (1, in the _ptsz/_ptds entry points);
 *   hook_<before>(<some parameters>)
 *       bookkeeping only: the entry point then forwards the call unchanged.
 *
 * The fast path of every hook is one relaxed load of interpose_mode, and for
 * records and waits one hash probe; for calls that can block the host, a few
 * stores to the thread's slot (gil_release.c).  When interpose_mode is
 * non-zero (a save is or was in progress, or a JIT event fired) the slow path
 * asks redirect.c whether the calling thread's work on this stream must go to
 * the save-time stream instead.
 *
 * The function types below are NVIDIA's own (__typeof__ of the real
 * declarations), so a hook that calls its function wrongly, or an entry point
 * that hands a hook the wrong function, does not compile. */
#ifndef JITCKPT_INTERPOSE_HOOKS_H
#define JITCKPT_INTERPOSE_HOOKS_H

#include "interpose.h"

typedef __typeof__(cudaEventRecord) event_record_fn;
typedef __typeof__(cudaEventRecordWithFlags) event_record_flags_fn;
typedef __typeof__(cudaStreamWaitEvent) stream_wait_event_fn;
typedef __typeof__(cudaEventSynchronize) event_sync_fn;
typedef __typeof__(cudaStreamSynchronize) stream_sync_fn;
typedef __typeof__(cudaDeviceSynchronize) device_sync_fn;
typedef __typeof__(cudaMemcpy) memcpy_fn;
typedef __typeof__(cudaMemcpyAsync) memcpy_async_fn;
typedef __typeof__(cudaMemcpy2D) memcpy2d_fn;
typedef __typeof__(cudaMemcpy2DAsync) memcpy2d_async_fn;
typedef __typeof__(cudaMemset) memset_fn;
typedef __typeof__(cudaMemsetAsync) memset_async_fn;
typedef __typeof__(cudaLaunchKernel) launch_fn;
typedef __typeof__(__cudaLaunchKernel) launch_hidden_fn;
typedef __typeof__(cudaLaunchKernelExC) launch_ex_fn;
typedef __typeof__(cudaStreamBeginCapture) begin_capture_fn;
typedef __typeof__(cudaStreamBeginCaptureToGraph) begin_capture_to_graph_fn;
typedef __typeof__(cudaStreamEndCapture) end_capture_fn;
typedef __typeof__(cudaGraphInstantiate) graph_instantiate_fn;
typedef __typeof__(cudaGraphInstantiateWithParams) graph_instantiate_params_fn;
typedef __typeof__(cudaGraphLaunch) graph_launch_fn;

static inline cudaStream_t maybe_redirect(cudaStream_t stream, int ptds)
{
    if (unlikely(interpose_special()))
        return redirect_stream(stream, ptds);
    return stream;
}

/* During a save: the save-time stream a synchronous call on the default
 * stream goes to instead, or 0 (not saving, or no stream to go to). */
static inline cudaStream_t redirect_sync_call(int ptds)
{
    if (likely(!interpose_special()))
        return 0;
    return redirect_stream(0, ptds);
}

/* ---- events and stream waits: the watch-list (event_watch.c) ---------------- */

static inline cudaError_t hook_event_record(event_record_fn *next, cudaEvent_t event,
                                            cudaStream_t stream, int ptds)
{
    stream = maybe_redirect(stream, ptds);
    event_watch_on_record(event, stream, ptds);     /* before the record: see event_watch.c */
    return next(event, stream);
}

static inline cudaError_t hook_event_record_flags(event_record_flags_fn *next, cudaEvent_t event,
                                                  cudaStream_t stream, unsigned int flags,
                                                  int ptds)
{
    stream = maybe_redirect(stream, ptds);
    event_watch_on_record(event, stream, ptds);
    return next(event, stream, flags);
}

static inline cudaError_t hook_stream_wait_event(stream_wait_event_fn *next, cudaStream_t stream,
                                                 cudaEvent_t event, unsigned int flags, int ptds)
{
    cudaStream_t to = maybe_redirect(stream, ptds);
    if (unlikely(to != stream)) {
        /* The save's stream must never wait for the hung collective. */
        if (event_watch_is_watched(event))
            return cudaSuccess;
        return next(to, event, flags);
    }
    cudaError_t err = next(stream, event, flags);
    if (err == cudaSuccess)
        event_watch_on_wait(stream, event, ptds);   /* starts the watchdog at the first call */
    return err;
}

static inline cudaError_t hook_event_synchronize(event_sync_fn *next, cudaEvent_t event, int ptds)
{
    event_watch_on_host_wait(event);
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(event);
    blocking_exit(slot);
    return err;
}

static inline void hook_event_destroy(cudaEvent_t event)
{
    event_watch_on_destroy(event);
}

static inline void hook_stream_destroy(cudaStream_t stream)
{
    handle_set_remove(&nccl_streams, stream_canon(stream, 0));
    capture_stream_destroyed(stream);
}

/* ---- synchronisations: may block the host (gil_release.c) -------------------- */

static inline cudaError_t hook_stream_synchronize(stream_sync_fn *next, cudaStream_t stream,
                                                  int ptds)
{
    cudaStream_t to = maybe_redirect(stream, ptds);
    if (unlikely(to != stream))
        return next(to);
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(stream);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t hook_device_synchronize(device_sync_fn *next, int ptds)
{
    /* A saving thread waits only for the save-time streams: the rest of the
     * device waits for the hung collective. */
    if (unlikely(interpose_special()) && config.redirect && this_thread_saving())
        return redirect_sync_all();
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next();
    blocking_exit(slot);
    return err;
}

/* ---- copies and sets: redirected during a save (redirect.c) ------------------ */

/* A synchronous copy becomes its asynchronous twin on the save-time stream,
 * plus a synchronisation of that stream. */
static inline cudaError_t hook_memcpy(memcpy_fn *next, memcpy_async_fn *next_async,
                                      stream_sync_fn *next_sync, void *dst, const void *src,
                                      size_t count, enum cudaMemcpyKind kind, int ptds)
{
    cudaStream_t to = redirect_sync_call(ptds);
    if (unlikely(to != 0) && next_async != NULL && next_sync != NULL) {
        cudaError_t err = next_async(dst, src, count, kind, to);
        return err == cudaSuccess ? next_sync(to) : err;
    }
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, src, count, kind);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t hook_memcpy_async(memcpy_async_fn *next, void *dst, const void *src,
                                            size_t count, enum cudaMemcpyKind kind,
                                            cudaStream_t stream, int ptds)
{
    cudaStream_t to = maybe_redirect(stream, ptds);
    if (unlikely(to != stream))
        return next(dst, src, count, kind, to);
    /* Into pageable memory, an "async" copy returns only when it is done. */
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, src, count, kind, stream);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t hook_memcpy2d(memcpy2d_fn *next, memcpy2d_async_fn *next_async,
                                        stream_sync_fn *next_sync, void *dst, size_t dpitch,
                                        const void *src, size_t spitch, size_t width,
                                        size_t height, enum cudaMemcpyKind kind, int ptds)
{
    cudaStream_t to = redirect_sync_call(ptds);
    if (unlikely(to != 0) && next_async != NULL && next_sync != NULL) {
        cudaError_t err = next_async(dst, dpitch, src, spitch, width, height, kind, to);
        return err == cudaSuccess ? next_sync(to) : err;
    }
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, dpitch, src, spitch, width, height, kind);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t hook_memcpy2d_async(memcpy2d_async_fn *next, void *dst, size_t dpitch,
                                              const void *src, size_t spitch, size_t width,
                                              size_t height, enum cudaMemcpyKind kind,
                                              cudaStream_t stream, int ptds)
{
    cudaStream_t to = maybe_redirect(stream, ptds);
    if (unlikely(to != stream))
        return next(dst, dpitch, src, spitch, width, height, kind, to);
    struct thread_slot *slot = blocking_enter();
    cudaError_t err = next(dst, dpitch, src, spitch, width, height, kind, stream);
    blocking_exit(slot);
    return err;
}

static inline cudaError_t hook_memset(memset_fn *next, memset_async_fn *next_async, void *ptr,
                                      int value, size_t count, int ptds)
{
    cudaStream_t to = redirect_sync_call(ptds);
    if (unlikely(to != 0) && next_async != NULL)
        return next_async(ptr, value, count, to);
    return next(ptr, value, count);
}

static inline cudaError_t hook_memset_async(memset_async_fn *next, void *ptr, int value,
                                            size_t count, cudaStream_t stream, int ptds)
{
    return next(ptr, value, count, maybe_redirect(stream, ptds));
}

/* ---- kernel launches: redirected during a save ------------------------------- */

static inline cudaError_t hook_launch(launch_fn *next, const void *func, dim3 grid, dim3 block,
                                      void **args, size_t shmem, cudaStream_t stream, int ptds)
{
    return next(func, grid, block, args, shmem, maybe_redirect(stream, ptds));
}

static inline cudaError_t hook_launch_hidden(launch_hidden_fn *next, cudaKernel_t kernel,
                                             dim3 grid, dim3 block, void **args, size_t shmem,
                                             cudaStream_t stream, int ptds)
{
    return next(kernel, grid, block, args, shmem, maybe_redirect(stream, ptds));
}

static inline cudaError_t hook_launch_ex(launch_ex_fn *next, const cudaLaunchConfig_t *config,
                                         const void *func, void **args, int ptds)
{
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

/* ---- graph capture and graphs (capture.c) ------------------------------------- */

/* Counted as capturing before the capture begins, so that no record on a
 * stream that has just started capturing is taken for a plain one. */
static inline cudaError_t hook_capture_begin(begin_capture_fn *next, cudaStream_t stream,
                                             enum cudaStreamCaptureMode mode, int ptds)
{
    int began = capture_began(stream, ptds);
    cudaError_t err = next(stream, mode);
    if (err != cudaSuccess)
        capture_abandoned(stream, ptds, began);
    return err;
}

static inline cudaError_t hook_capture_begin_to_graph(begin_capture_to_graph_fn *next,
                                                      cudaStream_t stream, cudaGraph_t graph,
                                                      const cudaGraphNode_t *dependencies,
                                                      const cudaGraphEdgeData *dependencyData,
                                                      size_t numDependencies,
                                                      enum cudaStreamCaptureMode mode, int ptds)
{
    int began = capture_began(stream, ptds);
    cudaError_t err = next(stream, graph, dependencies, dependencyData, numDependencies, mode);
    if (err != cudaSuccess)
        capture_abandoned(stream, ptds, began);
    return err;
}

/* The capture is over when the call succeeds or reports it invalidated; any
 * other error (wrong thread, not the origin stream) leaves it running. */
static inline cudaError_t hook_capture_end(end_capture_fn *next, cudaStream_t stream,
                                           cudaGraph_t *pGraph, int ptds)
{
    cudaError_t err = next(stream, pGraph);
    if (err == cudaSuccess || err == cudaErrorStreamCaptureInvalidated)
        capture_ended(stream, ptds);
    return err;
}

/* cudaGraphInstantiate and cudaGraphInstantiateWithFlags (the same prototype). */
static inline cudaError_t hook_graph_instantiate(graph_instantiate_fn *next,
                                                 cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                 unsigned long long flags, int ptds)
{
    cudaError_t err = next(pGraphExec, graph, flags);
    if (err == cudaSuccess && pGraphExec != NULL)
        capture_graph_instantiated(*pGraphExec, graph);
    return err;
}

static inline cudaError_t hook_graph_instantiate_params(graph_instantiate_params_fn *next,
                                                        cudaGraphExec_t *pGraphExec,
                                                        cudaGraph_t graph,
                                                        cudaGraphInstantiateParams *instantiateParams,
                                                        int ptds)
{
    cudaError_t err = next(pGraphExec, graph, instantiateParams);
    if (err == cudaSuccess && pGraphExec != NULL)
        capture_graph_instantiated(*pGraphExec, graph);
    return err;
}

/* A graph whose capture held collectives gets the library's own event after
 * it on the launch stream, watched like an event behind an NCCL kernel. */
static inline cudaError_t hook_graph_launch(graph_launch_fn *next, event_record_fn *next_record,
                                            cudaGraphExec_t graphExec, cudaStream_t stream,
                                            int ptds)
{
    stream = maybe_redirect(stream, ptds);
    cudaError_t err = next(graphExec, stream);
    if (err == cudaSuccess)
        capture_graph_launched(graphExec, stream, ptds, next_record);
    return err;
}

static inline void hook_graph_forget(cudaGraph_t graph)
{
    capture_graph_forget(graph);
}

static inline void hook_graph_exec_forget(cudaGraphExec_t graphExec)
{
    capture_exec_forget(graphExec);
}

/* ---- NCCL ---------------------------------------------------------------------- */

/* A call that enqueues work on `stream` makes it an NCCL stream
 * (nccl_streams.c), and its communicator one whose asynchronous error the
 * watchdog polls (nccl_comms.c).  Real NCCL drives the GPU through the driver
 * API, so the work NCCL itself puts on the stream never passes through this
 * library: only the application's calls do. */
static inline void hook_nccl_enqueue(ncclComm_t comm, cudaStream_t stream)
{
    nccl_stream_note(stream);
    nccl_comm_note(comm);
    if (unlikely(capture_maybe_active()))
        capture_nccl_call_slow(stream);     /* a collective captured into a graph */
}

/* ncclCommDestroy, ncclCommAbort: the watchdog stops polling the comm before
 * it is freed. */
static inline void hook_nccl_comm_forget(ncclComm_t comm)
{
    nccl_comm_forget(comm);
}

#endif
