/* redirect.c -- during a save, keep copies from queueing behind the hang.
 *
 * Paper §3.2: "the user checkpointing function will issue cudaMemcpy APIs ...
 * on the default Cuda stream.  The default stream, however, will be blocked
 * due to cudaStreamWaitEvent on the hung communication collectives.  This
 * will lead to a deadlock ... we simply intercept the cudaMemcpy call and in
 * the case when it is called during checkpointing, we issue it on a new Cuda
 * stream."  (DESIGN.md decision 4.)
 *
 * A thread is saving while it runs the JIT-event callback, or between its own
 * jitckpt_interpose_save_in_progress(1) and (0).  Work such a thread issues on a
 * *blocked* stream goes to a fresh non-blocking stream of the current device
 * instead, created on first use and kept for the rest of the save.  Blocked
 * means any of:
 *   - the legacy default stream (it waits for every blocking stream), and the
 *     per-thread default stream (a blocking stream);
 *   - an NCCL stream;
 *   - a stream that waits (cudaStreamWaitEvent) for a watched event;
 *   - a blocking stream (created without cudaStreamNonBlocking): it waits for
 *     the legacy default stream, which waits for the hang.
 * Everything the save issues on such streams is redirected together (copies,
 * sets, kernel launches, event records, and the synchronisations that wait
 * for them), so the save's own work stays in issue order on the fresh stream.
 * Work queued on the blocked stream *before* the save is never waited for: it
 * sits behind the hung collective, and the state being saved is the one
 * before it (paper §3.3).  Work that does not pass through the runtime API
 * (cuBLAS kernels launched through the driver API, say) is not redirected;
 * a save should copy, not compute. */

#define _GNU_SOURCE
#include "interpose.h"

#define MAX_DEVICES 64

static cudaStream_t fresh[MAX_DEVICES];
static pthread_mutex_t fresh_lock = PTHREAD_MUTEX_INITIALIZER;

static int stream_blocked(cudaStream_t stream, int ptds)
{
    uintptr_t canon = stream_canon(stream, ptds);
    if (canon == (uintptr_t)cudaStreamLegacy || canon == (uintptr_t)cudaStreamPerThread)
        return 1;
    if (nccl_stream_is(canon) || event_watch_is_waiter(canon))
        return 1;
    __typeof__(cudaStreamGetFlags) *get_flags = forward_fn(&next_cudaStreamGetFlags);
    unsigned flags = 0;
    if (get_flags != NULL && get_flags((cudaStream_t)canon, &flags) == cudaSuccess)
        return !(flags & cudaStreamNonBlocking);
    return 0;
}

static int current_device(void)
{
    __typeof__(cudaGetDevice) *get_device = forward_fn(&next_cudaGetDevice);
    int device = 0;
    if (get_device == NULL || get_device(&device) != cudaSuccess || device < 0 ||
        device >= MAX_DEVICES)
        return -1;
    return device;
}

static cudaStream_t fresh_stream(void)
{
    int device = current_device();
    if (device < 0)
        return NULL;
    pthread_mutex_lock(&fresh_lock);
    if (fresh[device] == NULL) {
        __typeof__(cudaStreamCreateWithFlags) *create = forward_fn(&next_cudaStreamCreateWithFlags);
        cudaStream_t s = NULL;
        if (create != NULL && create(&s, cudaStreamNonBlocking) == cudaSuccess) {
            fresh[device] = s;
            ilog("save in progress: work on blocked streams of device %d goes to new stream %p",
                 device, (void *)s);
        }
    }
    cudaStream_t s = fresh[device];
    pthread_mutex_unlock(&fresh_lock);
    return s;
}

cudaStream_t redirect_stream(cudaStream_t stream, int ptds)
{
    if (!config.redirect || !this_thread_saving() || !stream_blocked(stream, ptds))
        return stream;
    cudaStream_t s = fresh_stream();
    if (s == NULL)
        return stream;
    count(&counters.redirected_ops);
    return s;
}

cudaStream_t redirect_existing(void)
{
    int device = current_device();
    if (device < 0)
        return NULL;
    pthread_mutex_lock(&fresh_lock);
    cudaStream_t s = fresh[device];
    pthread_mutex_unlock(&fresh_lock);
    return s;
}

cudaError_t redirect_sync_all(void)
{
    __typeof__(cudaStreamSynchronize) *sync = forward_fn(&next_cudaStreamSynchronize);
    if (sync == NULL)
        return cudaErrorSharedObjectSymbolNotFound;
    cudaStream_t streams[MAX_DEVICES];
    pthread_mutex_lock(&fresh_lock);
    for (int i = 0; i < MAX_DEVICES; i++)
        streams[i] = fresh[i];
    pthread_mutex_unlock(&fresh_lock);
    cudaError_t first = cudaSuccess;
    for (int i = 0; i < MAX_DEVICES; i++) {
        if (streams[i] == NULL)
            continue;
        cudaError_t err = sync(streams[i]);
        if (first == cudaSuccess)
            first = err;
    }
    count(&counters.redirected_ops);
    return first;
}
