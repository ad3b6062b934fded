/* watchdog.c -- the thread that turns a hung collective into a JIT event.
 *
 * Paper §3.1: "we start a watchdog thread at the first intercepted
 * cudaStreamWaitEvent.  The watchdog thread continuously monitors these
 * cudaEvents in the watch-list via calls to cudaEventQuery ... in case of a
 * failure in any rank, the all-reduce will never finish.  In such cases, our
 * watchdog thread will trigger a timeout and initiate checkpointing."
 *
 * Every JITCKPT_INTERPOSE_POLL_MS (5 ms) the thread scans the watch-list
 * (event_watch.c).  An event that is still cudaErrorNotReady longer than the
 * timeout after it was recorded, or whose query fails, becomes the JIT event
 * (jit_event.c), raised on this thread; the watchdog then stops.  Every tenth
 * scan it also polls the asynchronous error of the communicators seen in NCCL
 * calls (nccl_comms.c): an error there (a peer failed) is a JIT event at once.
 * The thread starts at the first cudaStreamWaitEvent (the paper) or at the
 * first NCCL call, whichever comes first.
 *
 * The thread adopts the CUDA device that was current on the thread that
 * started it, and stream-capture mode cudaStreamCaptureModeRelaxed, so that its queries do not create a context on device 0 of a
 * process that uses another GPU.  It blocks all signals, so that signals
 * meant for the process go to the application's threads.  A child forked
 * after the watchdog started inherits `started` and never runs one (threads
 * do not survive fork, and CUDA is unusable in such a child anyway). */

#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "interpose.h"

/* ncclCommGetAsyncError is polled every this many scans (every 50 ms at the
 * default 5 ms): often enough to beat any hang timeout, rarely enough to stay
 * off NCCL's own locks. */
#define COMM_POLL_EVERY 10

static _Atomic int started;
static int watchdog_device = -1;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "jitckpt-watch");
    if (watchdog_device >= 0) {
        __typeof__(cudaSetDevice) *set_device = forward_fn(&next_cudaSetDevice);
        if (set_device != NULL)
            set_device(watchdog_device);
    }
    /* Relaxed: a global-mode graph capture on another thread never forbids this
     * thread's queries (events recorded inside a capture are never queried at
     * all: capture.c). */
    __typeof__(cudaThreadExchangeStreamCaptureMode) *exchange =
        forward_fn(&next_cudaThreadExchangeStreamCaptureMode);
    enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    if (exchange != NULL)
        exchange(&relaxed);
    struct watch_verdict verdict;
    unsigned long polls = 0;
    for (;;) {
        sleep_ms(config.poll_ms);
        if (atomic_load(&interpose_mode) & MODE_FIRED)
            break;                      /* raised elsewhere (never, today) */
        verdict.reason = 0;
        /* A communicator's asynchronous error first: it names the failure, and
         * it comes before the hang timeout.  Polled every COMM_POLL_EVERY scans. */
        if (polls++ % COMM_POLL_EVERY == 0)
            nccl_comm_scan(&verdict);
        if (verdict.reason == 0)
            event_watch_scan(&verdict);
        count(&counters.watchdog_polls);
        if (verdict.reason != 0) {
            jit_event_raise(verdict.reason, verdict.detail);
            break;
        }
    }
    return NULL;
}

void watchdog_start_once(void)
{
    if (likely(atomic_load_explicit(&started, memory_order_relaxed)))
        return;
    if (atomic_exchange(&started, 1))
        return;
    __typeof__(cudaGetDevice) *get_device = forward_fn(&next_cudaGetDevice);
    if (get_device == NULL || get_device(&watchdog_device) != cudaSuccess)
        watchdog_device = -1;

    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);     /* the new thread inherits the mask */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, watchdog_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        ilog("cannot start the watchdog thread (%s): hangs will not be detected", strerror(rc));
    else
        count(&counters.watchdog_started); /* (here: a short program may end before the thread runs) */
}
