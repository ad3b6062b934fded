/* stream.c -- streams: in-order queues of work, each run by its own worker
 * thread, with the synchronisation rules of CUDA's legacy default stream.
 *
 * An API call that puts work on a stream appends an op to the stream's queue
 * and returns; the stream's worker runs the ops one after another.  Each
 * stream counts ops enqueued and completed, so "has this stream finished
 * everything up to op n" is a comparison, and every wait in the runtime is a
 * loop on simdev_progress that re-checks such a comparison.
 *
 * Legacy default stream (handle 0 without per-thread default stream, or
 * cudaStreamLegacy): an op put on it first waits for all work already
 * submitted to every blocking stream of its device, and an op put on a
 * blocking stream first waits for all work already submitted to the legacy
 * stream.  Both are expressed as WAIT_STREAM ops inserted in front of the op;
 * a wait always targets work submitted earlier (submission is serialised by
 * simdev_lock), so waits cannot form a cycle.  Streams created with
 * cudaStreamNonBlocking take part in neither rule.  The per-thread default
 * stream (cudaStreamPerThread, or 0 in code built with
 * --default-stream per-thread) is an ordinary blocking stream per thread. */

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"

__thread struct simdev_stream *simdev_tls_worker;

static struct simdev_stream *handles;          /* streams created by the program */
static unsigned long long next_stream_id = 1;

struct ptds_slot {
    struct simdev_stream *s;
    uint64_t epoch;
};
static __thread struct ptds_slot tls_ptds[SIMDEV_MAX_DEVICES];
static pthread_key_t ptds_key;
static pthread_once_t ptds_key_once = PTHREAD_ONCE_INIT;

static void destroy_locked(struct simdev_stream *s);

/* ---- ops --------------------------------------------------------------- */

struct simdev_op *simdev_op_new(enum simdev_op_kind kind, const char *name)
{
    struct simdev_op *op = calloc(1, sizeof *op);
    if (op) {
        op->kind = kind;
        op->name = name;
    }
    return op;
}

/* Drops the references an op holds; the caller holds simdev_lock. */
static void op_drop_refs_locked(struct simdev_op *op)
{
    if (op->wait_stream) {
        simdev_stream_unref_locked(op->wait_stream);
        op->wait_stream = NULL;
    }
    if (op->event) {
        simdev_event_unref_locked(op->event);
        op->event = NULL;
    }
}

static void op_free_unlocked(struct simdev_op *op)
{
    if (op->release)
        op->release(op->arg);
    free(op);
}

void simdev_op_discard_locked(struct simdev_op *op)
{
    op_drop_refs_locked(op);
    pthread_mutex_unlock(&simdev_lock);
    op_free_unlocked(op);
    pthread_mutex_lock(&simdev_lock);
}

/* ---- stream life cycle ------------------------------------------------- */

static int abandoned(const struct simdev_stream *s)
{
    return s->cancelled || simdev_devices[s->device].fatal != cudaSuccess;
}

int simdev_worker_should_stop(void)
{
    struct simdev_stream *s = simdev_tls_worker;
    if (!s)
        return 0;
    return __atomic_load_n(&s->cancelled, __ATOMIC_ACQUIRE) ||
           __atomic_load_n(&simdev_devices[s->device].fatal, __ATOMIC_ACQUIRE) != cudaSuccess;
}

static void run_op_locked(struct simdev_stream *s, struct simdev_op *op)
{
    switch (op->kind) {
    case SIMDEV_OP_CALL:
        if (abandoned(s))
            break;
        pthread_mutex_unlock(&simdev_lock);
        op->fn(op->arg);
        pthread_mutex_lock(&simdev_lock);
        break;
    case SIMDEV_OP_WAIT_STREAM:
        while (op->wait_stream->completed < op->wait_seq && !abandoned(s))
            pthread_cond_wait(&simdev_progress, &simdev_lock);
        break;
    case SIMDEV_OP_WAIT_EVENT:
        while (op->event->done < op->event_gen && !abandoned(s))
            pthread_cond_wait(&simdev_progress, &simdev_lock);
        break;
    case SIMDEV_OP_RECORD_EVENT:
        /* Completed even when abandoned, so that nothing waits on it forever. */
        simdev_event_complete_locked(op->event, op->event_gen);
        break;
    case SIMDEV_OP_HANG:
        while (!abandoned(s))
            pthread_cond_wait(&simdev_progress, &simdev_lock);
        break;
    case SIMDEV_OP_DELAY: {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += op->delay_ms / 1000;
        deadline.tv_nsec += (long)(op->delay_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        while (!abandoned(s) &&
               pthread_cond_timedwait(&simdev_progress, &simdev_lock, &deadline) != ETIMEDOUT)
            ;
        break;
    }
    }
}

static void *worker_main(void *arg)
{
    struct simdev_stream *s = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);   /* signals belong to the program's threads */
    simdev_tls_worker = s;
    simdev_set_thread_device(s->device);

    pthread_mutex_lock(&simdev_lock);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&s->wake, &simdev_lock);
        if (!s->head)
            break;
        struct simdev_op *op = s->head;
        run_op_locked(s, op);
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->completed++;
        pthread_cond_broadcast(&simdev_progress);
        simdev_op_discard_locked(op);
    }
    struct simdev_device *d = &simdev_devices[s->device];
    for (struct simdev_stream **pp = &d->streams; *pp; pp = &(*pp)->next_on_device)
        if (*pp == s) {
            *pp = s->next_on_device;
            break;
        }
    s->worker_alive = 0;
    pthread_cond_broadcast(&simdev_progress);
    simdev_stream_unref_locked(s);
    pthread_mutex_unlock(&simdev_lock);
    return NULL;
}

static struct simdev_stream *create_locked(int device, enum simdev_stream_role role,
                                           unsigned flags, int priority)
{
    struct simdev_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->role = role;
    s->device = device;
    s->flags = flags;
    s->priority = priority;
    s->id = next_stream_id++;
    s->epoch = simdev_devices[device].epoch;
    s->refs = 2;                /* the owner's and the worker's */
    s->worker_alive = 1;
    pthread_cond_init(&s->wake, NULL);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&s->thread, &attr, worker_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        simdev_log("cannot start a stream worker thread: %s", strerror(rc));
        pthread_cond_destroy(&s->wake);
        free(s);
        return NULL;
    }
    struct simdev_device *d = &simdev_devices[device];
    s->next_on_device = d->streams;
    d->streams = s;
    if (role == SIMDEV_STREAM_USER) {
        s->next_handle = handles;
        handles = s;
    }
    return s;
}

void simdev_stream_unref_locked(struct simdev_stream *s)
{
    if (--s->refs == 0) {
        pthread_cond_destroy(&s->wake);
        free(s);
    }
}

void simdev_stream_unref(struct simdev_stream *s)
{
    pthread_mutex_lock(&simdev_lock);
    simdev_stream_unref_locked(s);
    pthread_mutex_unlock(&simdev_lock);
}

/* The owner gives the stream up: it finishes its queued work, then its
 * worker exits. */
static void destroy_locked(struct simdev_stream *s)
{
    if (s->destroyed)
        return;
    s->destroyed = 1;
    if (s->role == SIMDEV_STREAM_USER)
        for (struct simdev_stream **pp = &handles; *pp; pp = &(*pp)->next_handle)
            if (*pp == s) {
                *pp = s->next_handle;
                break;
            }
    pthread_cond_signal(&s->wake);
    simdev_stream_unref_locked(s);
}

static void ptds_thread_exit(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&simdev_lock);
    for (int i = 0; i < SIMDEV_MAX_DEVICES; i++)
        if (tls_ptds[i].s) {
            struct simdev_stream *s = tls_ptds[i].s;
            tls_ptds[i].s = NULL;
            if (s->destroyed)
                simdev_stream_unref_locked(s);   /* reset already let go of the stream */
            else
                destroy_locked(s);
        }
    pthread_mutex_unlock(&simdev_lock);
}

static void ptds_key_create(void)
{
    pthread_key_create(&ptds_key, ptds_thread_exit);
}

cudaError_t simdev_stream_resolve_locked(cudaStream_t handle, int ptds,
                                         struct simdev_stream **out)
{
    int device = simdev_current_device();
    if (!simdev_valid_device(device))
        return cudaErrorNoDevice;
    if (handle == 0)
        handle = ptds ? cudaStreamPerThread : cudaStreamLegacy;
    struct simdev_device *d = &simdev_devices[device];
    if (handle == cudaStreamLegacy) {
        if (!d->legacy) {
            d->legacy = create_locked(device, SIMDEV_STREAM_LEGACY, 0, 0);
            if (!d->legacy)
                return cudaErrorMemoryAllocation;
        }
        *out = d->legacy;
        return cudaSuccess;
    }
    if (handle == cudaStreamPerThread) {
        struct ptds_slot *slot = &tls_ptds[device];
        if (slot->s && slot->epoch != d->epoch) {
            simdev_stream_unref_locked(slot->s);   /* a reset destroyed it */
            slot->s = NULL;
        }
        if (!slot->s) {
            pthread_once(&ptds_key_once, ptds_key_create);
            slot->s = create_locked(device, SIMDEV_STREAM_PER_THREAD, 0, 0);
            if (!slot->s)
                return cudaErrorMemoryAllocation;
            slot->epoch = d->epoch;
            pthread_setspecific(ptds_key, slot);
        }
        *out = slot->s;
        return cudaSuccess;
    }
    for (struct simdev_stream *s = handles; s; s = s->next_handle)
        if ((cudaStream_t)s == handle) {
            *out = s;
            return cudaSuccess;
        }
    simdev_trace("stream handle %p is not a live stream", (void *)handle);
    return cudaErrorInvalidResourceHandle;
}

/* ---- submission -------------------------------------------------------- */

static void push_locked(struct simdev_stream *s, struct simdev_op *op)
{
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->enqueued++;
    pthread_cond_signal(&s->wake);
}

static int push_wait_stream_locked(struct simdev_stream *s, struct simdev_stream *target,
                                   uint64_t seq)
{
    struct simdev_op *w = simdev_op_new(SIMDEV_OP_WAIT_STREAM, "implicit stream wait");
    if (!w)
        return 0;
    w->wait_stream = target;
    w->wait_seq = seq;
    target->refs++;
    push_locked(s, w);
    return 1;
}

static int add_implicit_waits_locked(struct simdev_stream *s)
{
    struct simdev_device *d = &simdev_devices[s->device];
    if (s->role == SIMDEV_STREAM_LEGACY) {
        for (struct simdev_stream *t = d->streams; t; t = t->next_on_device) {
            if (t == s || (t->flags & cudaStreamNonBlocking) || t->completed >= t->enqueued)
                continue;
            if (!push_wait_stream_locked(s, t, t->enqueued))
                return 0;
        }
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        struct simdev_stream *l = d->legacy;
        if (l && l->completed < l->enqueued && s->legacy_waited < l->enqueued) {
            if (!push_wait_stream_locked(s, l, l->enqueued))
                return 0;
            s->legacy_waited = l->enqueued;
        }
    }
    return 1;
}

cudaError_t simdev_stream_submit_locked(cudaStream_t handle, int ptds, struct simdev_op *op,
                                        const struct simdev_fault_hit *hit,
                                        struct simdev_stream **stream_out, uint64_t *seq)
{
    if (!op)
        return cudaErrorMemoryAllocation;
    struct simdev_stream *s = NULL;
    cudaError_t err = simdev_stream_resolve_locked(handle, ptds, &s);
    if (err == cudaSuccess)
        err = simdev_devices[s->device].fatal;
    if (err == cudaSuccess && op->kind == SIMDEV_OP_RECORD_EVENT && op->event->device != s->device) {
        simdev_trace("event of device %d used on a stream of device %d", op->event->device,
                     s->device);
        err = cudaErrorInvalidResourceHandle;
    }
    if (err == cudaSuccess && s->capture) {
        /* A capturing stream records the op into its graph instead (graph.c). */
        if (seq)
            *seq = 0;
        return simdev_capture_add_locked(s, op, hit, stream_out != NULL);
    }
    if (err == cudaSuccess && !add_implicit_waits_locked(s))
        err = cudaErrorMemoryAllocation;
    if (err == cudaSuccess && hit && hit->kind == SIMDEV_FAULT_HANG) {
        struct simdev_op *h = simdev_op_new(SIMDEV_OP_HANG, "injected hang");
        if (h)
            push_locked(s, h);
    } else if (err == cudaSuccess && hit && hit->kind == SIMDEV_FAULT_SLOW) {
        struct simdev_op *dl = simdev_op_new(SIMDEV_OP_DELAY, "injected delay");
        if (dl) {
            dl->delay_ms = hit->delay_ms;
            push_locked(s, dl);
        }
    }
    if (err != cudaSuccess) {
        simdev_op_discard_locked(op);
        return err;
    }
    push_locked(s, op);
    if (seq)
        *seq = s->enqueued;
    if (stream_out) {
        s->refs++;
        *stream_out = s;
    }
    return cudaSuccess;
}

cudaError_t simdev_stream_submit(cudaStream_t handle, int ptds, struct simdev_op *op,
                                 const struct simdev_fault_hit *hit,
                                 struct simdev_stream **stream_out, uint64_t *seq)
{
    pthread_mutex_lock(&simdev_lock);
    cudaError_t err = simdev_stream_submit_locked(handle, ptds, op, hit, stream_out, seq);
    pthread_mutex_unlock(&simdev_lock);
    return err;
}

cudaError_t simdev_submit_call(cudaStream_t handle, int ptds, const char *name,
                               void (*fn)(void *), void *arg, void (*release)(void *),
                               const struct simdev_fault_hit *hit,
                               struct simdev_stream **stream_out, uint64_t *seq)
{
    struct simdev_op *op = simdev_op_new(SIMDEV_OP_CALL, name);
    if (!op) {
        if (release)
            release(arg);
        return cudaErrorMemoryAllocation;
    }
    op->fn = fn;
    op->arg = arg;
    op->release = release;
    return simdev_stream_submit(handle, ptds, op, hit, stream_out, seq);
}

cudaError_t simdev_stream_join(cudaStream_t waiter, cudaStream_t waitee, int ptds)
{
    pthread_mutex_lock(&simdev_lock);
    struct simdev_stream *w, *t;
    cudaError_t err = simdev_stream_resolve_locked(waiter, ptds, &w);
    if (err == cudaSuccess)
        err = simdev_stream_resolve_locked(waitee, ptds, &t);
    /* Inside a capture, the capture order already orders the streams' work. */
    if (err == cudaSuccess && w != t && t->completed < t->enqueued && !w->capture && !t->capture)
        if (!add_implicit_waits_locked(w) || !push_wait_stream_locked(w, t, t->enqueued))
            err = cudaErrorMemoryAllocation;
    pthread_mutex_unlock(&simdev_lock);
    return err;
}

/* ---- waiting ----------------------------------------------------------- */

cudaError_t simdev_stream_wait(struct simdev_stream *s, uint64_t seq)
{
    pthread_mutex_lock(&simdev_lock);
    while (s->completed < seq && simdev_devices[s->device].fatal == cudaSuccess)
        pthread_cond_wait(&simdev_progress, &simdev_lock);
    cudaError_t err = simdev_devices[s->device].fatal;
    pthread_mutex_unlock(&simdev_lock);
    return err;
}

cudaError_t simdev_device_synchronize(int device)
{
    pthread_mutex_lock(&simdev_lock);
    struct simdev_device *d = &simdev_devices[device];
    size_t n = 0;
    for (struct simdev_stream *s = d->streams; s; s = s->next_on_device)
        n++;
    struct { struct simdev_stream *s; uint64_t target; } *snap = calloc(n ? n : 1, sizeof *snap);
    if (!snap) {
        pthread_mutex_unlock(&simdev_lock);
        return cudaErrorMemoryAllocation;
    }
    size_t i = 0;
    for (struct simdev_stream *s = d->streams; s; s = s->next_on_device, i++) {
        snap[i].s = s;
        snap[i].target = s->enqueued;
        s->refs++;
    }
    for (i = 0; i < n; i++)
        while (snap[i].s->completed < snap[i].target && d->fatal == cudaSuccess)
            pthread_cond_wait(&simdev_progress, &simdev_lock);
    for (i = 0; i < n; i++)
        simdev_stream_unref_locked(snap[i].s);
    cudaError_t err = d->fatal;
    pthread_mutex_unlock(&simdev_lock);
    free(snap);
    return err;
}

void simdev_device_reset_streams(int device)
{
    pthread_mutex_lock(&simdev_lock);
    struct simdev_device *d = &simdev_devices[device];
    d->epoch++;
    for (struct simdev_stream *s = d->streams; s; s = s->next_on_device) {
        __atomic_store_n(&s->cancelled, 1, __ATOMIC_RELEASE);
        pthread_cond_signal(&s->wake);
    }
    /* Give up the handles: program streams, the legacy stream.  Per-thread
     * streams are let go by their threads (epoch check) or at thread exit. */
    struct simdev_stream *s = handles;
    while (s) {
        struct simdev_stream *next = s->next_handle;
        if (s->device == device)
            destroy_locked(s);
        s = next;
    }
    if (d->legacy) {
        struct simdev_stream *l = d->legacy;
        d->legacy = NULL;
        destroy_locked(l);
    }
    for (struct simdev_stream *p = d->streams; p; p = p->next_on_device)
        if (p->role == SIMDEV_STREAM_PER_THREAD && !p->destroyed) {
            p->destroyed = 1;       /* its thread keeps (and later drops) its reference */
            pthread_cond_signal(&p->wake);
        }
    pthread_cond_broadcast(&simdev_progress);
    while (d->streams)
        pthread_cond_wait(&simdev_progress, &simdev_lock);
    pthread_mutex_unlock(&simdev_lock);
}

/* ---- public stream API ------------------------------------------------- */

static cudaError_t create_stream(cudaStream_t *pStream, unsigned flags, int priority,
                                 const char *op)
{
    cudaError_t err = simdev_enter(op, NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return simdev_return(cudaErrorInvalidValue);
    if (priority > 0)
        priority = 0;
    if (priority < -5)
        priority = -5;
    pthread_mutex_lock(&simdev_lock);
    struct simdev_stream *s = create_locked(simdev_current_device(), SIMDEV_STREAM_USER, flags,
                                            priority);
    pthread_mutex_unlock(&simdev_lock);
    if (!s)
        return simdev_return(cudaErrorMemoryAllocation);
    *pStream = (cudaStream_t)s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return create_stream(pStream, cudaStreamDefault, 0, "cudaStreamCreate");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    return create_stream(pStream, flags, 0, "cudaStreamCreateWithFlags");
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority)
{
    return create_stream(pStream, flags, priority, "cudaStreamCreateWithPriority");
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    cudaError_t err = simdev_enter("cudaStreamDestroy", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (stream == 0 || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
        return simdev_return(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_stream *s;
    err = simdev_stream_resolve_locked(stream, 0, &s);
    if (err == cudaSuccess)
        destroy_locked(s);
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t simdev_stream_synchronize(cudaStream_t stream, int ptds)
{
    cudaError_t err = simdev_enter("cudaStreamSynchronize", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_stream *s;
    err = simdev_stream_resolve_locked(stream, ptds, &s);
    uint64_t target = 0;
    if (err == cudaSuccess && s->capture) {
        simdev_capture_invalidate_locked(s->capture);   /* forbidden during capture */
        err = cudaErrorStreamCaptureUnsupported;
    }
    if (err == cudaSuccess) {
        s->refs++;
        target = s->enqueued;
    }
    pthread_mutex_unlock(&simdev_lock);
    if (err != cudaSuccess)
        return simdev_return(err);
    err = simdev_stream_wait(s, target);
    simdev_stream_unref(s);
    return simdev_return(err);
}

cudaError_t simdev_stream_query(cudaStream_t stream, int ptds)
{
    cudaError_t err = simdev_enter("cudaStreamQuery", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_stream *s;
    err = simdev_stream_resolve_locked(stream, ptds, &s);
    if (err == cudaSuccess && s->capture) {
        simdev_capture_invalidate_locked(s->capture);   /* forbidden during capture */
        err = cudaErrorStreamCaptureUnsupported;
    } else if (err == cudaSuccess) {
        err = simdev_devices[s->device].fatal;
        if (err == cudaSuccess && s->completed < s->enqueued)
            err = cudaErrorNotReady;
    }
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

static cudaError_t with_stream(cudaStream_t stream, int ptds, const char *op,
                               struct simdev_stream *copy)
{
    cudaError_t err = simdev_enter(op, NULL);
    if (err != cudaSuccess)
        return err;
    pthread_mutex_lock(&simdev_lock);
    struct simdev_stream *s;
    err = simdev_stream_resolve_locked(stream, ptds, &s);
    if (err == cudaSuccess)
        *copy = *s;
    pthread_mutex_unlock(&simdev_lock);
    return err;
}

cudaError_t simdev_stream_get_flags(cudaStream_t stream, int ptds, unsigned int *flags)
{
    struct simdev_stream s;
    cudaError_t err = with_stream(stream, ptds, "cudaStreamGetFlags", &s);
    if (err == cudaSuccess && !flags)
        err = cudaErrorInvalidValue;
    if (err == cudaSuccess)
        *flags = s.flags;
    return simdev_return(err);
}

cudaError_t simdev_stream_get_priority(cudaStream_t stream, int ptds, int *priority)
{
    struct simdev_stream s;
    cudaError_t err = with_stream(stream, ptds, "cudaStreamGetPriority", &s);
    if (err == cudaSuccess && !priority)
        err = cudaErrorInvalidValue;
    if (err == cudaSuccess)
        *priority = s.priority;
    return simdev_return(err);
}

cudaError_t simdev_stream_get_device(cudaStream_t stream, int ptds, int *device)
{
    struct simdev_stream s;
    cudaError_t err = with_stream(stream, ptds, "cudaStreamGetDevice", &s);
    if (err == cudaSuccess && !device)
        err = cudaErrorInvalidValue;
    if (err == cudaSuccess)
        *device = s.device;
    return simdev_return(err);
}

cudaError_t simdev_stream_get_id(cudaStream_t stream, int ptds, unsigned long long *id)
{
    struct simdev_stream s;
    cudaError_t err = with_stream(stream, ptds, "cudaStreamGetId", &s);
    if (err == cudaSuccess && !id)
        err = cudaErrorInvalidValue;
    if (err == cudaSuccess)
        *id = s.id;
    return simdev_return(err);
}

cudaError_t simdev_stream_is_capturing(cudaStream_t stream, int ptds,
                                       enum cudaStreamCaptureStatus *status)
{
    return simdev_stream_capture_info(stream, ptds, status, NULL, NULL, NULL, NULL, NULL,
                                      "cudaStreamIsCapturing");
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return simdev_stream_synchronize(stream, 0);
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return simdev_stream_query(stream, 0);
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags)
{
    return simdev_stream_get_flags(hStream, 0, flags);
}

cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
    return simdev_stream_get_priority(hStream, 0, priority);
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
    return simdev_stream_get_device(hStream, 0, device);
}

cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long *streamId)
{
    return simdev_stream_get_id(hStream, 0, streamId);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
    return simdev_stream_is_capturing(stream, 0, pCaptureStatus);
}
