/* watch.c -- what transparent recovery needs from the proxy (README.md,
 * "Recovery"; paper section 4.2): collectives in flight, holding back the
 * work that depends on them, minibatch markers, and aborts.
 *
 * - Every NCCL collective the worker enqueues gets an internal event recorded
 *   after it on its stream (at ncclGroupEnd for grouped ones).  A stream that
 *   runs a collective, and every stream or event ordered after it
 *   (cudaEventRecord / cudaStreamWaitEvent), "depends" on it.
 * - Holding back: a kernel launch, copy or memset on a stream that depends on
 *   an unfinished collective waits here, on the proxy's thread, before it
 *   reaches the runtime.  So nothing computes on gradients a hung or aborted
 *   all-reduce never delivered: after an abort, the device still holds the
 *   parameters of the minibatch's start.
 * - Minibatch markers (JITCKPT_RFN_MARK, sent by the worker at each
 *   jitckpt_phase_optimizer_end): events on every stream; done_marker in the
 *   segment says which minibatches the device has completed, so the worker
 *   keeps in its call log exactly the minibatches not yet done.
 * - Rewind saves (JITCKPT_RFN_REWIND, sent before a marker when the worker
 *   rewinds state changed in place): byte ranges copied at the boundary.
 * - A watcher thread (every WATCH_MS) publishes the oldest unfinished
 *   collective's age, the first asynchronous communicator error, a sticky
 *   device error, done_marker; and, when the worker asks (abort_before),
 *   aborts every communicator (ncclCommAbort may be called from another
 *   thread while an operation is stuck) so that the proxy's thread is freed.
 *   The main thread then drops the records the abort covers.
 *
 * The watcher never touches the handle tables: the main thread keeps the
 * communicator list here, under the lock. */

#include "dispatch.h"
#include "jitckpt_sticky.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define WATCH_MS 5

static __typeof__(cudaEventCreateWithFlags) *r_event_create;
static __typeof__(cudaEventRecord) *r_event_record;
static __typeof__(cudaEventDestroy) *r_event_destroy;
static __typeof__(cudaStreamGetDevice) *r_stream_device;
static __typeof__(cudaGetDevice) *r_get_device;
static __typeof__(cudaSetDevice) *r_set_device;
static __typeof__(cudaEventQuery) *r_event_query;
static __typeof__(cudaEventSynchronize) *r_event_sync;
static __typeof__(cudaStreamWaitEvent) *r_stream_wait;
static __typeof__(cudaMemcpyAsync) *r_memcpy_async;
static __typeof__(cudaLaunchHostFunc) *r_host_func;
static __typeof__(cudaPeekAtLastError) *r_peek_error;
static __typeof__(cudaGetLastError) *r_get_error;
static __typeof__(ncclCommGetAsyncError) *r_comm_async;
static __typeof__(ncclCommAbort) *r_comm_abort;

static struct jitckpt_wire *W;

/* Room for one more element in a table that grows (*cap doubles).  The tables below must never drop an
 * entry they still need: a stream, event or handle left out would let work run past an unfinished
 * collective, and a recovery meet changed parameters.  Out of memory stops the proxy, loudly. */
static void make_room(void **table, size_t *cap, size_t n, size_t elem, const char *what)
{
    if (n < *cap)
        return;
    size_t grown_cap = *cap ? 2 * *cap : 64;
    void *grown = realloc(*table, grown_cap * elem);
    if (!grown) {
        plog("out of memory for the table of %zu %s: the proxy stops rather than let work run past an "
             "unfinished collective", n + 1, what);
        abort();
    }
    *table = grown;
    *cap = grown_cap;
}

/* A full ring [*tail, *head) of elem-sized slots, doubled: the same entries, oldest first from slot 0; the new
 * slots zeroed.  (Full: every slot is live, so whatever a slot owns moves with it.) */
static void grow_ring(void **ring, size_t *cap, size_t *tail, size_t *head, size_t elem, const char *what)
{
    size_t n = *head - *tail, grown_cap = *cap ? 2 * *cap : 64;
    unsigned char *grown = calloc(grown_cap, elem);
    if (!grown) {
        plog("out of memory for the ring of %zu %s: the proxy stops rather than let work run past an "
             "unfinished collective", n + 1, what);
        abort();
    }
    for (size_t i = 0; i < n; i++)
        memcpy(grown + i * elem, (unsigned char *)*ring + ((*tail + i) % *cap) * elem, elem);
    free(*ring);
    *ring = grown;
    *cap = grown_cap;
    *tail = 0;
    *head = n;
}

struct jitckpt_wire *watch_wire(void) { return W; }
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ---- events (under mu) ------------------------------------------------------------
 *
 * An event can be recorded only on a stream of the device it was made on (another device's stream refuses it:
 * cudaErrorInvalidResourceHandle), and a program may have streams on several devices (or ncclCommInitAll's
 * communicators may).  So every event the proxy records goes through record_on, which takes one made on the
 * stream's own device, and the events done with are kept for reuse per device.  Waiting for an event works
 * from any device's stream. */

struct dev_event { cudaEvent_t e; int dev; };     /* e NULL: none; dev -1: the device is not known */
struct event_pool { cudaEvent_t *ev; size_t n, cap; };
static struct event_pool *pools;                  /* by device; grows */
static size_t n_pools;
static struct dev_event held_event;  /* the event the main thread is synchronising on: not recycled meanwhile */
static int held_event_done;          /* poll_colls passed it while held: recycle it after */

/* The device whose work `stream` runs (the legacy default stream's: the current device); -1 if not known. */
static int device_of(cudaStream_t stream)
{
    int dev = -1;
    if (stream && r_stream_device && r_stream_device(stream, &dev) == cudaSuccess)
        return dev;
    return r_get_device && r_get_device(&dev) == cudaSuccess ? dev : -1;
}

/* A new event made on `dev` (-1: the current device); the current device is the same after. */
static cudaEvent_t event_create_on(int dev, cudaError_t *err)
{
    int current = -1;
    int other = dev >= 0 && r_get_device && r_set_device && r_get_device(&current) == cudaSuccess && current != dev;
    if (other && (*err = r_set_device(dev)) != cudaSuccess)
        return NULL;
    cudaEvent_t e = NULL;
    if ((*err = r_event_create(&e, cudaEventDisableTiming)) != cudaSuccess)
        e = NULL;
    cudaError_t back = other ? r_set_device(current) : cudaSuccess;
    if (back != cudaSuccess) {          /* the program's next calls would run on another device: stop them */
        plog("cannot make device %d current again after making an event on device %d (error %d)", current, dev,
             (int)back);
        if (W->device_error == 0)
            __atomic_store_n(&W->device_error, (int32_t)back, __ATOMIC_SEQ_CST);
    }
    return e;
}

static void event_destroy(cudaEvent_t e)
{
    if (r_event_destroy)                /* (every runtime has it; without it an event is left, not freed) */
        r_event_destroy(e);
}

static void event_put(struct dev_event d)
{
    if (!d.e)
        return;
    if (d.e == held_event.e) {
        held_event_done = 1;
        return;
    }
    if (d.dev < 0) {                    /* (which pool it belongs to is not known) */
        event_destroy(d.e);
        return;
    }
    if ((size_t)d.dev >= n_pools) {
        size_t n = (size_t)d.dev + 1;
        struct event_pool *grown = realloc(pools, n * sizeof *grown);
        if (!grown) {                   /* (an event less for reuse: nothing is lost) */
            event_destroy(d.e);
            return;
        }
        memset(grown + n_pools, 0, (n - n_pools) * sizeof *grown);
        pools = grown;
        n_pools = n;
    }
    struct event_pool *p = &pools[d.dev];
    make_room((void **)&p->ev, &p->cap, p->n, sizeof *p->ev, "CUDA events kept for reuse");
    p->ev[p->n++] = d.e;
}

/* An event of `stream`'s device recorded on it; {NULL} when none could be (*err says why). */
static struct dev_event record_on(cudaStream_t stream, cudaError_t *err)
{
    struct dev_event d = {NULL, device_of(stream)};
    if (d.dev >= 0 && (size_t)d.dev < n_pools && pools[d.dev].n > 0)
        d.e = pools[d.dev].ev[--pools[d.dev].n];
    else
        d.e = event_create_on(d.dev, err);
    if (d.e && (*err = r_event_record(d.e, stream)) != cudaSuccess) {
        event_destroy(d.e);           /* (not reused: it may not be of the device it was thought to be) */
        d.e = NULL;
    }
    return d;
}

/* ---- collectives in flight (under mu) ----------------------------------------------- */

struct coll { uint64_t seq, t_ns; struct dev_event ev; };   /* ev.e NULL: not watched */
static struct coll *colls;
static size_t coll_head, coll_tail, cap_colls;  /* ring: [tail, head) unfinished, oldest first; grows */
static uint64_t seq_issued, seq_done;          /* seq_done: every collective <= it has completed */

/* The oldest collectives that completed leave the ring. */
static void poll_colls(void)
{
    while (coll_tail != coll_head) {
        struct coll *c = &colls[coll_tail % cap_colls];
        cudaError_t e = c->ev.e ? r_event_query(c->ev.e) : cudaSuccess;
        if (e == cudaErrorNotReady)
            break;
        if (e != cudaSuccess && W->device_error == 0)
            __atomic_store_n(&W->device_error, (int32_t)e, __ATOMIC_SEQ_CST);
        __atomic_store_n(&seq_done, c->seq, __ATOMIC_SEQ_CST);
        event_put(c->ev);
        coll_tail++;
    }
    if (coll_tail == coll_head)
        __atomic_store_n(&seq_done, seq_issued, __ATOMIC_SEQ_CST);
    __atomic_store_n(&W->coll_oldest_ns, coll_tail != coll_head ? colls[coll_tail % cap_colls].t_ns : 0,
                     __ATOMIC_SEQ_CST);
}

/* ---- dependencies of streams and events on collectives (main thread) ---------------- */

/* Which collective (seq) a stream's or an event's next work waits for.  When a table is full, the entries
 * whose collective has completed go (they hold nothing back); only if none has does it grow.  (It once
 * forgot its oldest entry instead: with 600 events recorded after each all-reduce, the event that the
 * compute stream waited on was forgotten, and the optimizer step ran past a frozen all-reduce.) */
struct dep { uint64_t vid, need; };
struct dep_table { struct dep *t; size_t n, cap; const char *what; };
static struct dep_table stream_deps = {.what = "streams waiting on collectives"},
                        event_deps = {.what = "events recorded after collectives"};

static struct dep *dep_of(struct dep_table *d, uint64_t vid, int create)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->t[i].vid == vid)
            return &d->t[i];
    if (!create)
        return NULL;
    if (d->n == d->cap) {
        uint64_t done = __atomic_load_n(&seq_done, __ATOMIC_SEQ_CST);
        size_t kept = 0;
        for (size_t i = 0; i < d->n; i++)
            if (d->t[i].need > done)
                d->t[kept++] = d->t[i];
        d->n = kept;
        if (kept == d->cap || kept > d->cap / 2)   /* (mostly) pending: grow, rather than compact at every insert */
            make_room((void **)&d->t, &d->cap, d->cap, sizeof *d->t, d->what);
    }
    d->t[d->n] = (struct dep){vid, 0};
    return &d->t[d->n++];
}

static uint64_t need_of_stream(uint64_t vid)
{
    struct dep *d = dep_of(&stream_deps, vid, 0);
    return d ? d->need : 0;
}

/* ---- the record being executed (main thread) ---------------------------------------- */

enum fn_kind { K_OTHER, K_COLL, K_GROUP_START, K_GROUP_END, K_EVENT_RECORD, K_STREAM_WAIT, K_WORK, K_BLAS_WORK,
               K_BLAS_SET_STREAM, K_BLAS_GONE, K_COMM_INIT,
               K_COMM_GONE, K_CAPTURE_BEGIN, K_CAPTURE_END };
/* Captures under way (main thread writes, the watcher reads).  While one is,
 * nothing here records or queries an event: an event recorded in a capturing
 * stream becomes part of the graph, and querying one invalidates the capture
 * (tests/emulator_programs/graphs.cu, captured_event). */
static int capturing;
static unsigned char kinds[RFN_count];
static int kinds_ready;

static void classify(void)
{
    static const char *const colls_names[] = {"ncclAllReduce", "ncclBroadcast", "ncclBcast", "ncclReduce",
                                              "ncclAllGather", "ncclReduceScatter", "ncclAlltoAll", "ncclSend",
                                              "ncclRecv", "ncclGather", "ncclScatter", NULL};
    for (unsigned fn = 0; fn < RFN_count; fn++) {
        const char *n = dispatch_generated[fn].name;
        kinds[fn] = K_OTHER;
        if (!n)
            continue;
        for (int i = 0; colls_names[i]; i++)
            if (strcmp(n, colls_names[i]) == 0)
                kinds[fn] = K_COLL;
        if (strcmp(n, "ncclGroupStart") == 0)
            kinds[fn] = K_GROUP_START;
        else if (strcmp(n, "ncclGroupEnd") == 0)
            kinds[fn] = K_GROUP_END;
        else if (strcmp(n, "cudaEventRecord") == 0 || strcmp(n, "cudaEventRecordWithFlags") == 0)
            kinds[fn] = K_EVENT_RECORD;
        else if (strcmp(n, "cudaStreamWaitEvent") == 0)
            kinds[fn] = K_STREAM_WAIT;
        else if (strncmp(n, "cudaMemcpy", 10) == 0 || strncmp(n, "cudaMemset", 10) == 0)
            kinds[fn] = K_WORK;
        else if (strcmp(n, "ncclCommInitRank") == 0 || strcmp(n, "ncclCommInitRankConfig") == 0)
            kinds[fn] = K_COMM_INIT;
        else if (strcmp(n, "ncclCommDestroy") == 0 || strcmp(n, "ncclCommAbort") == 0)
            kinds[fn] = K_COMM_GONE;
        else if (strcmp(n, "cudaStreamBeginCapture") == 0)
            kinds[fn] = K_CAPTURE_BEGIN;
        else if (strcmp(n, "cudaStreamEndCapture") == 0)
            kinds[fn] = K_CAPTURE_END;
        else if (strcmp(n, "cublasSetStream_v2") == 0 || strcmp(n, "cudnnSetStream") == 0)
            kinds[fn] = K_BLAS_SET_STREAM;
        else if (strcmp(n, "cublasDestroy_v2") == 0 || strcmp(n, "cudnnDestroy") == 0)
            kinds[fn] = K_BLAS_GONE;
        else if (strncmp(n, "cublas", 6) == 0 && (strstr(n, "gemm") || strstr(n, "Gemm")))
            kinds[fn] = K_BLAS_WORK;           /* work on the handle's stream (issue 19) */
        else if (strncmp(n, "cudnnBatchNormalization", 23) == 0)
            kinds[fn] = K_BLAS_WORK;           /* likewise a cuDNN handle's */
    }
    kinds[RFN_cudaLaunchKernel] = K_WORK;
    kinds[RFN___cudaLaunchKernel] = K_WORK;
#ifdef JITCKPT_REMOTE_CUBLASLT
    kinds[RFN_cublasLtMatmul] = K_WORK;        /* a GEMM on the stream it names (blaslt.c) */
#endif
#ifdef JITCKPT_REMOTE_CUDNN
    kinds[RFN_cudnnBackendExecute] = K_BLAS_WORK;   /* an execution plan on its handle's stream (dnn.c) */
#endif
    kinds_ready = 1;
}

static unsigned cur_fn;
static int cur_kind, cur_dropped;
static uint64_t cur_stream, cur_event, cur_comm, cur_blas;

/* Each cuBLAS or cuDNN handle's stream (issue 19): a GEMM, a convolution or a BatchNorm is work on it, held
 * back as a launch on it is.  Set by cublasSetStream_v2 or cudnnSetStream (the worker sends it again to a
 * new proxy); a handle never given one works on stream 0.  (Virtual ids name their kind: one table.)
 * Main thread only.  The table grows as handles are made (no limit: a handle missing here would let its work
 * run past an unfinished collective, and a recovery meet changed parameters); out of memory stops the proxy. */
static struct blas_stream { uint64_t blas, stream; } *blas_streams;
static int n_blas_streams, cap_blas_streams;

static void forget_blas(uint64_t blas)                /* the handle is destroyed */
{
    for (int i = 0; i < n_blas_streams; i++)
        if (blas_streams[i].blas == blas) {
            blas_streams[i] = blas_streams[--n_blas_streams];
            return;
        }
}

static uint64_t stream_of_blas(uint64_t blas)
{
    for (int i = 0; i < n_blas_streams; i++)
        if (blas_streams[i].blas == blas)
            return blas_streams[i].stream;
    return 0;
}

static void set_stream_of_blas(uint64_t blas, uint64_t stream)
{
    for (int i = 0; i < n_blas_streams; i++)
        if (blas_streams[i].blas == blas) {
            blas_streams[i].stream = stream;
            return;
        }
    if (n_blas_streams == cap_blas_streams) {
        int cap = cap_blas_streams ? 2 * cap_blas_streams : 64;
        struct blas_stream *grown = realloc(blas_streams, (size_t)cap * sizeof *grown);
        if (!grown) {
            plog("out of memory for the table of %d cuBLAS and cuDNN handles' streams: the proxy stops rather "
                 "than let work on a handle run past an unfinished collective", n_blas_streams + 1);
            abort();
        }
        blas_streams = grown;
        cap_blas_streams = cap;
    }
    blas_streams[n_blas_streams++] = (struct blas_stream){blas, stream};
}
static int group_depth;
static uint64_t *group_streams;      /* the streams of a group's collectives, each once */
static size_t n_group_streams, cap_group_streams;

/* ---- communicators (main thread writes, watcher reads; under mu) -------------------- */

static ncclComm_t *comms;           /* every communicator, for the abort and the error poll (grows) */
static size_t n_comms, cap_comms;

static void comm_add(ncclComm_t c)
{
    pthread_mutex_lock(&mu);
    if (c) {
        make_room((void **)&comms, &cap_comms, n_comms, sizeof *comms, "communicators");
        comms[n_comms++] = c;
    }
    pthread_mutex_unlock(&mu);
}

static void comm_remove(ncclComm_t c)
{
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_comms; i++)
        if (comms[i] == c) {
            comms[i] = comms[--n_comms];
            break;
        }
    pthread_mutex_unlock(&mu);
}

void watch_comm_added(ncclComm_t c)
{
    comm_add(c);
}

/* ---- minibatch markers (under mu) --------------------------------------------------- */

/* An event on every stream (ev; grows).  `unmarked`: a stream on which no event could be recorded (a failing
 * runtime): this marker cannot say that the device finished its minibatch, so it counts as done only together
 * with the next marker that every stream passed (streams run in order). */
struct marker { uint64_t index; size_t n, cap; struct dev_event *ev; int unmarked; };
static struct marker *markers;
static size_t mark_head, mark_tail, cap_markers;   /* ring: [tail, head) not yet done; grows */

/* 1 once the newest of events[0, *n) is done (each is released as it is; 0: not yet, or a device error). */
static int events_done(struct dev_event *events, size_t *n)
{
    for (; *n > 0; (*n)--) {
        cudaError_t e = r_event_query(events[*n - 1].e);
        if (e == cudaErrorNotReady)
            return 0;
        if (e != cudaSuccess) {          /* not completed: a device error (the marker never counts as done) */
            if (W->device_error == 0)
                __atomic_store_n(&W->device_error, (int32_t)e, __ATOMIC_SEQ_CST);
            return 0;
        }
        event_put(events[*n - 1]);
    }
    return 1;
}

static void poll_markers(void)
{
    while (mark_tail != mark_head) {
        struct marker *m = &markers[mark_tail % cap_markers];
        if (!events_done(m->ev, &m->n))
            return;
        if (!m->unmarked)               /* (done_marker covers every earlier marker, unmarked ones included) */
            __atomic_store_n(&W->done_marker, m->index + 1, __ATOMIC_SEQ_CST);
        mark_tail++;
    }
}

struct mark_arg { struct marker *m; };

static void mark_stream(uint64_t vid, void *real, void *arg)
{
    struct marker *m = ((struct mark_arg *)arg)->m;
    make_room((void **)&m->ev, &m->cap, m->n, sizeof *m->ev, "streams a minibatch marker waits for");
    cudaError_t err = cudaSuccess;
    struct dev_event d = record_on((cudaStream_t)real, &err);
    if (d.e) {
        m->ev[m->n++] = d;
        return;
    }
    m->unmarked = 1;
    static int said;
    if (!said && (said = 1))
        plog("minibatch %llu: no event could be recorded on stream %#llx (error %d): a minibatch counts as done on "
             "the device only at a later marker that every stream passed (the call log keeps more; it is trimmed "
             "there, or recovery turns off at its size limit); said once", (unsigned long long)m->index,
             (unsigned long long)vid, (int)err);
}

void watch_mark(uint64_t index)
{
    if (__atomic_load_n(&capturing, __ATOMIC_SEQ_CST))
        return;
    pthread_mutex_lock(&mu);
    if (mark_head - mark_tail == cap_markers)   /* the device is that far behind: a larger ring (a marker is done
                                                 * only when its events are: the log needs it) */
        grow_ring((void **)&markers, &cap_markers, &mark_tail, &mark_head, sizeof *markers, "minibatch markers");
    struct marker *m = &markers[mark_head % cap_markers];
    m->index = index;
    m->n = 0;
    m->unmarked = 0;
    cudaError_t before = r_peek_error ? r_peek_error() : cudaSuccess;
    struct mark_arg a = {m};
    vh_each(VH_STREAM, mark_stream, &a);
    mark_stream(0, NULL, &a);                          /* the legacy default stream */
    mark_head++;
    pthread_mutex_unlock(&mu);
    if (before == cudaSuccess && r_get_error)
        r_get_error();                  /* a record refused on another device's stream is not the program's error */
}

/* ---- rewind saves (JITCKPT_RFN_REWIND; the worker's interpose/remote/rewind.c) ----------
 *
 * The byte ranges a minibatch changes in place before its optimizer step
 * (BatchNorm's running statistics, counters) are copied to `dst` (pinned
 * host memory the worker shares with us) at the boundary between two
 * minibatches, in the device's order: the legacy default
 * stream waits for every stream's work so far, copies, and every stream waits
 * for the copies before anything after them.  A host function then writes
 * the save's stamp (the minibatch) into the worker's memory: a save is
 * complete when its stamp is there, whatever became of this process. */

static void join_stream(uint64_t vid, void *real, void *arg)
{
    (void)vid;
    cudaError_t err = cudaSuccess;
    struct dev_event d = record_on((cudaStream_t)real, &err);
    if (!d.e || r_stream_wait(NULL, d.e, 0) != cudaSuccess)
        *(int *)arg = 1;
    event_put(d);
}

struct wait_arg { struct dev_event d; int failed; };

static void wait_for(uint64_t vid, void *real, void *arg)
{
    (void)vid;
    struct wait_arg *a = arg;
    if (r_stream_wait((cudaStream_t)real, a->d.e, 0) != cudaSuccess)
        a->failed = 1;
}

struct stamp { uint64_t *at, value; };

static void write_stamp(void *arg)                     /* the runtime's thread, once the copies are done */
{
    struct stamp *s = arg;
    __atomic_store_n(s->at, s->value, __ATOMIC_RELEASE);
    free(s);
}

static void rewind_failed(cudaError_t err)
{
    if (W->rewind_error == 0)
        __atomic_store_n(&W->rewind_error, (int32_t)(err ? err : cudaErrorUnknown), __ATOMIC_SEQ_CST);
}

/* Never an error of the program's: a save that cannot be made only makes a later recovery refuse
 * (rewind_error), and what the runtime noted of it is forgotten. */
int watch_rewind_save(uint64_t dst, uint64_t stamp, uint64_t value, uint32_t n, const uint64_t *ranges)
{
    if (__atomic_load_n(&capturing, __ATOMIC_SEQ_CST))
        return 0;                                      /* (recovery is off for a job that captures) */
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        bytes += ranges[2 * i + 1];
    if (!r_stream_wait || !r_memcpy_async || !r_host_func || !pinned_contains_range((void *)(uintptr_t)dst, bytes) ||
        !pinned_contains_range((void *)(uintptr_t)stamp, sizeof(uint64_t))) {
        rewind_failed(cudaErrorInvalidValue);
        return 0;
    }
    cudaError_t before = r_peek_error ? r_peek_error() : cudaSuccess;
    pthread_mutex_lock(&mu);
    int unordered = 0;
    vh_each(VH_STREAM, join_stream, &unordered);
    cudaError_t err = unordered ? cudaErrorUnknown : cudaSuccess;   /* (no event: no save it could be sure of) */
    for (uint32_t i = 0; i < n && err == cudaSuccess; i++) {
        err = r_memcpy_async((void *)(uintptr_t)dst, (const void *)(uintptr_t)ranges[2 * i], ranges[2 * i + 1],
                             cudaMemcpyDeviceToHost, NULL);
        dst += ranges[2 * i + 1];
    }
    struct stamp *st = err == cudaSuccess ? malloc(sizeof *st) : NULL;
    if (st) {
        *st = (struct stamp){(uint64_t *)(uintptr_t)stamp, value};
        if ((err = r_host_func(NULL, write_stamp, st)) != cudaSuccess)
            free(st);
    } else if (err == cudaSuccess) {
        err = cudaErrorMemoryAllocation;
    }
    cudaError_t mark_err = cudaSuccess;
    struct wait_arg a = {record_on(NULL, &mark_err), 0};
    if (!a.d.e)
        a.failed = 1;
    else
        vh_each(VH_STREAM, wait_for, &a);
    event_put(a.d);
    pthread_mutex_unlock(&mu);
    if (err != cudaSuccess || unordered || a.failed)   /* (work after the copies may have overtaken them) */
        rewind_failed(err != cudaSuccess ? err : mark_err);
    if (before == cudaSuccess && r_get_error)
        r_get_error();                  /* our failures are not the program's last error */
    return 0;
}

uint64_t watch_done_marker(void)
{
    pthread_mutex_lock(&mu);
    poll_markers();
    poll_colls();
    pthread_mutex_unlock(&mu);
    return __atomic_load_n(&W->done_marker, __ATOMIC_SEQ_CST);
}

/* ---- the main thread's hooks -------------------------------------------------------- */

void watch_before(unsigned fn)
{
    if (!kinds_ready)
        classify();
    cur_fn = fn;
    cur_kind = fn < RFN_count ? kinds[fn] : K_OTHER;
    cur_dropped = 0;
    cur_stream = cur_event = cur_comm = cur_blas = 0;
}

static int aborting(void)
{
    return __atomic_load_n(&W->abort_before, __ATOMIC_SEQ_CST) != 0;
}

/* rdisp.c, for every handle a dispatch reads.  0, or -1: the record is dropped. */
int watch_handle(int kind, uint64_t vid)
{
    if (kind == VH_EVENT) {
        cur_event = vid;
        return 0;
    }
    if (kind == VH_COMM) {
        cur_comm = vid;
        void *real = NULL;
        if (cur_kind == K_COMM_GONE && vh_lookup(VH_COMM, vid, &real) == 0)
            comm_remove((ncclComm_t)real);          /* before it is destroyed: the watcher must not touch it */
        return 0;
    }
    if (kind == VH_BLAS || kind == VH_DNN) {
        cur_blas = vid;
        if (cur_kind == K_BLAS_GONE)
            forget_blas(vid);
        if (cur_kind != K_BLAS_WORK)
            return 0;
        vid = stream_of_blas(vid);             /* a GEMM: held back as work on its handle's stream */
    } else if (kind != VH_STREAM) {
        return 0;
    } else if (cur_kind == K_BLAS_SET_STREAM) {
        set_stream_of_blas(cur_blas, vid);     /* (the handle is read first: its parameter comes first) */
        return 0;
    }
    cur_stream = vid;
    /* Only a worker that recovers needs the hold (a job of one rank has no replica to recover from). */
    if ((cur_kind != K_WORK && cur_kind != K_BLAS_WORK) || !__atomic_load_n(&W->recovery_on, __ATOMIC_RELAXED))
        return 0;
    uint64_t need = need_of_stream(vid);
    uint64_t done = __atomic_load_n(&seq_done, __ATOMIC_SEQ_CST);
    if (need == 0 || done >= need)
        return 0;
    pdebug("holding %s back: its stream waits for collective %llu (%llu done)", dispatch_generated[cur_fn].name,
           (unsigned long long)need, (unsigned long long)done);
    for (;;) {
        /* An abort first: an aborted collective "completes" without its result. */
        if (aborting()) {
            cur_dropped = 1;
            pdebug("dropped a held record (an abort)");
            return -1;
        }
        pthread_mutex_lock(&mu);
        if (seq_done < need)
            poll_colls();
        int ready = seq_done >= need;
        /* Sleep until the collective this record needs completes (an abort ends it too):
         * its own event, kept from recycling while this thread waits on it. */
        struct dev_event e = {NULL, -1};
        for (size_t i = coll_tail; !ready && i != coll_head; i++)
            if (colls[i % cap_colls].seq == need)
                e = colls[i % cap_colls].ev;
        held_event = e;
        pthread_mutex_unlock(&mu);
        if (ready && !aborting())
            return 0;
        if (e.e && r_event_sync) {
            r_event_sync(e.e);
        } else {
            struct timespec t = {0, 100000L};
            nanosleep(&t, NULL);
        }
        pthread_mutex_lock(&mu);
        held_event = (struct dev_event){NULL, -1};
        if (held_event_done) {
            held_event_done = 0;
            event_put(e);
        }
        pthread_mutex_unlock(&mu);
    }
}

static void record_collective(uint64_t stream_vid)
{
    if (__atomic_load_n(&capturing, __ATOMIC_SEQ_CST))
        return;                 /* (not watched: recovery is off for a job that captures) */
    void *real = NULL;
    if (vh_lookup(VH_STREAM, stream_vid, &real) != 0)
        return;
    cudaError_t before = r_peek_error ? r_peek_error() : cudaSuccess;
    pthread_mutex_lock(&mu);
    if (coll_head - coll_tail == cap_colls)
        poll_colls();
    if (coll_head - coll_tail == cap_colls)     /* every one unfinished: a larger ring */
        grow_ring((void **)&colls, &cap_colls, &coll_tail, &coll_head, sizeof *colls, "collectives in flight");
    {
        /* The collective's completion is watched through this event; without one it counts as complete at
         * once.  A lost device (a sticky error) runs nothing more, and its error makes the worker recover.
         * Otherwise it is said (no event to be had: work after it is not held back). */
        cudaError_t err = cudaSuccess;
        struct dev_event e = record_on((cudaStream_t)real, &err);
        if (!e.e) {
            if (jitckpt_sticky_cuda_error((int)err)) {
                if (W->device_error == 0)
                    __atomic_store_n(&W->device_error, (int32_t)err, __ATOMIC_SEQ_CST);
            } else {
                static int said;
                if (!said && (said = 1))
                    plog("collective %llu cannot be watched (no CUDA event on its stream: error %d): work after it "
                         "is not held back (said once)", (unsigned long long)seq_issued + 1, (int)err);
            }
        }
        uint64_t seq = ++seq_issued;
        colls[coll_head % cap_colls] = (struct coll){seq, now_ns(), e};
        coll_head++;
        struct dep *d = dep_of(&stream_deps, stream_vid, 1);
        d->need = seq;
    }
    pthread_mutex_unlock(&mu);
    if (before == cudaSuccess && r_get_error)
        r_get_error();                  /* what our own calls failed at is not the program's last error */
}

void watch_after(unsigned fn, int32_t ret)
{
    (void)fn;
    switch (cur_kind) {
    case K_COLL:
        if (ret != 0)
            break;
        if (group_depth > 0) {
            size_t i = 0;
            while (i < n_group_streams && group_streams[i] != cur_stream)
                i++;
            if (i == n_group_streams) {
                make_room((void **)&group_streams, &cap_group_streams, n_group_streams, sizeof *group_streams,
                          "streams of one NCCL group");
                group_streams[n_group_streams++] = cur_stream;
            }
        } else {
            record_collective(cur_stream);
        }
        break;
    case K_GROUP_START:
        if (ret == 0)
            group_depth++;
        break;
    case K_CAPTURE_BEGIN:
        if (ret == 0)
            __atomic_add_fetch(&capturing, 1, __ATOMIC_SEQ_CST);
        break;
    case K_CAPTURE_END:       /* ends the capture, unless there was none */
        if (ret != cudaErrorIllegalState && ret != cudaErrorInvalidResourceHandle && ret != cudaErrorInvalidValue &&
            __atomic_load_n(&capturing, __ATOMIC_SEQ_CST) > 0)
            __atomic_sub_fetch(&capturing, 1, __ATOMIC_SEQ_CST);
        break;
    case K_GROUP_END:
        if (group_depth > 0 && --group_depth == 0) {
            for (size_t i = 0; i < n_group_streams; i++)
                if (ret == 0)
                    record_collective(group_streams[i]);
            n_group_streams = 0;
        }
        break;
    case K_EVENT_RECORD:
        if (ret == 0) {
            uint64_t need = need_of_stream(cur_stream);
            struct dep *d = dep_of(&event_deps, cur_event, need != 0);
            if (d)
                d->need = need;
        }
        break;
    case K_STREAM_WAIT:
        if (ret == 0) {
            struct dep *e = dep_of(&event_deps, cur_event, 0);
            if (e && e->need) {
                struct dep *d = dep_of(&stream_deps, cur_stream, 1);
                if (d->need < e->need)
                    d->need = e->need;
            }
        }
        break;
    default:
        break;
    }
}

/* The communicator a successful ncclCommInitRank created: its vid is the response's first 8 bytes. */
void watch_comm_created(const unsigned char *rep, size_t n)
{
    uint64_t vid;
    void *real = NULL;
    if (n >= sizeof vid) {
        memcpy(&vid, rep, sizeof vid);
        if (vh_lookup(VH_COMM, vid, &real) == 0 && real)
            comm_add((ncclComm_t)real);
    }
}

int watch_is_comm_init(unsigned fn)
{
    if (!kinds_ready)
        classify();
    return fn < RFN_count && kinds[fn] == K_COMM_INIT;
}

int watch_record_dropped(void)
{
    return cur_dropped;
}

int watch_dropping(uint64_t pos)
{
    uint64_t before = __atomic_load_n(&W->abort_before, __ATOMIC_SEQ_CST);
    return before != 0 && pos < before;
}

/* Recovery is over (restore.c, JITCKPT_RFN_RST_CLEAR): nothing is in flight any more. */
void watch_clear(void)
{
    pthread_mutex_lock(&mu);
    for (; coll_tail != coll_head; coll_tail++)
        event_put(colls[coll_tail % cap_colls].ev);
    for (; mark_tail != mark_head; mark_tail++) {
        struct marker *m = &markers[mark_tail % cap_markers];
        for (size_t i = 0; i < m->n; i++)
            event_put(m->ev[i]);
        m->n = 0;
    }
    __atomic_store_n(&seq_done, seq_issued, __ATOMIC_SEQ_CST);
    stream_deps.n = event_deps.n = 0;
    group_depth = n_group_streams = 0;
    __atomic_store_n(&W->coll_oldest_ns, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&W->comm_error, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&W->device_error, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&W->abort_done, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&W->abort_before, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&mu);
}

/* cudaDeviceReset succeeded (alloc.c): it destroyed every event of the current device, the proxy's among
 * them.  Their handles are forgotten, not destroyed (a dead handle may equal an event the program makes next,
 * and recording a marker on that would change the program's event); what they watched counts as done. */
void watch_device_reset(void)
{
    int dev = -1;
    if (!r_get_device || r_get_device(&dev) != cudaSuccess)
        return;
    pthread_mutex_lock(&mu);
    if ((size_t)dev < n_pools)
        pools[dev].n = 0;
    for (size_t i = coll_tail; i != coll_head; i++)
        if (colls[i % cap_colls].ev.dev == dev)
            colls[i % cap_colls].ev.e = NULL;
    for (size_t i = mark_tail; i != mark_head; i++) {
        struct marker *m = &markers[i % cap_markers];
        size_t kept = 0;
        for (size_t j = 0; j < m->n; j++)
            if (m->ev[j].dev != dev)
                m->ev[kept++] = m->ev[j];
        m->n = kept;
    }
    pthread_mutex_unlock(&mu);
}

/* The done_marker a recovery continues from (the worker's log says which minibatch that is). */
void watch_set_done_marker(uint64_t v)
{
    __atomic_store_n(&W->done_marker, v, __ATOMIC_SEQ_CST);
}

/* ---- the watcher thread ------------------------------------------------------------- */

static void *watcher(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec t = {0, WATCH_MS * 1000000L};
        nanosleep(&t, NULL);
        pthread_mutex_lock(&mu);
        if (!__atomic_load_n(&capturing, __ATOMIC_SEQ_CST)) {
            poll_colls();
            poll_markers();
        }
        if (__atomic_load_n(&W->comm_error, __ATOMIC_SEQ_CST) == 0)
            for (size_t i = 0; i < n_comms; i++) {
                ncclResult_t r = ncclSuccess;
                if (r_comm_async(comms[i], &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
                    __atomic_store_n(&W->comm_error, (int32_t)r, __ATOMIC_SEQ_CST);
                    break;
                }
            }
        if (aborting() && !__atomic_load_n(&W->abort_done, __ATOMIC_SEQ_CST)) {
            for (size_t i = 0; i < n_comms; i++)
                r_comm_abort(comms[i]);
            if (n_comms)
                plog("aborted %zu communicator(s) for a recovery", n_comms);
            n_comms = 0;
            __atomic_store_n(&W->abort_done, 1, __ATOMIC_SEQ_CST);
        }
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

int watch_start(struct jitckpt_wire *w)
{
    W = w;
    r_event_create = (__typeof__(r_event_create))proxy_sym(cudart, "cudaEventCreateWithFlags");
    r_event_record = (__typeof__(r_event_record))proxy_sym(cudart, "cudaEventRecord");
    r_event_query = (__typeof__(r_event_query))proxy_sym(cudart, "cudaEventQuery");
    r_event_destroy = (__typeof__(r_event_destroy))proxy_sym(cudart, "cudaEventDestroy");
    r_stream_device = (__typeof__(r_stream_device))proxy_sym(cudart, "cudaStreamGetDevice");
    r_get_device = (__typeof__(r_get_device))proxy_sym(cudart, "cudaGetDevice");
    r_set_device = (__typeof__(r_set_device))proxy_sym(cudart, "cudaSetDevice");
    r_event_sync = (__typeof__(r_event_sync))proxy_sym(cudart, "cudaEventSynchronize");
    r_stream_wait = (__typeof__(r_stream_wait))proxy_sym(cudart, "cudaStreamWaitEvent");
    r_memcpy_async = (__typeof__(r_memcpy_async))proxy_sym(cudart, "cudaMemcpyAsync");
    r_host_func = (__typeof__(r_host_func))proxy_sym(cudart, "cudaLaunchHostFunc");
    r_peek_error = (__typeof__(r_peek_error))proxy_sym(cudart, "cudaPeekAtLastError");
    r_get_error = (__typeof__(r_get_error))proxy_sym(cudart, "cudaGetLastError");
    r_comm_async = nccl ? (__typeof__(r_comm_async))proxy_sym(nccl, "ncclCommGetAsyncError") : NULL;
    r_comm_abort = nccl ? (__typeof__(r_comm_abort))proxy_sym(nccl, "ncclCommAbort") : NULL;
    held_event.dev = -1;
    if (!r_event_create || !r_event_record || !r_event_query) {
        plog("the CUDA runtime lacks event functions: collectives are not watched (no recovery)");
        return -1;
    }
    if (!r_comm_async || !r_comm_abort)
        return 0;                                      /* no NCCL: nothing to watch */
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, watcher, NULL);
    pthread_attr_destroy(&a);
    return rc == 0 ? 0 : -1;
}
