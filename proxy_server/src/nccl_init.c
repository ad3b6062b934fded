/* nccl_init.c -- the proxy's half of ncclCommInitAll (interpose/remote/nccl_init.c):
 * i32 ndev, i32 has_list, [ndev i32 devices] -> ndev virtual communicator ids;
 * and of ncclGetLastError: a communicator id (0: none) -> the string. */

#include "dispatch.h"

#define MAX_INIT_ALL 64

int32_t dispatch_nccl_init_all(struct rdisp *d)
{
    static __typeof__(ncclCommInitAll) *real;
    if (!real && (real = (__typeof__(ncclCommInitAll) *)proxy_sym(nccl, "ncclCommInitAll")) == NULL)
        return ncclInvalidUsage;
    int32_t ndev, has_list;
    int devs[MAX_INIT_ALL];
    if (rd_get(d, &ndev, sizeof ndev) || rd_get(d, &has_list, sizeof has_list) || ndev <= 0 || ndev > MAX_INIT_ALL)
        return ncclInvalidArgument;
    if (has_list && rd_get(d, devs, (size_t)ndev * sizeof *devs))
        return ncclInvalidArgument;
    ncclComm_t comms[MAX_INIT_ALL];
    ncclResult_t ret = real(comms, ndev, has_list ? devs : NULL);
    if (ret != ncclSuccess)
        return ret;
    for (int i = 0; i < ndev; i++) {
        uint64_t vid = vh_insert(VH_COMM, comms[i]);
        rd_put(d, &vid, sizeof vid);
        watch_comm_created((const unsigned char *)&vid, sizeof vid);     /* its asynchronous errors are watched */
    }
    return ncclSuccess;
}

int32_t dispatch_nccl_last_error(struct rdisp *d)
{
    static __typeof__(ncclGetLastError) *real;
    if (!real && (real = (__typeof__(ncclGetLastError) *)proxy_sym(nccl, "ncclGetLastError")) == NULL)
        return ncclInvalidUsage;
    uint64_t vid;
    void *comm = NULL;
    if (rd_get_handle(d, VH_COMM, &vid, &comm))
        comm = NULL;            /* a stale communicator: NCCL's last error of none */
    rd_put_string(d, real((ncclComm_t)comm));
    return 0;
}
