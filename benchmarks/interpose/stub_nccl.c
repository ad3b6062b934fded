/* stub_nccl.c -- an NCCL that does nothing, for bench_overhead (see
 * stub_cudart.c).  Unversioned, like the real libnccl.so.2. */
#include <nccl.h>
#include <string.h>

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { memset(id, 0, sizeof *id); return ncclSuccess; }
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank)
{
    *comm = (ncclComm_t)0x5678;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) { return "stub"; }
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    return ncclSuccess;
}
