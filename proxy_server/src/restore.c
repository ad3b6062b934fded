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
static __typeof__(ncclSend) *r_send;
static __typeof__(ncclRecv) *r_recv;
static __typeof__(ncclGroupStart) *r_group_start;
static __typeof__(ncclGroupEnd) *r_group_end;
static __typeof__(cudaGetLastError) *r_last_error;

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
    r_last_error = (__typeof__(r_last_error))proxy_sym(cudart, "cudaGetLastError");
    if (nccl) {
        r_send = (__typeof__(r_send))proxy_sym(nccl, "ncclSend");
        r_recv = (__typeof__(r_recv))proxy_sym(nccl, "ncclRecv");
        r_group_start = (__typeof__(r_group_start))proxy_sym(nccl, "ncclGroupStart");
        r_group_end = (__typeof__(r_group_end))proxy_sym(nccl, "ncclGroupEnd");
    }
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
    if (err == cudaSuccess)
        alloc_reap();           /* every stream has passed its cudaFreeAsync points (alloc.c) */
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

/* ---- recovery (milestone 4; README.md, "Recovery") --------------------------------- */

static int32_t unique_id(struct rdisp *d)
{
    ncclUniqueId id;
    if (!r_unique_id || r_unique_id(&id) != ncclSuccess)
        return cudaErrorUnknown;
    rd_put(d, &id, sizeof id);
    return 0;
}

/* The communicator behind a virtual id, rebuilt with the id of this recovery's
 * rendezvous (the old one was aborted, or died with the old proxy). */
static int32_t comm_rebuild(struct rdisp *d)
{
    uint64_t vid;
    int32_t nranks, rank, device;
    ncclUniqueId id;
    if (rd_get(d, &vid, sizeof vid) || rd_get(d, &nranks, sizeof nranks) || rd_get(d, &rank, sizeof rank) ||
        rd_get(d, &device, sizeof device) || rd_get(d, &id, sizeof id))
        return RD_BAD;
    if (!r_comm_init)
        return cudaErrorNotSupported;
    int32_t err = on_device(device);
    if (err)
        return err;
    ncclComm_t c = NULL;
    ncclResult_t r = r_comm_init(&c, nranks, id, rank);
    if (r != ncclSuccess) {
        plog("rebuilding a communicator (rank %d of %d) failed: NCCL error %d", rank, nranks, (int)r);
        return cudaErrorUnknown;
    }
    void *old = NULL;
    if (vh_lookup(VH_COMM, vid, &old) == 0 ? vh_rebind(VH_COMM, vid, c) : vh_bind(VH_COMM, vid, c))
        return cudaErrorInvalidResourceHandle;
    watch_comm_added(c);
    return 0;
}

/* One allocation's bytes from the root of a recovery to a rank that lost them. */
static int32_t xfer(struct rdisp *d)
{
    uint64_t vid, addr, n;
    int32_t peer, send;
    void *c = NULL;
    if (rd_get(d, &vid, sizeof vid) || rd_get(d, &peer, sizeof peer) || rd_get(d, &send, sizeof send) ||
        rd_get(d, &addr, sizeof addr) || rd_get(d, &n, sizeof n))
        return RD_BAD;
    if (vh_lookup(VH_COMM, vid, &c) != 0 || !c)
        return cudaErrorInvalidResourceHandle;
    if (!r_send || !r_recv)
        return cudaErrorNotSupported;
    ncclResult_t r = r_group_start();
    if (r == ncclSuccess)
        r = send ? r_send((void *)(uintptr_t)addr, n, ncclUint8, peer, (ncclComm_t)c, 0)
                 : r_recv((void *)(uintptr_t)addr, n, ncclUint8, peer, (ncclComm_t)c, 0);
    ncclResult_t e = r_group_end();
    if (r == ncclSuccess)
        r = e;
    if (r != ncclSuccess)
        return cudaErrorUnknown;
    return sync_all();
}

/* Recovery is over: the errors the replayed calls left (cudaErrorNotReady of
 * replayed queries aside), then a clean slate. */
static int32_t clear(struct rdisp *d)
{
    int32_t err = sync_all();
    int32_t first = serve_take_pending();
    if (first == cudaErrorNotReady)
        first = 0;
    if (err)
        first = err;
    if (r_last_error)
        r_last_error();
    uint64_t done;
    if (rd_get(d, &done, sizeof done) == 0)
        watch_set_done_marker(done);
    watch_clear();
    rd_put(d, &first, sizeof first);
    return 0;
}

static int32_t health(struct rdisp *d)
{
    int32_t err = sync_all();
    uint64_t done = watch_done_marker();
    rd_put(d, &err, sizeof err);
    rd_put(d, &done, sizeof done);
    return 0;
}

int32_t proxy_sync_all(void)
{
    resolve();
    return sync_all();
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
    case JITCKPT_RFN_RST_UNIQUE_ID: return unique_id(d);
    case JITCKPT_RFN_RST_COMM_REBUILD: return comm_rebuild(d);
    case JITCKPT_RFN_RST_XFER: return xfer(d);
    case JITCKPT_RFN_RST_CLEAR: return clear(d);
    case JITCKPT_RFN_RST_HEALTH: return health(d);
    default:
        *handled = 0;
        return 0;
    }
}
