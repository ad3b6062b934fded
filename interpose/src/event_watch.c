/* event_watch.c -- events recorded on NCCL streams, and the watch-list.
 *
 * Paper §3.1: the intercepted cudaEventRecord and cudaStreamWaitEvent calls
 * identify "all cudaEvents on the NCCL stream which have waiting
 * cudaStreamWaitEvents associated with them, and add them to a watch-list".
 *
 * One fixed table (open addressing, keyed by the cudaEvent_t) holds the
 * events that were ever recorded on an NCCL stream.  Each slot carries a
 * state word: a record generation and two flags, ON_NCCL (the event's latest
 * record is on an NCCL stream) and WATCHED (another stream, or a host thread,
 * waits for that record).  The watchdog (watchdog.c) polls the WATCHED slots
 * with cudaEventQuery.
 *
 *   cudaEventRecord(e, s)      s is an NCCL stream: new generation, ON_NCCL,
 *                              the record time; otherwise, if e is in the
 *                              table, its new generation clears both flags
 *                              (its latest record is not a collective's).
 *   cudaStreamWaitEvent(s, e)  e is ON_NCCL and s is another stream: WATCHED.
 *   cudaEventSynchronize(e)    e is ON_NCCL: WATCHED (a host thread waits).
 *   watchdog, cudaSuccess      clears WATCHED, only if the generation is
 *                              unchanged (compare-and-swap), so a re-record
 *                              that raced with the query stays watched.
 *   cudaEventDestroy(e)        the slot becomes a tombstone, under watch_lock,
 *                              so the watchdog never queries a dead handle.
 *   record during a capture    (capture.c) the event is a graph node: never
 *                              watched, and its flags are cleared under
 *                              watch_lock, because a query would invalidate
 *                              the capture.
 *   after cudaGraphLaunch      (capture.c) the library's own event, recorded
 *                              after a graph with collectives: ON_NCCL and
 *                              WATCHED at once, waited for by nobody.
 *
 * The record path updates the state before forwarding the call, so that the
 * watchdog can never pair a new record's "not ready" with an old record's
 * time.  Nothing here allocates; the hot path for an event that is not in
 * the table is one hash and one load. */

#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "interpose.h"

#define TABLE_BITS 12
#define TABLE_SIZE (1u << TABLE_BITS)
#define KEY_EMPTY ((uintptr_t)0)
#define KEY_TOMBSTONE ((uintptr_t)1)

#define ST_ON_NCCL 1u
#define ST_WATCHED 2u
#define ST_GEN_ONE 4u           /* the generation counts in the bits above the flags */

struct watch_slot {
    _Atomic uintptr_t event;
    _Atomic uint64_t state;
    _Atomic int64_t recorded_ns;    /* CLOCK_MONOTONIC_COARSE at the record */
    _Atomic uintptr_t stream;       /* canonical NCCL stream of the record */
    _Atomic uintptr_t waiter;       /* canonical waiting stream; 0 = host */
    _Atomic int graph_launch;       /* the library's own event after a cudaGraphLaunch */
};

static struct watch_slot table[TABLE_SIZE];
/* Serialises the watchdog's scan with cudaEventDestroy (not the hot paths). */
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;

static inline size_t slot_of(uintptr_t key)
{
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - TABLE_BITS));
}

static struct watch_slot *find(cudaEvent_t event)
{
    uintptr_t key = (uintptr_t)event;
    size_t i = slot_of(key);
    for (unsigned n = 0; n < TABLE_SIZE; n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        uintptr_t k = atomic_load_explicit(&table[i].event, memory_order_acquire);
        if (k == key)
            return &table[i];
        if (k == KEY_EMPTY)
            return NULL;
    }
    return NULL;
}

/* The slot of `event`, inserted if needed; NULL if the table is full.  Two
 * threads recording the *same* event at once could insert it twice; that is
 * a race in the application (CUDA does not order such records either). */
static struct watch_slot *find_or_insert(cudaEvent_t event)
{
    struct watch_slot *w = find(event);
    if (w != NULL)
        return w;
    uintptr_t key = (uintptr_t)event;
    size_t i = slot_of(key);
    for (unsigned n = 0; n < TABLE_SIZE; n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        uintptr_t k = atomic_load_explicit(&table[i].event, memory_order_relaxed);
        if ((k == KEY_EMPTY || k == KEY_TOMBSTONE) &&
            atomic_compare_exchange_strong(&table[i].event, &k, key))
            return &table[i];
    }
    return NULL;
}

void event_watch_on_record(cudaEvent_t event, cudaStream_t stream, int ptds)
{
    if (event == NULL)
        return;
    uintptr_t canon = stream_canon(stream, ptds);
    int on_nccl = nccl_stream_is(canon);
    /* During a graph capture the record may be a graph node (capture.c). */
    if (unlikely(capture_maybe_active()) && (on_nccl || find(event) != NULL) &&
        capture_stream_is_capturing_slow(stream, ptds)) {
        event_watch_on_captured_record(event, on_nccl);
        return;
    }
    if (on_nccl) {
        struct watch_slot *w = find_or_insert(event);
        if (unlikely(w == NULL)) {
            count(&counters.untracked);
            static _Atomic int reported;
            if (!atomic_exchange(&reported, 1))
                ilog("watch table full (%u events): event %p is not watched", TABLE_SIZE,
                     (void *)event);
            return;
        }
        uint64_t st = atomic_load_explicit(&w->state, memory_order_relaxed);
        uint64_t gen = (st & ~(uint64_t)(ST_GEN_ONE - 1)) + ST_GEN_ONE;
        atomic_store_explicit(&w->state, gen | ST_ON_NCCL, memory_order_relaxed);
        atomic_store_explicit(&w->stream, canon, memory_order_relaxed);
        atomic_store_explicit(&w->graph_launch, 0, memory_order_relaxed);
        atomic_store_explicit(&w->recorded_ns, now_coarse_ns(), memory_order_release);
        count(&counters.nccl_records);
        return;
    }
    struct watch_slot *w = find(event);
    if (w != NULL) {
        uint64_t st = atomic_load_explicit(&w->state, memory_order_relaxed);
        if (st & (ST_ON_NCCL | ST_WATCHED))
            atomic_store_explicit(&w->state, (st & ~(uint64_t)(ST_GEN_ONE - 1)) + ST_GEN_ONE,
                                  memory_order_release);
    }
}

void event_watch_on_captured_record(cudaEvent_t event, int on_nccl)
{
    if (on_nccl)
        count(&counters.captured_records);
    struct watch_slot *w = find(event);
    if (w == NULL)
        return;
    /* Under watch_lock: the watchdog is never between reading this slot and
     * querying the event, which is about to become a graph node. */
    pthread_mutex_lock(&watch_lock);
    if (atomic_load(&w->event) == (uintptr_t)event) {
        uint64_t st = atomic_load(&w->state);
        if (st & (ST_ON_NCCL | ST_WATCHED))
            atomic_store(&w->state, (st & ~(uint64_t)(ST_GEN_ONE - 1)) + ST_GEN_ONE);
    }
    pthread_mutex_unlock(&watch_lock);
}

void event_watch_on_graph_launch(cudaEvent_t event, cudaStream_t stream, int ptds)
{
    struct watch_slot *w = find_or_insert(event);
    if (unlikely(w == NULL)) {
        count(&counters.untracked);
        return;
    }
    uint64_t st = atomic_load_explicit(&w->state, memory_order_relaxed);
    uint64_t gen = (st & ~(uint64_t)(ST_GEN_ONE - 1)) + ST_GEN_ONE;
    atomic_store_explicit(&w->stream, stream_canon(stream, ptds), memory_order_relaxed);
    atomic_store_explicit(&w->waiter, 0, memory_order_relaxed);
    atomic_store_explicit(&w->graph_launch, 1, memory_order_relaxed);
    atomic_store_explicit(&w->recorded_ns, now_coarse_ns(), memory_order_release);
    atomic_store_explicit(&w->state, gen | ST_ON_NCCL | ST_WATCHED, memory_order_release);
    count(&counters.watches);
}

static void watch(struct watch_slot *w, uintptr_t waiter)
{
    uint64_t st = atomic_load_explicit(&w->state, memory_order_acquire);
    if (!(st & ST_ON_NCCL) || (st & ST_WATCHED))
        return;
    if (waiter != 0 && waiter == atomic_load_explicit(&w->stream, memory_order_relaxed))
        return;                     /* a stream waiting for itself waits for nothing */
    atomic_store_explicit(&w->waiter, waiter, memory_order_relaxed);
    if (atomic_compare_exchange_strong_explicit(&w->state, &st, st | ST_WATCHED,
                                                memory_order_release, memory_order_relaxed))
        count(&counters.watches);
}

void event_watch_on_wait(cudaStream_t stream, cudaEvent_t event, int ptds)
{
    watchdog_start_once();          /* paper: at the first cudaStreamWaitEvent */
    struct watch_slot *w = find(event);
    if (w != NULL)
        watch(w, stream_canon(stream, ptds));
}

void event_watch_on_host_wait(cudaEvent_t event)
{
    struct watch_slot *w = find(event);
    if (w != NULL) {
        watchdog_start_once();
        watch(w, 0);
    }
}

void event_watch_on_destroy(cudaEvent_t event)
{
    struct watch_slot *w = find(event);
    if (w == NULL)
        return;
    pthread_mutex_lock(&watch_lock);
    if (atomic_load(&w->event) == (uintptr_t)event) {
        atomic_store(&w->state, 0);
        atomic_store(&w->waiter, 0);
        atomic_store(&w->event, KEY_TOMBSTONE);
    }
    pthread_mutex_unlock(&watch_lock);
}

/* A consistent view of one slot: 1 if it is watched, with its fields. */
static int read_watched(struct watch_slot *w, uintptr_t *event, uint64_t *state,
                        int64_t *recorded_ns)
{
    uintptr_t k = atomic_load_explicit(&w->event, memory_order_acquire);
    if (k == KEY_EMPTY || k == KEY_TOMBSTONE)
        return 0;
    uint64_t st = atomic_load_explicit(&w->state, memory_order_acquire);
    if (!(st & ST_WATCHED))
        return 0;
    int64_t t = atomic_load_explicit(&w->recorded_ns, memory_order_acquire);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&w->state, memory_order_relaxed) != st)
        return 0;                   /* re-recorded meanwhile: look again next poll */
    *event = k;
    *state = st;
    *recorded_ns = t;
    return 1;
}

static void describe(struct watch_verdict *v, struct watch_slot *w, uintptr_t event,
                     double age, cudaError_t err)
{
    uintptr_t stream = atomic_load(&w->stream), waiter = atomic_load(&w->waiter);
    char who[64];
    if (waiter == 0)
        snprintf(who, sizeof who, "a host thread (cudaEventSynchronize)");
    else
        snprintf(who, sizeof who, "stream %p", (void *)waiter);
    double timeout = (double)atomic_load(&config.timeout_ns) / 1e9;
    if (atomic_load(&w->graph_launch)) {
        if (err == cudaErrorNotReady)
            snprintf(v->detail, sizeof v->detail,
                     "cudaEvent %p recorded after cudaGraphLaunch of a graph with collectives on "
                     "stream %p, not complete after %.1f s (timeout %g s)",
                     (void *)event, (void *)stream, age, timeout);
        else
            snprintf(v->detail, sizeof v->detail,
                     "cudaEventQuery(%p) after cudaGraphLaunch of a graph with collectives on "
                     "stream %p returned %d after %.1f s",
                     (void *)event, (void *)stream, (int)err, age);
    } else if (err == cudaErrorNotReady)
        snprintf(v->detail, sizeof v->detail,
                 "cudaEvent %p recorded on NCCL stream %p, waited for by %s, not complete "
                 "after %.1f s (timeout %g s)",
                 (void *)event, (void *)stream, who, age, timeout);
    else
        snprintf(v->detail, sizeof v->detail,
                 "cudaEventQuery(%p) on NCCL stream %p, waited for by %s, returned %d after "
                 "%.1f s",
                 (void *)event, (void *)stream, who, (int)err, age);
}

void event_watch_scan(struct watch_verdict *v)
{
    __typeof__(cudaEventQuery) *query = forward_fn(&next_cudaEventQuery);
    v->in_flight = 0;
    v->reason = 0;
    v->detail[0] = '\0';
    if (query == NULL)
        return;
    int64_t timeout = atomic_load(&config.timeout_ns);
    double worst_age = -1;
    pthread_mutex_lock(&watch_lock);
    for (unsigned i = 0; i < TABLE_SIZE; i++) {
        struct watch_slot *w = &table[i];
        uintptr_t event;
        uint64_t st;
        int64_t recorded;
        if (!read_watched(w, &event, &st, &recorded))
            continue;
        cudaError_t err = query((cudaEvent_t)event);
        if (err == cudaSuccess) {
            if (atomic_compare_exchange_strong(&w->state, &st, st & ~(uint64_t)ST_WATCHED))
                count(&counters.completions);
            continue;
        }
        if (err == cudaErrorInvalidResourceHandle) {
            /* Destroyed behind our back (e.g. through the driver API): forget it. */
            atomic_compare_exchange_strong(&w->state, &st, st & ~(uint64_t)ST_WATCHED);
            continue;
        }
        v->in_flight++;
        int64_t age_ns = now_coarse_ns() - recorded;
        double age = (double)age_ns / 1e9;
        if (err != cudaErrorNotReady && v->reason != JITCKPT_INTERPOSE_CUDA_ERROR) {
            v->reason = JITCKPT_INTERPOSE_CUDA_ERROR;
            describe(v, w, event, age, err);
        } else if (err == cudaErrorNotReady && age_ns > timeout && v->reason == 0 &&
                   age > worst_age) {
            worst_age = age;
            describe(v, w, event, age, err);
        }
    }
    pthread_mutex_unlock(&watch_lock);
    if (v->reason == 0 && worst_age >= 0)
        v->reason = JITCKPT_INTERPOSE_HANG;
}

int event_watch_list(struct jitckpt_interpose_watch *out, int max)
{
    int n = 0;
    int64_t now = now_coarse_ns();
    for (unsigned i = 0; i < TABLE_SIZE; i++) {
        uintptr_t event;
        uint64_t st;
        int64_t recorded;
        if (!read_watched(&table[i], &event, &st, &recorded))
            continue;
        if (out != NULL && n < max) {
            out[n].event = event;
            out[n].recorded_on = atomic_load(&table[i].stream);
            out[n].waited_by = atomic_load(&table[i].waiter);
            out[n].age_seconds = (double)(now - recorded) / 1e9;
        }
        n++;
    }
    return n;
}

int event_watch_is_waiter(uintptr_t canon)
{
    for (unsigned i = 0; i < TABLE_SIZE; i++) {
        uintptr_t event;
        uint64_t st;
        int64_t recorded;
        if (!read_watched(&table[i], &event, &st, &recorded))
            continue;
        /* A stream that waits for a watched event, or that launched a graph
         * whose collectives are watched, is behind the hang. */
        if (atomic_load(&table[i].waiter) == canon ||
            (atomic_load(&table[i].graph_launch) && atomic_load(&table[i].stream) == canon))
            return 1;
    }
    return 0;
}

int event_watch_is_watched(cudaEvent_t event)
{
    struct watch_slot *w = find(event);
    return w != NULL && (atomic_load(&w->state) & ST_WATCHED);
}
