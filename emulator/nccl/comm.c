/* comm.c -- communicator life cycle: init (blocking, non-blocking, inside a
 * group, all-in-one-process), abort, finalize, destroy, and the queries.
 *
 * Semantics kept from NCCL, because the checkpointing machinery relies on
 * them:
 *   - ncclCommInitRank returns once all nranks have joined;
 *   - ncclCommAbort returns promptly even while an operation of the
 *     communicator is stuck waiting for a peer, and that operation then ends
 *     (its stream moves on); peers that wait for the aborted rank see
 *     ncclRemoteError from ncclCommGetAsyncError but stay stuck until they
 *     abort too;
 *   - ncclCommDestroy and ncclCommFinalize wait for the communicator's queued
 *     operations, so on a hung communicator they hang (use abort);
 *   - a peer process that dies turns into ncclRemoteError on the ranks that
 *     wait for it. */

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct ncclComm *comm_check(ncclComm_t comm, const char *api, ncclResult_t *err)
{
    struct ncclComm *c = comm;
    if (!c || c->magic != COMM_MAGIC) {
        *err = report_error(ncclInvalidArgument, "%s: comm %p is not a live communicator", api,
                          (void *)comm);
        return NULL;
    }
    if (__atomic_load_n(&c->user_released, __ATOMIC_ACQUIRE)) {
        *err = report_error(ncclInvalidArgument, "%s: comm %p was already destroyed or aborted",
                          api, (void *)comm);
        return NULL;
    }
    *err = ncclSuccess;
    return c;
}

void comm_ref(struct ncclComm *c)
{
    pthread_mutex_lock(&c->lock);
    c->refs++;
    pthread_mutex_unlock(&c->lock);
}

void comm_unref(struct ncclComm *c)
{
    pthread_mutex_lock(&c->lock);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (!last)
        return;
    seg_unmap(&c->seg);
    c->magic = 0;
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->exec_lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

int comm_should_stop(struct ncclComm *c)
{
    return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE) || jitckpt_simdev_worker_should_stop();
}

void comm_set_async_error(struct ncclComm *c, ncclResult_t err, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int expect = ncclSuccess;
    if (__atomic_compare_exchange_n(&c->async_error, &expect, (int)err, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        report_error(err, "rank %d: %s", c->rank, msg);
}

/* A peer is gone if its pid no longer exists or is a zombie (its parent has
 * not reaped it yet, as a test harness or launcher often has not). */
static int process_gone(int32_t pid)
{
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close = strrchr(buf, ')');      /* the command name may contain spaces */
    return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

void comm_watch_peers(struct ncclComm *c, uint64_t *last_check_ns,
                      int (*waiting_on)(void *ctx, int rank), void *ctx)
{
    uint64_t now = now_ns();
    if (now - *last_check_ns < 250000000ull)
        return;
    *last_check_ns = now;
    for (int r = 0; r < c->nranks; r++) {
        if (r == c->rank || !waiting_on(ctx, r))
            continue;
        int bit = 1 << (r % 32);
        if (c->peer_reported[r / 32] & bit)
            continue;
        int32_t pid = __atomic_load_n(&c->seg.ranks[r].pid, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&c->seg.ranks[r].aborted, __ATOMIC_ACQUIRE)) {
            c->peer_reported[r / 32] |= bit;
            comm_set_async_error(c, ncclRemoteError, "peer rank %d aborted its communicator "
                                 "while this rank waits for it", r);
        } else if (pid > 0 && process_gone(pid)) {
            c->peer_reported[r / 32] |= bit;
            comm_set_async_error(c, ncclRemoteError, "peer rank %d (pid %d) exited while this "
                                 "rank waits for it", r, pid);
        }
    }
}

/* ---- init ---------------------------------------------------------------- */

static struct ncclComm *comm_new(int nranks, int rank, int device)
{
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->magic = COMM_MAGIC;
    c->nranks = nranks;
    c->rank = rank;
    c->device = device;
    c->refs = 1;
    c->blocking = 1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->exec_lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    return c;
}

ncclResult_t comm_finish_init(struct ncclComm *c)
{
    ncclResult_t err = seg_wait_all_joined(c);
    __atomic_store_n(&c->joined_all, err == ncclSuccess, __ATOMIC_RELEASE);
    __atomic_store_n(&c->async_error, (int)err, __ATOMIC_RELEASE);
    return err;
}

static void *init_thread_main(void *arg)
{
    comm_finish_init(arg);
    return NULL;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank,
                              int device, int blocking, const char *api)
{
    if (!comm)
        return report_error(ncclInvalidArgument, "%s: comm pointer is NULL", api);
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS)
        return report_error(ncclInvalidArgument, "%s: nranks=%d is not in [1, %d]", api, nranks,
                          MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return report_error(ncclInvalidArgument, "%s: rank=%d is not in [0, %d)", api, rank, nranks);
    if (jitckpt_simdev_device_error(device) != cudaSuccess)
        return report_error(ncclUnhandledCudaError, "%s: device %d is in an error state (cuda "
                          "error %d)", api, device, (int)jitckpt_simdev_device_error(device));
    struct ncclComm *c = comm_new(nranks, rank, device);
    if (!c)
        return report_error(ncclSystemError, "%s: out of memory", api);
    c->blocking = blocking;
    ncclResult_t err = seg_join(c, id);
    if (err != ncclSuccess) {
        comm_unref(c);
        return err;
    }
    *comm = c;
    if (group_depth() > 0) {
        __atomic_store_n(&c->async_error, (int)ncclInProgress, __ATOMIC_RELEASE);
        return group_defer_init(c);
    }
    if (!blocking) {
        __atomic_store_n(&c->async_error, (int)ncclInProgress, __ATOMIC_RELEASE);
        if (pthread_create(&c->init_thread, NULL, init_thread_main, c) != 0) {
            *comm = NULL;
            comm_unref(c);
            return report_error(ncclSystemError, "%s: cannot start the init thread", api);
        }
        c->init_thread_started = 1;
        return ncclInProgress;
    }
    err = comm_finish_init(c);
    if (err != ncclSuccess) {
        *comm = NULL;
        seg_mark_aborted(c);
        comm_unref(c);
    }
    return err;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_rank(comm, nranks, &commId, rank, jitckpt_simdev_current_device(), 1,
                     "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    int blocking = 1;
    if (config) {
        if (config->magic != NCCL_API_MAGIC || config->size < offsetof(ncclConfig_t, cgaClusterSize))
            return report_error(ncclInvalidArgument, "ncclCommInitRankConfig: config was not "
                              "initialised with NCCL_CONFIG_INITIALIZER");
        if (config->blocking != NCCL_CONFIG_UNDEF_INT)
            blocking = config->blocking != 0;
    }
    return init_rank(comm, nranks, &commId, rank, jitckpt_simdev_current_device(), blocking,
                     "ncclCommInitRankConfig");
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1)
        return report_error(ncclInvalidArgument, "ncclCommInitAll: comms=%p ndev=%d", (void *)comms,
                          ndev);
    ncclUniqueId id;
    ncclResult_t err = ncclGetUniqueId(&id);
    if (err != ncclSuccess)
        return err;
    err = ncclGroupStart();
    for (int i = 0; i < ndev && err == ncclSuccess; i++)
        err = init_rank(&comms[i], ndev, &id, i, devlist ? devlist[i] : i, 1, "ncclCommInitAll");
    ncclResult_t end = ncclGroupEnd();
    return err != ncclSuccess ? err : end;
}

/* ---- teardown ------------------------------------------------------------ */

static void join_init_thread(struct ncclComm *c)
{
    if (c->init_thread_started) {
        pthread_join(c->init_thread, NULL);
        c->init_thread_started = 0;
    }
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclCommAbort", &err);
    if (!c)
        return err;
    __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&c->user_released, 1, __ATOMIC_RELEASE);
    seg_mark_aborted(c);
    join_init_thread(c);
    /* Operations running now notice the abort within one futex timeout;
     * queued ones will skip their work. */
    pthread_mutex_lock(&c->lock);
    while (c->running > 0)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
    comm_unref(c);
    return ncclSuccess;
}

static ncclResult_t wait_pending(struct ncclComm *c)
{
    pthread_mutex_lock(&c->lock);
    while (c->pending > 0)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
    return device_result(c->device);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclCommFinalize", &err);
    if (!c)
        return err;
    join_init_thread(c);
    err = wait_pending(c);
    c->finalized = 1;
    return err;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclCommDestroy", &err);
    if (!c)
        return err;
    join_init_thread(c);
    wait_pending(c);
    __atomic_store_n(&c->user_released, 1, __ATOMIC_RELEASE);
    comm_unref(c);
    return ncclSuccess;
}

/* ---- queries ------------------------------------------------------------- */

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclCommGetAsyncError", &err);
    if (!c)
        return err;
    if (!asyncError)
        return report_error(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    ncclResult_t e = (ncclResult_t)__atomic_load_n(&c->async_error, __ATOMIC_ACQUIRE);
    if (e == ncclSuccess)
        e = device_result(c->device);
    *asyncError = e;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclCommCount", &err);
    if (!c)
        return err;
    if (!count)
        return report_error(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclCommUserRank", &err);
    if (!c)
        return err;
    if (!rank)
        return report_error(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclCommCuDevice", &err);
    if (!c)
        return err;
    if (!device)
        return report_error(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = c->device;
    return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return report_error(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return report_error(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    cudaError_t e = jitckpt_simdev_malloc(ptr, size);
    if (e != cudaSuccess)
        return report_error(ncclUnhandledCudaError, "ncclMemAlloc(%zu): cuda error %d", size,
                          (int)e);
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr)
{
    cudaError_t e = jitckpt_simdev_free(ptr);
    if (e != cudaSuccess)
        return report_error(ncclUnhandledCudaError, "ncclMemFree(%p): cuda error %d", ptr, (int)e);
    return ncclSuccess;
}

/* ---- custom reduction ops ------------------------------------------------ */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclRedOpCreatePreMulSum", &err);
    if (!c)
        return err;
    if (!op || !scalar || !dtype_reducible(datatype) ||
        (residence != ncclScalarDevice && residence != ncclScalarHostImmediate))
        return report_error(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: bad op, scalar, "
                          "datatype %d or residence %d", (int)datatype, (int)residence);
    pthread_mutex_lock(&c->lock);
    int slot = -1;
    for (int i = 0; i < MAX_CUSTOM_OPS && slot < 0; i++)
        if (!c->custom[i].used)
            slot = i;
    if (slot >= 0) {
        struct custom_op *o = &c->custom[slot];
        o->used = 1;
        o->dtype = datatype;
        o->residence = residence;
        if (residence == ncclScalarHostImmediate)
            memcpy(o->scalar, scalar, dtype_size(datatype));
        else
            o->device_scalar = scalar;
    }
    pthread_mutex_unlock(&c->lock);
    if (slot < 0)
        return report_error(ncclInvalidUsage, "ncclRedOpCreatePreMulSum: more than %d live custom "
                          "ops", MAX_CUSTOM_OPS);
    *op = (ncclRedOp_t)(ncclNumOps + slot);
    return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, "ncclRedOpDestroy", &err);
    if (!c)
        return err;
    int slot = (int)op - ncclNumOps;
    if (slot < 0 || slot >= MAX_CUSTOM_OPS || !c->custom[slot].used)
        return report_error(ncclInvalidArgument, "ncclRedOpDestroy: op %d was not created on this "
                          "communicator", (int)op);
    pthread_mutex_lock(&c->lock);
    c->custom[slot].used = 0;
    pthread_mutex_unlock(&c->lock);
    return ncclSuccess;
}
