/* nccl_streams.c -- which streams are NCCL streams.
 *
 * Paper §3.1: "We first identify the communication / NCCL stream from the
 * intercepted NCCL APIs."  Every intercepted collective or point-to-point
 * call passes its stream to nccl_stream_note() (interpose.h), which is one
 * lock-free scan of a short array (a job has a handful of NCCL streams).  A
 * new stream is appended under a mutex; cudaStreamDestroy removes it, so a
 * destroyed NCCL stream whose handle is reused for a compute stream is not
 * mistaken for one.  Stream 0 is stored as cudaStreamLegacy (NCCL hands 0 to
 * the driver, where it means the legacy default stream). */

#include "interpose.h"

_Atomic(uintptr_t) nccl_stream_set[NCCL_STREAMS_MAX];
_Atomic int nccl_stream_count;      /* high-water mark of used entries */
static pthread_mutex_t add_lock = PTHREAD_MUTEX_INITIALIZER;

void nccl_stream_add_slow(uintptr_t canon)
{
    pthread_mutex_lock(&add_lock);
    if (!nccl_stream_is(canon)) {
        int n = atomic_load(&nccl_stream_count), slot = -1;
        for (int i = 0; i < n && slot < 0; i++)
            if (atomic_load(&nccl_stream_set[i]) == 0)
                slot = i;                                   /* reuse a forgotten entry */
        if (slot < 0 && n < NCCL_STREAMS_MAX)
            slot = n;
        if (slot >= 0) {
            atomic_store(&nccl_stream_set[slot], canon);
            if (slot == n)
                atomic_store_explicit(&nccl_stream_count, n + 1, memory_order_release);
            count(&counters.nccl_streams);
        } else {
            count(&counters.untracked);
            static int reported;
            if (!reported++)
                ilog("more than %d NCCL streams: stream %p is not watched", NCCL_STREAMS_MAX,
                     (void *)canon);
        }
    }
    pthread_mutex_unlock(&add_lock);
}

void nccl_stream_forget(uintptr_t canon)
{
    pthread_mutex_lock(&add_lock);
    int n = atomic_load(&nccl_stream_count);
    for (int i = 0; i < n; i++)
        if (atomic_load(&nccl_stream_set[i]) == canon)
            atomic_store(&nccl_stream_set[i], 0);
    pthread_mutex_unlock(&add_lock);
}
