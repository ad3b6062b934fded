/* event.c -- events: markers recorded into a stream that complete when the
 * stream reaches them.
 *
 * An event counts its records (recorded) and the records the device has
 * reached (done).  cudaEventQuery is "done == recorded", so a query after a
 * record on a stalled stream stays cudaErrorNotReady for as long as the stream
 * is stalled, which is what a hang watchdog polls.  The time of the latest
 * completed record (CLOCK_MONOTONIC) feeds cudaEventElapsedTime. */

#include <stdlib.h>

#include "simdev.h"

static struct simdev_event *handles;

static struct simdev_event *resolve_locked(cudaEvent_t handle)
{
    for (struct simdev_event *e = handles; e; e = e->next_handle)
        if ((cudaEvent_t)e == handle)
            return e;
    simdev_trace("event handle %p is not a live event", (void *)handle);
    return NULL;
}

void simdev_event_unref_locked(struct simdev_event *e)
{
    if (--e->refs == 0)
        free(e);
}

static void destroy_locked(struct simdev_event *e)
{
    if (e->destroyed)
        return;
    e->destroyed = 1;
    for (struct simdev_event **pp = &handles; *pp; pp = &(*pp)->next_handle)
        if (*pp == e) {
            *pp = e->next_handle;
            break;
        }
    simdev_event_unref_locked(e);
}

/* An event last recorded in a capturing stream is a graph node: it cannot be
 * queried or waited for on the host, and trying invalidates its capture. */
static cudaError_t captured_event_locked(struct simdev_event *e, const char *op)
{
    simdev_trace("%s on event %p, last recorded in capture sequence %llu", op, (void *)e,
                 e->captured_id);
    simdev_capture_invalidate_id_locked(e->captured_id);
    return cudaErrorCapturedEvent;
}

void simdev_event_complete_locked(struct simdev_event *e, uint64_t gen)
{
    if (gen > e->done) {
        e->done = gen;
        clock_gettime(CLOCK_MONOTONIC, &e->when);
    }
    pthread_cond_broadcast(&simdev_progress);
}

void simdev_event_reset_device(int device)
{
    pthread_mutex_lock(&simdev_lock);
    struct simdev_event *e = handles;
    while (e) {
        struct simdev_event *next = e->next_handle;
        if (e->device == device)
            destroy_locked(e);
        e = next;
    }
    pthread_mutex_unlock(&simdev_lock);
}

static cudaError_t create(cudaEvent_t *event, unsigned flags, const char *op)
{
    cudaError_t err = simdev_enter(op, NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!event || (flags & ~known))
        return simdev_return(cudaErrorInvalidValue);
    if (flags & cudaEventInterprocess) {
        simdev_trace("interprocess events are not emulated");
        return simdev_return(cudaErrorNotSupported);
    }
    struct simdev_event *e = calloc(1, sizeof *e);
    if (!e)
        return simdev_return(cudaErrorMemoryAllocation);
    e->device = simdev_current_device();
    e->flags = flags;
    e->refs = 1;
    pthread_mutex_lock(&simdev_lock);
    e->next_handle = handles;
    handles = e;
    pthread_mutex_unlock(&simdev_lock);
    *event = (cudaEvent_t)e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return create(event, cudaEventDefault, "cudaEventCreate");
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    return create(event, flags, "cudaEventCreateWithFlags");
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    cudaError_t err = simdev_enter("cudaEventDestroy", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_event *e = resolve_locked(event);
    if (e)
        destroy_locked(e);
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(e ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

cudaError_t simdev_event_record(cudaEvent_t event, cudaStream_t stream, int ptds, unsigned flags)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter(flags ? "cudaEventRecordWithFlags" : "cudaEventRecord", &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (flags & ~(unsigned)cudaEventRecordExternal)
        return simdev_return(cudaErrorInvalidValue);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_event *e = resolve_locked(event);
    if (!e) {
        pthread_mutex_unlock(&simdev_lock);
        return simdev_return(cudaErrorInvalidResourceHandle);
    }
    /* On a capturing stream the record becomes a node of the graph (graph.c):
     * the event is then a captured event, not a marker on a stream. */
    struct simdev_stream *s = NULL;
    unsigned long long captured = 0;
    if (simdev_stream_resolve_locked(stream, ptds, &s) == cudaSuccess)
        captured = simdev_capture_id_locked(s->capture);
    struct simdev_op *op = simdev_op_new(SIMDEV_OP_RECORD_EVENT, "cudaEventRecord");
    if (op) {
        op->event = e;
        op->event_gen = e->recorded + 1;
        e->refs++;
    }
    err = simdev_stream_submit_locked(stream, ptds, op, &hit, NULL, NULL);
    if (err == cudaSuccess && captured) {
        e->captured_id = captured;
    } else if (err == cudaSuccess) {
        e->recorded++;
        e->captured_id = 0;
    }
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return simdev_event_record(event, stream, 0, 0);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    return simdev_event_record(event, stream, 0, flags);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    cudaError_t err = simdev_enter("cudaEventQuery", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_event *e = resolve_locked(event);
    if (!e)
        err = cudaErrorInvalidResourceHandle;
    else if (e->captured_id)
        err = captured_event_locked(e, "cudaEventQuery");
    else if ((err = simdev_devices[e->device].fatal) == cudaSuccess && e->done < e->recorded)
        err = cudaErrorNotReady;
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    cudaError_t err = simdev_enter("cudaEventSynchronize", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_event *e = resolve_locked(event);
    if (!e || e->captured_id) {
        err = e ? captured_event_locked(e, "cudaEventSynchronize") : cudaErrorInvalidResourceHandle;
        pthread_mutex_unlock(&simdev_lock);
        return simdev_return(err);
    }
    e->refs++;
    uint64_t target = e->recorded;
    while (e->done < target && simdev_devices[e->device].fatal == cudaSuccess)
        pthread_cond_wait(&simdev_progress, &simdev_lock);
    err = simdev_devices[e->device].fatal;
    simdev_event_unref_locked(e);
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    cudaError_t err = simdev_enter("cudaEventElapsedTime", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!ms)
        return simdev_return(cudaErrorInvalidValue);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_event *a = resolve_locked(start), *b = resolve_locked(end);
    if (!a || !b)
        err = cudaErrorInvalidResourceHandle;
    else if ((a->flags | b->flags) & cudaEventDisableTiming)
        err = cudaErrorInvalidResourceHandle;
    else if (a->recorded == 0 || b->recorded == 0)
        err = cudaErrorInvalidResourceHandle;
    else if (a->done < a->recorded || b->done < b->recorded)
        err = cudaErrorNotReady;
    else
        *ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
                      (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t simdev_stream_wait_event(cudaStream_t stream, cudaEvent_t event, int ptds,
                                     unsigned flags)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter("cudaStreamWaitEvent", &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (flags & ~(unsigned)cudaEventWaitExternal)
        return simdev_return(cudaErrorInvalidValue);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_event *e = resolve_locked(event);
    if (!e) {
        pthread_mutex_unlock(&simdev_lock);
        return simdev_return(cudaErrorInvalidResourceHandle);
    }
    struct simdev_stream *s;
    err = simdev_stream_resolve_locked(stream, ptds, &s);
    if (err == cudaSuccess && e->captured_id) {
        /* Waiting for a node of a capture: the stream joins that capture. */
        err = simdev_capture_join_locked(s, e->captured_id);
    } else if (err == cudaSuccess && s->capture) {
        /* A capture may not depend on unfinished work outside it. */
        if (e->done < e->recorded) {
            simdev_capture_invalidate_locked(s->capture);
            err = cudaErrorStreamCaptureIsolation;
        }
    } else if (err == cudaSuccess && e->done < e->recorded) {
        /* Events may be waited on from any device's stream. */
        struct simdev_op *op = simdev_op_new(SIMDEV_OP_WAIT_EVENT, "cudaStreamWaitEvent");
        if (op) {
            op->event = e;
            op->event_gen = e->recorded;
            e->refs++;
        }
        err = simdev_stream_submit_locked(stream, ptds, op, &hit, NULL, NULL);
    }
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    return simdev_stream_wait_event(stream, event, 0, flags);
}
