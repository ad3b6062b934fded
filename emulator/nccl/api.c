/* api.c -- the collective and point-to-point entry points: argument checks
 * with messages that say what is wrong, fault injection, then a task for the
 * current group.
 *
 * Buffers must be memory of the emulated device (cudaMalloc and friends,
 * pinned or managed memory); a pageable host pointer is rejected with
 * ncclInvalidArgument, as real NCCL rejects pointers it cannot use. */

#include <string.h>

#include "internal.h"

static int reduces(enum coll_kind k)
{
    return k == COLL_ALLREDUCE || k == COLL_REDUCE || k == COLL_REDUCESCATTER;
}

static int has_root(enum coll_kind k)
{
    return k == COLL_BROADCAST || k == COLL_REDUCE || k == COLL_GATHER || k == COLL_SCATTER;
}

static ncclResult_t check_buffer(const char *api, const char *what, const void *p, size_t bytes)
{
    if (bytes == 0)
        return ncclSuccess;
    if (jitckpt_simdev_check_range(p, 1) != cudaSuccess)
        return report_error(ncclInvalidArgument, "%s: %s %p is not memory of the emulated device "
                          "(allocate it with cudaMalloc)", api, what, p);
    if (jitckpt_simdev_check_range(p, bytes) != cudaSuccess)
        return report_error(ncclInvalidArgument, "%s: %s %p: %zu bytes run past the end of its "
                          "allocation", api, what, p, bytes);
    return ncclSuccess;
}

static ncclResult_t usable(struct ncclComm *c, const char *api)
{
    if (!__atomic_load_n(&c->joined_all, __ATOMIC_ACQUIRE) && group_depth() == 0)
        return report_error(ncclInvalidUsage, "%s: communicator initialisation has not completed "
                          "(poll ncclCommGetAsyncError until it is not ncclInProgress)", api);
    if (device_result(c->device) != ncclSuccess)
        return ncclUnhandledCudaError;
    return ncclSuccess;
}

static ncclResult_t collective(const char *api, enum coll_kind kind, const void *send, void *recv,
                               size_t count, ncclDataType_t dtype, ncclRedOp_t op, int root,
                               ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, api, &err);
    if (!c)
        return err;
    if ((err = usable(c, api)) != ncclSuccess)
        return err;
    size_t es = dtype_size(dtype);
    if (es == 0)
        return report_error(ncclInvalidArgument, "%s: invalid datatype %d", api, (int)dtype);
    if (reduces(kind)) {
        if (!dtype_reducible(dtype))
            return report_error(ncclInvalidArgument, "%s: datatype %d cannot be reduced by the "
                              "emulator", api, (int)dtype);
        int slot = (int)op - ncclNumOps;
        if ((int)op < 0 || (slot >= 0 && (slot >= MAX_CUSTOM_OPS || !c->custom[slot].used ||
                                          c->custom[slot].dtype != dtype)))
            return report_error(ncclInvalidArgument, "%s: invalid reduction op %d for datatype %d",
                              api, (int)op, (int)dtype);
    } else {
        op = ncclSum;
    }
    int n = c->nranks;
    if (has_root(kind) && (root < 0 || root >= n))
        return report_error(ncclInvalidArgument, "%s: root %d is not in [0, %d)", api, root, n);
    if (!has_root(kind))
        root = 0;

    size_t one = count * es, all = count * (size_t)n * es, send_bytes = 0, recv_bytes = 0;
    int is_root = c->rank == root;
    switch (kind) {
    case COLL_ALLREDUCE: send_bytes = one; recv_bytes = one; break;
    case COLL_BROADCAST: send_bytes = is_root ? one : 0; recv_bytes = one; break;
    case COLL_REDUCE: send_bytes = one; recv_bytes = is_root ? one : 0; break;
    case COLL_ALLGATHER: send_bytes = one; recv_bytes = all; break;
    case COLL_REDUCESCATTER: send_bytes = all; recv_bytes = one; break;
    case COLL_ALLTOALL: send_bytes = all; recv_bytes = all; break;
    case COLL_GATHER: send_bytes = one; recv_bytes = is_root ? all : 0; break;
    case COLL_SCATTER: send_bytes = is_root ? all : 0; recv_bytes = one; break;
    }
    if ((err = check_buffer(api, "sendbuff", send, send_bytes)) != ncclSuccess ||
        (err = check_buffer(api, "recvbuff", recv, recv_bytes)) != ncclSuccess)
        return err;

    struct task t;
    memset(&t, 0, sizeof t);
    t.comm = c;
    t.stream = stream;
    t.coll.kind = kind;
    t.coll.api = api;
    t.coll.send = send;
    t.coll.recv = recv;
    t.coll.count = count;
    t.coll.dtype = dtype;
    t.coll.op = op;
    t.coll.root = root;
    if ((err = fault_at_call(c, api, &t)) != ncclSuccess)
        return err;
    return group_add(&t);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return collective("ncclAllReduce", COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0,
                      comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return collective("ncclBroadcast", COLL_BROADCAST, sendbuff, recvbuff, count, datatype,
                      ncclSum, root, comm, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream)
{
    return collective("ncclBcast", COLL_BROADCAST, buff, buff, count, datatype, ncclSum, root,
                      comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    return collective("ncclReduce", COLL_REDUCE, sendbuff, recvbuff, count, datatype, op, root,
                      comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return collective("ncclAllGather", COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype,
                      ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return collective("ncclReduceScatter", COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount,
                      datatype, op, 0, comm, stream);
}

#if SIMDEV_HAS_ALLTOALL_GATHER_SCATTER
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return collective("ncclAlltoAll", COLL_ALLTOALL, sendbuff, recvbuff, count, datatype, ncclSum,
                      0, comm, stream);
}

ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return collective("ncclGather", COLL_GATHER, sendbuff, recvbuff, count, datatype, ncclSum,
                      root, comm, stream);
}

ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return collective("ncclScatter", COLL_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum,
                      root, comm, stream);
}
#endif

static ncclResult_t p2p(const char *api, int is_send, const void *buf, size_t count,
                        ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t err;
    struct ncclComm *c = comm_check(comm, api, &err);
    if (!c)
        return err;
    if ((err = usable(c, api)) != ncclSuccess)
        return err;
    size_t es = dtype_size(datatype);
    if (es == 0)
        return report_error(ncclInvalidArgument, "%s: invalid datatype %d", api, (int)datatype);
    if (peer < 0 || peer >= c->nranks)
        return report_error(ncclInvalidArgument, "%s: peer %d is not in [0, %d)", api, peer,
                          c->nranks);
    if ((err = check_buffer(api, is_send ? "sendbuff" : "recvbuff", buf, count * es)) !=
        ncclSuccess)
        return err;
    struct task t;
    memset(&t, 0, sizeof t);
    t.comm = c;
    t.stream = stream;
    t.is_p2p = 1;
    t.coll.api = api;
    t.p2p.is_send = is_send;
    t.p2p.peer = peer;
    t.p2p.buf = (unsigned char *)buf;
    t.p2p.bytes = count * es;
    if ((err = fault_at_call(c, api, &t)) != ncclSuccess)
        return err;
    return group_add(&t);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p("ncclSend", 1, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p("ncclRecv", 0, recvbuff, count, datatype, peer, comm, stream);
}
