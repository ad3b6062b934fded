/* jitckpt_interpose.h -- the control interface of libjitckpt_interpose.so.
 *
 * The library is LD_PRELOADed in front of the CUDA runtime and NCCL.  Its
 * CUDA and NCCL entry points forward every call to the real libraries; these
 * functions are the small private interface through which the process that
 * hosts it (jitckpt/interpose.py, or a C program) is told about JIT events
 * and steers the save.  They live in their own symbol version node,
 * JITCKPT_INTERPOSE_1, so they can never be mistaken for CUDA or NCCL API.
 *
 * Plain C types only: jitckpt/interpose.py declares the same text to cffi. */
#ifndef JITCKPT_INTERPOSE_H
#define JITCKPT_INTERPOSE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JITCKPT_INTERPOSE_API_VERSION 2

/* Why a JIT event was raised (first argument of the callback). */
enum {
    JITCKPT_INTERPOSE_HANG = 1,        /* a watched event stayed not-ready past the timeout */
    JITCKPT_INTERPOSE_CUDA_ERROR = 2,  /* cudaEventQuery on a watched event returned an error */
    JITCKPT_INTERPOSE_NCCL_ERROR = 3,  /* a communicator's ncclCommGetAsyncError is an error (a peer failed) */
};

/* Called once per process, on the library's watchdog thread, when a JIT
 * event is raised.  `detail` is a human-readable sentence, valid during the
 * call.  While the callback runs, copies that the calling thread issues on
 * the legacy default stream or on a blocked stream are redirected to a fresh
 * stream.  The library never exits the process: the callback decides. */
typedef void (*jitckpt_interpose_callback)(int reason, const char *detail);

/* One entry of the watch-list (jitckpt_interpose_in_flight). */
struct jitckpt_interpose_watch {
    uint64_t event;          /* cudaEvent_t */
    uint64_t recorded_on;    /* the NCCL stream it was recorded on (1 = legacy default stream) */
    uint64_t waited_by;      /* stream that waits for it; 0 = a host thread (cudaEventSynchronize) */
    double age_seconds;      /* since the event was recorded */
};

/* Monotonic counters (never reset). */
struct jitckpt_interpose_counters {
    uint64_t nccl_streams;        /* streams seen in NCCL collective/p2p calls */
    uint64_t nccl_records;        /* cudaEventRecord calls on an NCCL stream */
    uint64_t watches;             /* events put on the watch-list */
    uint64_t completions;         /* watched events the watchdog saw complete */
    uint64_t watchdog_started;    /* 1 once the watchdog thread runs */
    uint64_t watchdog_polls;      /* scans of the watch-list */
    uint64_t jit_events;          /* 0 or 1 */
    uint64_t redirected_ops;      /* copies, sets, launches, records, syncs redirected during a save */
    uint64_t signals_sent;        /* SIGUSR1 sent to threads blocked in CUDA calls */
    uint64_t gil_released;        /* threads whose GIL the signal handler released */
    uint64_t threads_parked;      /* threads parked for good after a JIT event */
    uint64_t untracked;           /* events or threads not tracked because a table was full */
    uint64_t nccl_comms;          /* communicators seen in NCCL calls (their async errors are polled) */
    uint64_t captured_records;    /* records on NCCL streams during graph capture: never queried */
    uint64_t graph_launches;      /* launches of captured graphs with collectives, watched */
};

int jitckpt_interpose_api_version(void);
/* Registers (or, with NULL, removes) the JIT-event callback. */
void jitckpt_interpose_set_callback(jitckpt_interpose_callback callback);
/* Hang timeout in seconds (> 0); the initial value comes from JITCKPT_HANG_TIMEOUT. */
int jitckpt_interpose_set_timeout(double seconds);
double jitckpt_interpose_timeout(void);
/* Marks the calling thread as saving (on = 1) or not (on = 0): while it
 * saves, its work on blocked streams is redirected.  Only that thread's: other
 * threads are never redirected, and nothing stays in save mode after on = 0
 * or after the thread exits.  (API version 1 had a whole-process flag.) */
void jitckpt_interpose_save_in_progress(int on);
/* Fills up to `max` entries; returns the number of watched events. */
int jitckpt_interpose_in_flight(struct jitckpt_interpose_watch *out, int max);
void jitckpt_interpose_get_counters(struct jitckpt_interpose_counters *out);

#ifdef __cplusplus
}
#endif

#endif
