/* hostfn.c -- the proxy's half of host functions (interpose/remote/hostfn.c).
 *
 * Wire: cudaLaunchHostFunc and cudaStreamAddCallback cross as (stream handle,
 * u64 id, u32 flags).  The proxy enqueues its own function on the real stream
 * with the id; when the runtime calls it (on a runtime thread), the id is
 * posted in the shared segment for the worker, and the thread waits until the
 * worker has run the program's function, so that the stream goes on only
 * after it, as on a GPU.  A worker that is gone ends the wait (the proxy is
 * about to exit with it). */

#include "dispatch.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static __typeof__(cudaLaunchHostFunc) *real_launch_host_func;
static __typeof__(cudaStreamAddCallback) *real_add_callback;
static pthread_mutex_t post_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t posted;

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *timeout)
{
    return syscall(SYS_futex, addr, op, val, timeout, NULL, 0);
}

static int worker_gone(void)
{
    return proxy_worker_pid > 0 && kill(proxy_worker_pid, 0) != 0 && errno == ESRCH;
}

/* Waits until slot `slot` holds at least `want` (the worker finished that posting). */
static int wait_done(struct jitckpt_wire *w, uint32_t slot, uint64_t want)
{
    for (;;) {
        uint32_t wake = __atomic_load_n(&w->cb_done_wake, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&w->cb_done[slot], __ATOMIC_ACQUIRE) >= want)
            return 0;
        struct timespec t = {0, 100 * 1000000L};
        futex(&w->cb_done_wake, FUTEX_WAIT, wake, &t);
        if (worker_gone())
            return -1;
    }
}

static void run_in_worker(uint64_t id, int32_t status)
{
    struct jitckpt_wire *w = watch_wire();
    if (w == NULL)
        return;
    pthread_mutex_lock(&post_mu);
    uint64_t seq = posted;
    uint32_t slot = (uint32_t)(seq % JITCKPT_WIRE_CB_SLOTS);
    /* the slot's previous posting must be finished before it is reused */
    if (seq >= JITCKPT_WIRE_CB_SLOTS && wait_done(w, slot, seq - JITCKPT_WIRE_CB_SLOTS + 1) != 0) {
        pthread_mutex_unlock(&post_mu);
        return;
    }
    w->cb_ids[slot] = id;
    w->cb_status[slot] = status;
    posted = seq + 1;
    __atomic_store_n(&w->cb_posted, posted, __ATOMIC_RELEASE);
    __atomic_add_fetch(&w->cb_wake, 1, __ATOMIC_SEQ_CST);
    futex(&w->cb_wake, FUTEX_WAKE, 1, NULL);
    pthread_mutex_unlock(&post_mu);
    wait_done(w, slot, seq + 1);
}

static void CUDART_CB host_fn(void *arg)
{
    uint64_t id = (uint64_t)(uintptr_t)arg;
    run_in_worker(id, cudaSuccess);
}

static void CUDART_CB stream_callback(cudaStream_t stream, cudaError_t status, void *arg)
{
    (void)stream;
    run_in_worker((uint64_t)(uintptr_t)arg, (int32_t)status);
}

int32_t dispatch_hostfn(unsigned fn, struct rdisp *d)
{
    if (!real_launch_host_func) {
        real_launch_host_func = (__typeof__(cudaLaunchHostFunc) *)proxy_sym(cudart, "cudaLaunchHostFunc");
        real_add_callback = (__typeof__(cudaStreamAddCallback) *)proxy_sym(cudart, "cudaStreamAddCallback");
        if (!real_launch_host_func || !real_add_callback)
            return cudaErrorSymbolNotFound;
    }
    uint64_t vid, id;
    uint32_t flags;
    void *stream;
    if (rd_get_handle(d, VH_STREAM, &vid, &stream))
        return cudaErrorInvalidResourceHandle;
    if (rd_get(d, &id, sizeof id) || rd_get(d, &flags, sizeof flags))
        return RD_BAD;
    if (fn == RFN_cudaLaunchHostFunc)
        return real_launch_host_func((cudaStream_t)stream, host_fn, (void *)(uintptr_t)id);
    return real_add_callback((cudaStream_t)stream, stream_callback, (void *)(uintptr_t)id, flags);
}
