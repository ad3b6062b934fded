/* interpose.h -- internal declarations shared by the files of
 * libjitckpt_interpose.so, the passthrough interposition library.
 *
 * The entry points are generated (tools/gen_interpose.py, into build/gen/);
 * their bodies are the hooks of hooks.h.  Everything compiles against
 * NVIDIA's headers (cuda_runtime_api.h and the nvidia-nccl-cu13 wheel's
 * nccl.h), so a signature that differs from the real one is a compile error.
 * Everything declared here is internal: the library is built with
 * -fvisibility=hidden and only EXPORT symbols are dynamic.
 *
 * Concurrency model, in one paragraph: the hot paths (cudaEventRecord,
 * cudaStreamWaitEvent, NCCL calls, copies, launches) take no lock and
 * allocate nothing; they read a few atomics and, for events recorded on an
 * NCCL stream, update one slot of a fixed-size table with atomic stores.  Two
 * library threads exist: the watchdog (started at the first
 * cudaStreamWaitEvent) and, after a JIT event only, the GIL releaser.  One
 * mutex (watch_lock) serialises the watchdog's scan with cudaEventDestroy so
 * that it never queries a destroyed event; the other mutexes guard rare
 * inserts and the save-time streams. */
#ifndef JITCKPT_INTERPOSE_INTERNAL_H
#define JITCKPT_INTERPOSE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "jitckpt_interpose.h"

#define EXPORT __attribute__((visibility("default")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* The version node of the CUDA runtime the library stands in front of
 * (set by the Makefile; CUDA 13 binds cudaMalloc@libcudart.so.13). */
#ifndef JITCKPT_CUDART_SONAME
#define JITCKPT_CUDART_SONAME "libcudart.so.13"
#endif
#define JITCKPT_NCCL_SONAME "libnccl.so.2"

/* ---- log.c ---------------------------------------------------------------- */
void ilog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Monotonic time in ns from CLOCK_MONOTONIC_COARSE (vDSO, a few ns). */
int64_t now_coarse_ns(void);

/* ---- config.c: settings from the environment ----------------------------- */
struct interpose_config {
    _Atomic int64_t timeout_ns;   /* JITCKPT_HANG_TIMEOUT (s), default 60 */
    int poll_ms;                  /* JITCKPT_INTERPOSE_POLL_MS, default 5 */
    int gil_release;              /* JITCKPT_INTERPOSE_GIL_RELEASE, default 1 */
    int redirect;                 /* JITCKPT_INTERPOSE_REDIRECT, default 1 */
    int stats;                    /* JITCKPT_INTERPOSE_STATS: print counters at exit */
};
extern struct interpose_config config;
void config_load(void);

/* ---- counters (api.c) ---------------------------------------------------- */
struct interpose_counters {
    _Atomic uint64_t nccl_streams, nccl_records, watches, completions, watchdog_started,
        watchdog_polls, jit_events, redirected_ops, signals_sent, gil_released,
        threads_parked, untracked, nccl_comms, captured_records, graph_launches;
};
extern struct interpose_counters counters;
static inline void count(_Atomic uint64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* ---- forward.c: the next definition of each wrapped function ------------- */
enum next_lib { NEXT_CUDART, NEXT_NCCL };
struct next_sym {
    const char *name;
    enum next_lib lib;
    _Atomic(void *) fn;
    _Atomic int reported;       /* "not found" was printed */
};
/* Looks the symbol up (dlvsym/dlsym RTLD_NEXT, then the already-loaded
 * library by soname); NULL, with a one-time message, if it is nowhere. */
void *forward_resolve(struct next_sym *sym);
static inline void *forward_fn(struct next_sym *sym)
{
    void *fn = atomic_load_explicit(&sym->fn, memory_order_acquire);
    return likely(fn != NULL) ? fn : forward_resolve(sym);
}
/* next_<function> for every function the library wraps, needs or looks up,
 * and the prototypes no header declares: generated from the facts table
 * (tools/api_facts.py) into build/gen/next_syms.h. */
#include "next_syms.h"

/* ---- streams ------------------------------------------------------------- */
/* A stream handle with 0 made explicit: cudaStreamLegacy, or
 * cudaStreamPerThread in a _ptsz/_ptds call. */
static inline uintptr_t stream_canon(cudaStream_t s, int ptds)
{
    if (s == 0)
        return ptds ? (uintptr_t)cudaStreamPerThread : (uintptr_t)cudaStreamLegacy;
    return (uintptr_t)s;
}

/* handle_set.c: a short array of handles, scanned without a lock */
struct handle_set {
    _Atomic(uintptr_t) *items;
    int max;
    pthread_mutex_t *lock;          /* for additions and removals (the owner may hold it longer) */
    const char *what;               /* for the "table full" message */
    _Atomic int count;              /* high-water mark of used entries */
    _Atomic int reported;
};
#define HANDLE_SET(array, lock_, what_) \
    { .items = (array), .max = (int)(sizeof(array) / sizeof((array)[0])), .lock = (lock_), .what = (what_) }
static inline int handle_set_has(struct handle_set *hs, uintptr_t key)
{
    int n = atomic_load_explicit(&hs->count, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (atomic_load_explicit(&hs->items[i], memory_order_relaxed) == key)
            return 1;
    return 0;
}
/* Add: 1 added, 0 already there, -1 the set is full (counted, reported once).
 * Remove: 1 if it was there.  Both take hs->lock. */
int handle_set_add(struct handle_set *hs, uintptr_t key);
int handle_set_remove(struct handle_set *hs, uintptr_t key);

/* nccl_streams.c */
extern struct handle_set nccl_streams;
static inline int nccl_stream_is(uintptr_t canon)
{
    return handle_set_has(&nccl_streams, canon);
}
static inline void nccl_stream_note(cudaStream_t s)
{
    uintptr_t c = stream_canon(s, 0);   /* NCCL passes stream 0 to the driver as legacy */
    if (unlikely(!nccl_stream_is(c)) && handle_set_add(&nccl_streams, c) > 0)
        count(&counters.nccl_streams);
}

/* nccl_comms.c: communicators seen in NCCL calls; their asynchronous errors */
extern struct handle_set nccl_comms;
void nccl_comm_added(void);
void nccl_comm_forget(ncclComm_t comm);
static inline void nccl_comm_note(ncclComm_t comm)
{
    if (unlikely(comm != NULL && !handle_set_has(&nccl_comms, (uintptr_t)comm)) &&
        handle_set_add(&nccl_comms, (uintptr_t)comm) > 0)
        nccl_comm_added();
}

/* ---- event_watch.c: events recorded on NCCL streams, and the watch-list --- */
void event_watch_on_record(cudaEvent_t event, cudaStream_t stream, int ptds);
void event_watch_on_wait(cudaStream_t stream, cudaEvent_t event, int ptds);
void event_watch_on_host_wait(cudaEvent_t event);
void event_watch_on_destroy(cudaEvent_t event);
/* For the watchdog: queries every watched event; returns how many are still
 * in flight, and describes the first expired (or failed) one in `detail`. */
struct watch_verdict {
    int in_flight;
    int reason;                 /* 0 or a JITCKPT_INTERPOSE_* reason */
    char detail[512];
};
void event_watch_scan(struct watch_verdict *verdict);
/* For the watchdog: the first communicator whose asynchronous error is set
 * (neither ncclSuccess nor ncclInProgress) becomes reason
 * JITCKPT_INTERPOSE_NCCL_ERROR, described in `detail`. */
void nccl_comm_scan(struct watch_verdict *verdict);
int event_watch_list(struct jitckpt_interpose_watch *out, int max);
/* During a save: is `canon` waiting for a watched event, and is `event` watched? */
int event_watch_is_waiter(uintptr_t canon);
int event_watch_is_watched(cudaEvent_t event);

/* For capture.c: a record on a capturing stream is a graph node; its event is
 * never watched, and an earlier watch of it is cleared under the watchdog's
 * lock.  on_nccl: the stream is an NCCL stream (counted). */
void event_watch_on_captured_record(cudaEvent_t event, int on_nccl);
/* The library's own event, recorded right after a cudaGraphLaunch of a graph
 * with collectives on `stream`: watched at once, waited for by nobody. */
void event_watch_on_graph_launch(cudaEvent_t event, cudaStream_t stream, int ptds);

/* ---- capture.c: CUDA graph capture and graphs with collectives ------------- */
extern _Atomic int captures_active;
int capture_began(cudaStream_t stream, int ptds);
void capture_abandoned(cudaStream_t stream, int ptds, int began);
void capture_ended(cudaStream_t stream, int ptds);
int capture_stream_is_capturing_slow(cudaStream_t stream, int ptds);
void capture_nccl_call_slow(cudaStream_t stream);
void capture_graph_instantiated(cudaGraphExec_t exec, cudaGraph_t graph);
void capture_graph_forget(cudaGraph_t graph);
void capture_exec_forget(cudaGraphExec_t exec);
void capture_stream_destroyed(cudaStream_t stream);
void capture_graph_launched(cudaGraphExec_t exec, cudaStream_t stream, int ptds,
                            __typeof__(cudaEventRecord) *record);
/* Cheap enough for every record on an NCCL stream: one relaxed load. */
static inline int capture_maybe_active(void)
{
    return atomic_load_explicit(&captures_active, memory_order_relaxed) != 0;
}

/* ---- watchdog.c ---------------------------------------------------------- */
void watchdog_start_once(void);

/* ---- jit_event.c: the JIT event and the save mode --------------------------- */
#define MODE_FIRED 1        /* a JIT event was raised */
#define MODE_SAVING 2       /* some thread is saving */
extern _Atomic int interpose_mode;
extern __thread int tl_saving __attribute__((tls_model("initial-exec")));
static inline int interpose_special(void)
{
    return atomic_load_explicit(&interpose_mode, memory_order_relaxed);
}
/* Save mode is per thread: only the thread that saves is redirected. */
static inline int this_thread_saving(void)
{
    return tl_saving;
}
void jit_event_raise(int reason, const char *detail);
void jit_event_set_callback(jitckpt_interpose_callback cb);
/* Marks the calling thread as saving (or not). */
void jit_event_save_mode(int on);

/* ---- redirect.c: copies during a save ------------------------------------- */
/* Returns the stream to use instead of `stream` for work the calling thread
 * issues during a save, or `stream` itself.  Call only when
 * interpose_special() is non-zero. */
cudaStream_t redirect_stream(cudaStream_t stream, int ptds);
/* Synchronises the save-time streams of every device (for the redirected
 * cudaDeviceSynchronize).  Returns the first error. */
cudaError_t redirect_sync_all(void);
/* The save-time stream of the current device, or NULL if none was made. */
cudaStream_t redirect_existing(void);

/* ---- gil_release.c: threads blocked in CUDA calls --------------------------- */
struct thread_slot;
/* Around every intercepted call that can block the host thread. */
struct thread_slot *blocking_enter_slow(void);
void blocking_exit_slow(struct thread_slot *slot);
extern __thread struct thread_slot *tl_slot __attribute__((tls_model("initial-exec")));
struct thread_slot {
    _Atomic int owned;
    _Atomic int tid;               /* kernel thread id, for the signal */
    _Atomic unsigned seq;          /* bumped at every blocking call */
    _Atomic int inside;            /* 1 while inside the real call */
    _Atomic int after_jit;         /* the current call began after the JIT event */
    _Atomic int gil_released;      /* the signal handler released this thread's GIL */
    _Atomic unsigned signaled_seq; /* releaser: the call it already signalled */
    void *tstate;                  /* PyThreadState the handler saved */
} __attribute__((aligned(64)));

static inline struct thread_slot *blocking_enter(void)
{
    struct thread_slot *slot = tl_slot;
    if (unlikely(slot == NULL || interpose_special()))
        return blocking_enter_slow();
    atomic_store_explicit(&slot->seq, atomic_load_explicit(&slot->seq, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&slot->after_jit, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->inside, 1, memory_order_release);
    atomic_signal_fence(memory_order_seq_cst);
    return slot;
}
static inline void blocking_exit(struct thread_slot *slot)
{
    if (slot == NULL)
        return;
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(&slot->inside, 0, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (unlikely(atomic_load_explicit(&slot->gil_released, memory_order_relaxed)))
        blocking_exit_slow(slot);
}
/* JIT event: resolve the Python C API, then (after MODE_FIRED is set)
 * install the SIGUSR1 handler and start the releaser thread. */
void gil_release_prepare(void);
void gil_release_start(void);

#endif
