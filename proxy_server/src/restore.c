/* restore.c -- the proxy's half of the restart protocol
 * (jitckpt_remote_restart.h; README.md, "The call log, replay and recovery").
 *
 * A worker whose proxy was restarted re-creates its state here, in order:
 * the allocations at their addresses (devmem.c), the registrations (the
 * ordinary calls, each created handle bound to its old id by RST_EXPECT),
 * streams, events and one-rank communicators bound to their old virtual ids
 * (handles.c), then the bytes of device memory and of device variables.  For
 * the old proxy it synchronises every device and reads those bytes out. */

#include "dispatch.h"

#include <stdlib.h>

#include "jitckpt_remote_restart.h"

static __typeof__(cudaGetDeviceCount) *r_count;
static __typeof__(cudaGetDevice) *r_get_device;
static __typeof__(cudaSetDevice) *r_set_device;
static __typeof__(cudaDeviceSynchronize) *r_sync;
static __typeof__(cudaStreamCreateWithPriority) *r_stream;
static __typeof__(cudaEventCreateWithFlags) *r_event;
static __typeof__(cudaMemcpy) *r_memcpy;
static __typeof__(cudaMemcpyFromSymbol) *r_from_symbol;
static __typeof__(cudaMemcpyToSymbol) *r_to_symbol;
static __typeof__(ncclGetUniqueId) *r_unique_id;
static __typeof__(ncclCommInitRank) *r_comm_init;

static void resolve(void)
{
    if (r_count)
        return;
    r_get_device = (__typeof__(r_get_device))proxy_sym(cudart, "cudaGetDevice");
    r_set_device = (__typeof__(r_set_device))proxy_sym(cudart, "cudaSetDevice");
    r_sync = (__typeof__(r_sync))proxy_sym(cudart, "cudaDeviceSynchronize");
    r_stream = (__typeof__(r_stream))proxy_sym(cudart, "cudaStreamCreateWithPriority");
    r_event = (__typeof__(r_event))proxy_sym(cudart, "cudaEventCreateWithFlags");
    r_memcpy = (__typeof__(r_memcpy))proxy_sym(cudart, "cudaMemcpy");
    r_from_symbol = (__typeof__(r_from_symbol))proxy_sym(cudart, "cudaMemcpyFromSymbol");
    r_to_symbol = (__typeof__(r_to_symbol))proxy_sym(cudart, "cudaMemcpyToSymbol");
    r_unique_id = (__typeof__(r_unique_id))proxy_sym(nccl, "ncclGetUniqueId");
    r_comm_init = (__typeof__(r_comm_init))proxy_sym(nccl, "ncclCommInitRank");
    r_count = (__typeof__(r_count))proxy_sym(cudart, "cudaGetDeviceCount");
}

static int32_t on_device(int device)
{
    return device >= 0 ? r_set_device(device) : cudaSuccess;
}

static int32_t info(struct rdisp *d)
{
    uint64_t b, s;
    uint32_t fixed = (uint32_t)devmem_info(&b, &s);
    rd_put(d, &fixed, sizeof fixed);
    rd_put(d, &b, sizeof b);
    rd_put(d, &s, sizeof s);
    return 0;
}

static int32_t sync_all(void)
{
    int n = 0, cur = 0;
    cudaError_t err = r_count(&n);
    if (err != cudaSuccess || (err = r_get_device(&cur)) != cudaSuccess)
        return err;
    for (int i = 0; i < n && err == cudaSuccess; i++)
        if ((err = r_set_device(i)) == cudaSuccess)
            err = r_sync();
    r_set_device(cur);
    return err;
}

static int32_t alloc_at(struct rdisp *d)
{
    uint64_t addr, n;
    int32_t device;
    if (rd_get(d, &addr, sizeof addr) || rd_get(d, &n, sizeof n) || rd_get(d, &device, sizeof device))
        return RD_BAD;
    int32_t err = on_device(device);
    return err ? err : devmem_malloc_at((void *)(uintptr_t)addr, n);
}

static int32_t stream(struct rdisp *d)
{
    uint64_t vid;
    uint32_t flags;
    int32_t prio, device;
    if (rd_get(d, &vid, sizeof vid) || rd_get(d, &flags, sizeof flags) || rd_get(d, &prio, sizeof prio) ||
        rd_get(d, &device, sizeof device))
        return RD_BAD;
    cudaStream_t s = NULL;
    int32_t err = on_device(device);
    if (!err)
        err = r_stream(&s, flags, prio);
    if (!err && vh_bind(VH_STREAM, vid, s) != 0)
        err = cudaErrorInvalidResourceHandle;
    return err;
}

static int32_t event(struct rdisp *d)
{
    uint64_t vid;
    uint32_t flags;
    int32_t device;
    if (rd_get(d, &vid, sizeof vid) || rd_get(d, &flags, sizeof flags) || rd_get(d, &device, sizeof device))
        return RD_BAD;
    cudaEvent_t e = NULL;
    int32_t err = on_device(device);
    if (!err)
        err = r_event(&e, flags);
    if (!err && vh_bind(VH_EVENT, vid, e) != 0)
        err = cudaErrorInvalidResourceHandle;
    return err;
}

/* A communicator of one rank needs no peer: a fresh id.  More ranks need the
 * re-rendezvous of the recovery milestone; the worker does not ask. */
static int32_t comm(struct rdisp *d)
{
    uint64_t vid;
    int32_t nranks, rank, device;
    if (rd_get(d, &vid, sizeof vid) || rd_get(d, &nranks, sizeof nranks) || rd_get(d, &rank, sizeof rank) ||
        rd_get(d, &device, sizeof device))
        return RD_BAD;
    if (nranks != 1 || !r_unique_id || !r_comm_init)
        return cudaErrorNotSupported;
    int32_t err = on_device(device);
    if (err)
        return err;
    ncclUniqueId id;
    ncclComm_t c = NULL;
    if (r_unique_id(&id) != ncclSuccess || r_comm_init(&c, 1, id, 0) != ncclSuccess)
        return cudaErrorUnknown;
    return vh_bind(VH_COMM, vid, c) == 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

static int32_t expect(struct rdisp *d)
{
    int32_t kind;
    uint64_t vid;
    if (rd_get(d, &kind, sizeof kind) || rd_get(d, &vid, sizeof vid))
        return RD_BAD;
    vh_expect(kind, vid);
    return 0;
}

static int32_t copy(struct rdisp *d, unsigned fn)
{
    uint64_t where, n;
    const void *host = NULL;
    int out = fn == JITCKPT_RFN_RST_READ || fn == JITCKPT_RFN_RST_SYM_READ;
    if (rd_get(d, &where, sizeof where) || rd_get(d, &n, sizeof n) ||
        (out ? rd_host_out(d, &host) : rd_host_in(d, &host)) || (n && !host))
        return RD_BAD;
    void *p = (void *)(uintptr_t)where;
    switch (fn) {
    case JITCKPT_RFN_RST_READ: return r_memcpy((void *)host, p, n, cudaMemcpyDeviceToHost);
    case JITCKPT_RFN_RST_WRITE: return r_memcpy(p, host, n, cudaMemcpyHostToDevice);
    case JITCKPT_RFN_RST_SYM_READ: return r_from_symbol((void *)host, p, n, 0, cudaMemcpyDeviceToHost);
    default: return r_to_symbol(p, host, n, 0, cudaMemcpyHostToDevice);
    }
}

static int32_t device(struct rdisp *d)
{
    int32_t want, cur = -1;
    if (rd_get(d, &want, sizeof want))
        return RD_BAD;
    int32_t err = want >= 0 ? r_set_device(want) : cudaSuccess;
    if (!err)
        err = r_get_device(&cur);
    rd_put(d, &cur, sizeof cur);
    return err;
}

int32_t dispatch_restore(unsigned fn, struct rdisp *d, int *handled)
{
    *handled = 1;
    resolve();
    switch (fn) {
    case JITCKPT_RFN_RST_INFO: return info(d);
    case JITCKPT_RFN_RST_SYNC: return sync_all();
    case JITCKPT_RFN_RST_ALLOC_AT: return alloc_at(d);
    case JITCKPT_RFN_RST_STREAM: return stream(d);
    case JITCKPT_RFN_RST_EVENT: return event(d);
    case JITCKPT_RFN_RST_COMM: return comm(d);
    case JITCKPT_RFN_RST_EXPECT: return expect(d);
    case JITCKPT_RFN_RST_READ:
    case JITCKPT_RFN_RST_WRITE:
    case JITCKPT_RFN_RST_SYM_READ:
    case JITCKPT_RFN_RST_SYM_WRITE: return copy(d, fn);
    case JITCKPT_RFN_RST_DEVICE: return device(d);
    default:
        *handled = 0;
        return 0;
    }
}
