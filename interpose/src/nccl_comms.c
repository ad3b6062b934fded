/* nccl_comms.c -- the communicators the application uses, and their
 * asynchronous errors.
 *
 * A failed peer does not always make a collective hang: NCCL may notice it
 * first (a closed connection, a peer that aborted) and report it through
 * ncclCommGetAsyncError, as ncclRemoteError or another error, while the
 * collective stays stuck on the stream.  The watchdog (watchdog.c) polls the
 * asynchronous error of every communicator seen here and turns anything but
 * ncclSuccess or ncclInProgress into a JIT event with reason
 * JITCKPT_INTERPOSE_NCCL_ERROR, without waiting for the hang timeout.
 *
 * Every intercepted collective or point-to-point call passes its comm to
 * nccl_comm_note() (interpose.h): one lock-free scan of a handle set
 * (handle_set.c), as for the NCCL streams.  The first new comm starts the
 * watchdog.  ncclCommDestroy and ncclCommAbort remove their comm under the
 * set's lock *before* the call is forwarded, and the watchdog polls under the
 * same lock, so the watchdog never polls a freed communicator.  A communicator the
 * application aborts itself is therefore never reported. */

#define _GNU_SOURCE
#include <stdio.h>

#include "interpose.h"

#define NCCL_COMMS_MAX 64

static _Atomic(uintptr_t) comm_items[NCCL_COMMS_MAX];
/* Taken by additions, removals and the watchdog's whole poll. */
static pthread_mutex_t comms_lock = PTHREAD_MUTEX_INITIALIZER;
struct handle_set nccl_comms = HANDLE_SET(comm_items, &comms_lock, "NCCL communicators");

void nccl_comm_added(void)
{
    count(&counters.nccl_comms);
    watchdog_start_once();
}

void nccl_comm_forget(ncclComm_t comm)
{
    if (comm != NULL)
        handle_set_remove(&nccl_comms, (uintptr_t)comm);
}

static const char *result_name(ncclResult_t r)
{
    static const char *const names[] = {
        "ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
        "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress",
    };
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "an unknown ncclResult_t";
}

void nccl_comm_scan(struct watch_verdict *v)
{
    __typeof__(ncclCommGetAsyncError) *get_error = forward_fn(&next_ncclCommGetAsyncError);
    if (get_error == NULL || atomic_load_explicit(&nccl_comms.count, memory_order_acquire) == 0)
        return;
    pthread_mutex_lock(&comms_lock);
    int n = atomic_load(&nccl_comms.count);
    for (int i = 0; i < n && v->reason == 0; i++) {
        uintptr_t comm = atomic_load(&comm_items[i]);
        if (comm == 0)
            continue;
        ncclResult_t async = ncclSuccess;
        if (get_error((ncclComm_t)comm, &async) != ncclSuccess || async == ncclSuccess ||
            async == ncclInProgress)
            continue;
        __typeof__(ncclGetErrorString) *text = forward_fn(&next_ncclGetErrorString);
        __typeof__(ncclGetLastError) *last = forward_fn(&next_ncclGetLastError);
        const char *why = text != NULL ? text(async) : NULL;
        const char *message = last != NULL ? last((ncclComm_t)comm) : NULL;
        v->reason = JITCKPT_INTERPOSE_NCCL_ERROR;
        snprintf(v->detail, sizeof v->detail,
                 "ncclCommGetAsyncError(comm %p) returned %s (%d)%s%s%s%s", (void *)comm,
                 result_name(async), (int)async, why ? ": " : "", why ? why : "",
                 message && *message ? "; last NCCL error: " : "",
                 message && *message ? message : "");
    }
    pthread_mutex_unlock(&comms_lock);
}
