/* nccl_api.c -- the NCCL entry points that take a stream.
 *
 * Each one notes its stream as an NCCL stream (nccl_streams.c) and forwards
 * the call unchanged.  The signatures are NVIDIA's: nccl.h is included, so a
 * mismatch is a compile error.  NCCL's own symbols are unversioned, and so
 * are these (interpose.map does not name them).  Real NCCL drives the GPU
 * through the driver API, so the work NCCL itself puts on the stream never
 * passes through this library: only the application's calls do. */

#include "interpose.h"

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream)
{
    __typeof__(ncclAllReduce) *next = forward_fn(&next_ncclAllReduce);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream)
{
    __typeof__(ncclBroadcast) *next = forward_fn(&next_ncclBroadcast);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream)
{
    __typeof__(ncclBcast) *next = forward_fn(&next_ncclBcast);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(buff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream)
{
    __typeof__(ncclReduce) *next = forward_fn(&next_ncclReduce);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    __typeof__(ncclAllGather) *next = forward_fn(&next_ncclAllGather);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream)
{
    __typeof__(ncclReduceScatter) *next = forward_fn(&next_ncclReduceScatter);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    __typeof__(ncclAlltoAll) *next = forward_fn(&next_ncclAlltoAll);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, comm, stream);
}

EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream)
{
    __typeof__(ncclGather) *next = forward_fn(&next_ncclGather);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    __typeof__(ncclScatter) *next = forward_fn(&next_ncclScatter);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    __typeof__(ncclSend) *next = forward_fn(&next_ncclSend);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, count, datatype, peer, comm, stream);
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    __typeof__(ncclRecv) *next = forward_fn(&next_ncclRecv);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(recvbuff, count, datatype, peer, comm, stream);
}

EXPORT ncclResult_t ncclAllReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream, const ncclCollConfig_t *config)
{
    __typeof__(ncclAllReduceConfig) *next = forward_fn(&next_ncclAllReduceConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, op, comm, stream, config);
}

EXPORT ncclResult_t ncclBroadcastConfig(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream, const ncclCollConfig_t *config)
{
    __typeof__(ncclBroadcastConfig) *next = forward_fn(&next_ncclBroadcastConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, root, comm, stream, config);
}

EXPORT ncclResult_t ncclReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, int root,
                                     ncclComm_t comm, cudaStream_t stream,
                                     const ncclCollConfig_t *config)
{
    __typeof__(ncclReduceConfig) *next = forward_fn(&next_ncclReduceConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, op, root, comm, stream, config);
}

EXPORT ncclResult_t ncclAllGatherConfig(const void *sendbuff, void *recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream, const ncclCollConfig_t *config)
{
    __typeof__(ncclAllGatherConfig) *next = forward_fn(&next_ncclAllGatherConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, sendcount, datatype, comm, stream, config);
}

EXPORT ncclResult_t ncclReduceScatterConfig(const void *sendbuff, void *recvbuff, size_t recvcount,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
    const ncclCollConfig_t *config)
{
    __typeof__(ncclReduceScatterConfig) *next = forward_fn(&next_ncclReduceScatterConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config);
}

EXPORT ncclResult_t ncclAlltoAllConfig(const void *sendbuff, void *recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t stream, const ncclCollConfig_t *config)
{
    __typeof__(ncclAlltoAllConfig) *next = forward_fn(&next_ncclAlltoAllConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, comm, stream, config);
}

EXPORT ncclResult_t ncclGatherConfig(const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream, const ncclCollConfig_t *config)
{
    __typeof__(ncclGatherConfig) *next = forward_fn(&next_ncclGatherConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, root, comm, stream, config);
}

EXPORT ncclResult_t ncclScatterConfig(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream, const ncclCollConfig_t *config)
{
    __typeof__(ncclScatterConfig) *next = forward_fn(&next_ncclScatterConfig);
    if (unlikely(next == NULL))
        return ncclSystemError;
    nccl_stream_note(stream);
    return next(sendbuff, recvbuff, count, datatype, root, comm, stream, config);
}
