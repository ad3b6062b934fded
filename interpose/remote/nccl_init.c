/* nccl_init.c -- NCCL calls the generated stubs cannot express: ncclCommInitAll,
 * which creates an array of communicators (one per listed device, all in this
 * process); ncclGetLastError, a string about a communicator; and the element
 * sizes ncclRedOpCreatePreMulSum's host scalar needs. */

#include "remote.h"
#include "track.h"

size_t remote_nccl_type_size(ncclDataType_t datatype)
{
    switch (datatype) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 1;          /* the 1-byte fp8 types; an invalid type is the proxy's NCCL's to reject */
    }
}

#define MAX_INIT_ALL 64

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    if (comm == NULL || ndev <= 0)
        return ncclInvalidArgument;
    if (ndev > MAX_INIT_ALL) {
        remote_refuse_call("ncclCommInitAll", "ndev > 64");
        return ncclInvalidUsage;
    }
    struct rcall c;
    if (remote_begin(&c, RFN_ncclCommInitAll) != 0)
        return ncclSystemError;
    int32_t n = ndev, has_list = devlist != NULL;
    rc_put(&c, &n, sizeof n);
    rc_put(&c, &has_list, sizeof has_list);
    if (devlist)
        rc_put(&c, devlist, (size_t)ndev * sizeof *devlist);
    ncclResult_t ret = (ncclResult_t)remote_call(&c);
    if (ret == ncclSuccess) {
        for (int i = 0; i < ndev; i++)
            rc_get_handle(&c, (void **)&comm[i]);
        /* kept for a restart as communicators of ndev ranks (a restart refuses them: one rank each) */
        ncclUniqueId none = {{0}};
        for (int i = 0; i < ndev; i++)
            remote_track_ncclCommInitRank(&comm[i], ndev, none, i);
    }
    remote_end(&c);
    return ret;
}

/* The proxy's NCCL's last error text, kept by the worker (marshal.c keeps strings). */
EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
    struct rcall c;
    if (remote_begin(&c, RFN_ncclGetLastError) != 0)
        return "the device proxy is not reachable";
    rc_put_handle(&c, comm);
    const char *s = NULL;
    if (remote_call(&c) == 0)
        s = rc_get_string(&c);
    remote_end(&c);
    return s ? s : "";
}
