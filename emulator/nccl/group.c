/* group.c -- ncclGroupStart/ncclGroupEnd and turning tasks into stream work.
 *
 * Outside a group every call is a group of one.  At the outermost
 * ncclGroupEnd the deferred communicator inits of the group finish first
 * (every rank of them has joined by then, which is what makes
 * ncclCommInitAll and grouped ncclCommInitRank work from one thread), then
 * the group's tasks become one stream op per communicator: its collectives
 * in issue order, then all its sends and receives progressing together.
 * The op runs on the stream of the communicator's first task; other streams
 * used for the same communicator in the group are joined before and after,
 * so each of them waits for the whole group, as in NCCL. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static __thread int depth;
static __thread struct task *pending_tasks;
static __thread int npending, cap_pending;
static __thread struct ncclComm **deferred;
static __thread int ndeferred, cap_deferred;

struct group_op {
    struct ncclComm *comm;
    const char *api;
    int hang;
    unsigned delay_ms;
    int ncoll, np2p;
    struct coll_task *colls;
    struct p2p_task *p2ps;
};

int group_depth(void)
{
    return depth;
}

static void nap_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static void run_group(void *arg)
{
    struct group_op *g = arg;
    struct ncclComm *c = g->comm;
    pthread_mutex_lock(&c->lock);
    c->running++;
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&c->exec_lock);

    for (unsigned waited = 0; waited < g->delay_ms && !comm_should_stop(c); waited += 20)
        nap_ms(g->delay_ms - waited < 20 ? g->delay_ms - waited : 20);
    if (g->hang) {
        /* An injected hang: this rank never arrives; only an abort of the
         * communicator (or a device reset or failure) ends the op. */
        while (!comm_should_stop(c))
            nap_ms(20);
    } else {
        ncclResult_t r = ncclSuccess;
        for (int i = 0; i < g->ncoll && r == ncclSuccess && !comm_should_stop(c); i++)
            r = run_collective(c, &g->colls[i]);
        if (r == ncclSuccess && g->np2p && !comm_should_stop(c))
            run_p2p(c, g->p2ps, g->np2p);
    }

    pthread_mutex_unlock(&c->exec_lock);
    pthread_mutex_lock(&c->lock);
    c->running--;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

static void release_group(void *arg)
{
    struct group_op *g = arg;
    struct ncclComm *c = g->comm;
    pthread_mutex_lock(&c->lock);
    c->pending--;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    comm_unref(c);
    free(g->colls);
    free(g->p2ps);
    free(g);
}

static ncclResult_t submit_comm(struct task *tasks, int n, struct ncclComm *c)
{
    struct group_op *g = calloc(1, sizeof *g);
    if (!g)
        return report_error(ncclSystemError, "out of memory");
    g->comm = c;
    g->colls = calloc((size_t)n, sizeof *g->colls);
    g->p2ps = calloc((size_t)n, sizeof *g->p2ps);
    if (!g->colls || !g->p2ps) {
        free(g->colls);
        free(g->p2ps);
        free(g);
        return report_error(ncclSystemError, "out of memory");
    }
    cudaStream_t stream = NULL;
    int first = 1;
    for (int i = 0; i < n; i++) {
        struct task *t = &tasks[i];
        if (t->comm != c)
            continue;
        if (first) {
            stream = t->stream;
            g->api = t->is_p2p ? (t->p2p.is_send ? "ncclSend" : "ncclRecv") : t->coll.api;
            first = 0;
        }
        g->hang |= t->hang;
        if (t->delay_ms > g->delay_ms)
            g->delay_ms = t->delay_ms;
        if (t->is_p2p)
            g->p2ps[g->np2p++] = t->p2p;
        else
            g->colls[g->ncoll++] = t->coll;
    }
    if (g->ncoll + g->np2p > 1)
        g->api = "ncclGroupEnd";
    for (int i = 0; i < n; i++)
        if (tasks[i].comm == c && tasks[i].stream != stream)
            jitckpt_simdev_stream_join(stream, tasks[i].stream);

    pthread_mutex_lock(&c->lock);
    c->refs++;
    c->pending++;
    pthread_mutex_unlock(&c->lock);
    const char *api = g->api;
    /* On failure the enqueue calls release_group, which undoes the above. */
    cudaError_t e = jitckpt_simdev_enqueue(stream, api, run_group, g, release_group);
    if (e != cudaSuccess)
        return report_error(e == cudaErrorInvalidResourceHandle ? ncclInvalidArgument
                                                              : ncclUnhandledCudaError,
                          "%s: cannot queue work on stream %p (cuda error %d)", api,
                          (void *)stream, (int)e);
    for (int i = 0; i < n; i++)
        if (tasks[i].comm == c && tasks[i].stream != stream)
            jitckpt_simdev_stream_join(tasks[i].stream, stream);
    return ncclSuccess;
}

static ncclResult_t submit(struct task *tasks, int n)
{
    ncclResult_t result = ncclSuccess;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < i && !seen; k++)
            seen = tasks[k].comm == tasks[i].comm;
        if (seen)
            continue;
        ncclResult_t r = submit_comm(tasks, n, tasks[i].comm);
        if (result == ncclSuccess)
            result = r;
    }
    return result;
}

ncclResult_t group_add(struct task *t)
{
    if (depth == 0)
        return submit(t, 1);
    if (npending == cap_pending) {
        int nc = cap_pending ? cap_pending * 2 : 16;
        struct task *nt = realloc(pending_tasks, (size_t)nc * sizeof *nt);
        if (!nt)
            return report_error(ncclSystemError, "out of memory");
        pending_tasks = nt;
        cap_pending = nc;
    }
    pending_tasks[npending++] = *t;
    return ncclSuccess;
}

ncclResult_t group_defer_init(struct ncclComm *c)
{
    if (ndeferred == cap_deferred) {
        int nc = cap_deferred ? cap_deferred * 2 : 8;
        struct ncclComm **nd = realloc(deferred, (size_t)nc * sizeof *nd);
        if (!nd)
            return report_error(ncclSystemError, "out of memory");
        deferred = nd;
        cap_deferred = nc;
    }
    deferred[ndeferred++] = c;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (depth == 0)
        return report_error(ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
    if (--depth > 0)
        return ncclSuccess;
    ncclResult_t result = ncclSuccess;
    for (int i = 0; i < ndeferred; i++) {
        ncclResult_t r = comm_finish_init(deferred[i]);
        if (result == ncclSuccess)
            result = r;
    }
    ndeferred = 0;
    if (result == ncclSuccess)
        result = submit(pending_tasks, npending);
    npending = 0;
    return result;
}

ncclResult_t fault_at_call(struct ncclComm *c, const char *api, struct task *t)
{
    if (device_result(c->device) != ncclSuccess)
        return ncclUnhandledCudaError;
    unsigned delay = 0;
    char why[160];
    switch (jitckpt_simdev_fault(api, c->rank, &delay)) {
    case JITCKPT_SIMDEV_FAULT_STICKY:
        snprintf(why, sizeof why, "injected sticky fault at %s (rank %d)", api, c->rank);
        jitckpt_simdev_raise(c->device, cudaErrorIllegalAddress, why);
        comm_set_async_error(c, ncclUnhandledCudaError, "%s", why);
        return ncclUnhandledCudaError;
    case JITCKPT_SIMDEV_FAULT_LOST:
        snprintf(why, sizeof why, "injected lost-device fault at %s (rank %d)", api, c->rank);
        jitckpt_simdev_raise(c->device, cudaErrorDevicesUnavailable, why);
        comm_set_async_error(c, ncclUnhandledCudaError, "%s", why);
        return ncclUnhandledCudaError;
    case JITCKPT_SIMDEV_FAULT_HANG:
        t->hang = 1;
        break;
    case JITCKPT_SIMDEV_FAULT_SLOW:
        t->delay_ms = delay;
        break;
    default:
        break;
    }
    return ncclSuccess;
}
