/* pinned.c -- pinned host memory shared with the device proxy (transparent
 * mode; proxy_server/README.md, "Pinned host memory").
 *
 * cudaHostAlloc and cudaMallocHost take their pages from a memfd of their own
 * (sealed against resizing), mapped MAP_SHARED here -- first fit in the range
 * at JITCKPT_WIRE_PINNED_BASE, which no process normally uses, so that the
 * address is usually free in the proxy too -- and hand the fd to the proxy: a
 * message on the socket carrying it (SCM_RIGHTS), then a synchronous
 * JITCKPT_RFN_HOST_REGISTER record naming the message; the proxy maps the same
 * pages at the same address and registers them with its runtime
 * (cudaHostRegister; proxy_server/src/pinned.c).  From then on a host buffer
 * that lies inside the region crosses as its own pointer (marshal.c): an H2D
 * copy from it needs no arena bounce, and a D2H copy into it is asynchronous,
 * as on a GPU (unless recovery is on: marshal.c says why).  If the proxy cannot
 * map it (the address is taken there, no cudaHostRegister), the region is only
 * this process's memory and its copies go through the arena, as before.
 * cudaFreeHost has the proxy synchronise, unregister and unmap it, then unmaps
 * it here.  Neither call is logged or counted by JITCKPT_REMOTE_RESTART_AT
 * (remote_begin_quiet): they change no device state.
 *
 * A new proxy (restart.c) gets every live region again as soon as it is
 * connected; a forked child gets private mappings and no proxy.  Mapped
 * (zero-copy) memory, cudaHostAllocMapped, stays refused (a kernel would reach
 * the pages through cudaHostGetDevicePointer, which is not marshalled).
 *
 * The table is sorted by address, under the call lock. */

#include "remote.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct region {
    uintptr_t addr;
    size_t size;                 /* whole pages */
    int fd;                      /* the memfd, or -1 (none: never shared again) */
    int mapped;                  /* mmap'd (else posix_memalign'd: no memfd could be had) */
    int shared;                  /* the current proxy has it mapped */
    unsigned flags;              /* cudaHostRegister's flags in the proxy */
    int managed;                 /* cudaMallocManaged: must be shared; freed by cudaFree */
};

static struct region *regions;
static size_t nregions, cap;
static uint64_t seq;             /* of the descriptors sent on the socket */
static int said_unshared;

/* The index of the first region above addr. */
static size_t upper(uintptr_t addr)
{
    size_t lo = 0, hi = nregions;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (regions[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct region *find(uintptr_t addr)
{
    size_t i = upper(addr);
    return i > 0 && regions[i - 1].addr == addr ? &regions[i - 1] : NULL;
}

static int insert(const struct region *r)
{
    if (nregions == cap) {
        size_t n = cap ? cap * 2 : 16;
        struct region *p = realloc(regions, n * sizeof *p);
        if (!p)
            return -1;
        regions = p;
        cap = n;
    }
    size_t i = upper(r->addr);
    memmove(&regions[i + 1], &regions[i], (nregions - i) * sizeof *regions);
    regions[i] = *r;
    nregions++;
    return 0;
}

int remote_pinned_shared(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    size_t i = upper(a);
    if (i == 0)
        return 0;
    const struct region *r = &regions[i - 1];
    return r->shared && a - r->addr < r->size && n <= r->size - (a - r->addr);
}

/* Maps the memfd: first fit in the pinned range, else anywhere.  MAP_FAILED on failure. */
static void *place(int fd, size_t size)
{
    uintptr_t at = JITCKPT_WIRE_PINNED_BASE;
    for (size_t i = 0; i < nregions; i++) {
        const struct region *r = &regions[i];
        if (r->addr + r->size <= at)
            continue;
        if (r->addr >= at + size)
            break;
        at = r->addr + r->size;
    }
    void *p = MAP_FAILED;
    if (size <= JITCKPT_WIRE_PINNED_SIZE && at + size <= JITCKPT_WIRE_PINNED_BASE + JITCKPT_WIRE_PINNED_SIZE) {
        p = mmap((void *)at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
        if (p != MAP_FAILED && p != (void *)at) {          /* a kernel before 4.17 took it as a hint */
            munmap(p, size);
            p = MAP_FAILED;
        }
    }
    if (p == MAP_FAILED)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p;
}

/* Hands the region at addr to the proxy through c (begun for
 * JITCKPT_RFN_HOST_REGISTER): its descriptor on the socket, then the record.
 * A recovery under the call may have shared it with a new proxy already
 * (remote_pinned_reshare), so the region is looked up again afterwards. */
static void share(struct rcall *c, uintptr_t addr)
{
    struct region *r = find(addr);
    struct jitckpt_wire_pinned_fd m = {JITCKPT_WIRE_PINNED_MAGIC, 0, ++seq, r->addr, r->size};
    int32_t err = cudaErrorDevicesUnavailable;
    if (remote_send_fd(r->fd, &m, sizeof m) == 0) {
        rc_put(c, &m.seq, sizeof m.seq);
        rc_put(c, &m.addr, sizeof m.addr);
        rc_put(c, &m.size, sizeof m.size);
        rc_put(c, &r->flags, sizeof r->flags);
        err = remote_call(c);
    }
    r = find(addr);
    if (err == 0)
        r->shared = 1;
    if (!r->shared && !said_unshared) {
        said_unshared = 1;
        rlog("pinned memory at %#llx (%llu bytes) is not shared with the device proxy (error %d; the proxy says "
             "why): copies from and to it go through the arena", (unsigned long long)r->addr,
             (unsigned long long)r->size, (int)err);
    }
}

void remote_pinned_reshare(void)
{
    for (size_t i = 0; i < nregions; i++)
        regions[i].shared = 0;
    for (size_t i = 0; i < nregions; i++) {
        struct rcall c;
        remote_begin_locked(&c, JITCKPT_RFN_HOST_REGISTER);
        if (regions[i].fd >= 0)
            share(&c, regions[i].addr);
    }
}

/* In a child forked from the worker (client.c, under the call lock): no proxy,
 * and the parent's pages must not change under the parent: each region becomes
 * a private mapping of its memfd (CUDA leaves a forked child's use of pinned
 * memory undefined; this keeps the parent safe: the child's writes stay its
 * own, though until it writes a page it sees the parent's later writes). */
void remote_pinned_forked(void)
{
    for (size_t i = 0; i < nregions; i++) {
        struct region *r = &regions[i];
        if (r->fd < 0)
            continue;
        mmap((void *)r->addr, r->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, r->fd, 0);
        close(r->fd);
        r->fd = -1;
        r->shared = 0;
    }
}

int remote_pinned_is_managed(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    size_t i = upper(a);
    return i > 0 && regions[i - 1].managed && a - regions[i - 1].addr < regions[i - 1].size;
}

static cudaError_t free_region(struct rcall *c, void *ptr, int have_proxy);

/* A region of `size` bytes shared with the proxy, registered there with `flags` (c begun for
 * JITCKPT_RFN_HOST_REGISTER, the call lock held). */
static cudaError_t alloc_region_in(struct rcall *c, int have_proxy, void **out, size_t size, unsigned flags,
                                   int managed)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = ((size ? size : 1) + page - 1) & ~(page - 1);
    if (size > SIZE_MAX - page)
        return cudaErrorMemoryAllocation;
    struct region r = {0, bytes, -1, 1, 0, flags, managed};
    void *p = MAP_FAILED;
    r.fd = memfd_create("jitckpt-pinned", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r.fd >= 0 && ftruncate(r.fd, (off_t)bytes) == 0 &&
        fcntl(r.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        p = place(r.fd, bytes);
    if (p == MAP_FAILED) {                       /* no memfd: page-aligned memory of this process only */
        if (r.fd >= 0)
            close(r.fd);
        r.fd = -1;
        r.mapped = 0;
        if (posix_memalign(&p, page, bytes) != 0)
            p = MAP_FAILED;
    }
    r.addr = (uintptr_t)p;
    if (p == MAP_FAILED || insert(&r) != 0) {
        if (p != MAP_FAILED && r.mapped)
            munmap(p, bytes);
        else if (p != MAP_FAILED)
            free(p);
        if (r.fd >= 0)
            close(r.fd);
        return cudaErrorMemoryAllocation;
    }
    if (have_proxy && r.fd >= 0)
        share(c, r.addr);
    if (managed && !find(r.addr)->shared) {      /* a kernel in the proxy could not reach it: no managed memory */
        free_region(c, p, 0);
        return remote_refuse_call("cudaMallocManaged", "the device proxy could not map the memory at the same "
                                  "address");
    }
    *out = p;
    return cudaSuccess;
}

static cudaError_t alloc_region(void **out, size_t size, unsigned flags, int managed)
{
    struct rcall c;
    int have_proxy = remote_begin_quiet(&c, JITCKPT_RFN_HOST_REGISTER) == 0;
    cudaError_t err = alloc_region_in(&c, have_proxy, out, size, flags, managed);
    remote_end(&c);
    return err;
}

/* rewind.c, under the call lock: `size` bytes of pinned memory the proxy has mapped at the same address (its
 * copies write there), or NULL. */
void *remote_pinned_alloc_locked(size_t size)
{
    struct rcall c;
    void *p = NULL;
    remote_begin_locked(&c, JITCKPT_RFN_HOST_REGISTER);
    if (alloc_region_in(&c, 1, &p, size, 0, 0) != cudaSuccess)
        return NULL;
    if (!find((uintptr_t)p)->shared) {
        remote_begin_locked(&c, JITCKPT_RFN_HOST_UNREGISTER);
        free_region(&c, p, 0);
        return NULL;
    }
    return p;
}

void remote_pinned_free_locked(void *p)
{
    struct rcall c;
    remote_begin_locked(&c, JITCKPT_RFN_HOST_UNREGISTER);
    free_region(&c, p, 1);
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (pHost == NULL)
        return cudaErrorInvalidValue;
    if (flags & cudaHostAllocMapped)
        return remote_refuse_call("cudaHostAlloc", "flags & cudaHostAllocMapped (zero-copy memory)");
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocWriteCombined))
        return cudaErrorInvalidValue;
    return alloc_region(pHost, size, flags & cudaHostAllocPortable ? cudaHostRegisterPortable : 0, 0);
}

/* Managed memory is a shared region the proxy registers as mapped memory: the
 * program reads and writes it here, kernels in the proxy at the same address
 * (on a GPU: zero-copy host memory, correct but slower than migrating pages;
 * UNVERIFIED ON GPU).  A replay cannot reset it, so transparent recovery is off
 * for a job that has it (recover.c). */
EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (devPtr == NULL || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return cudaErrorInvalidValue;
    cudaError_t err = alloc_region(devPtr, size, cudaHostRegisterMapped | cudaHostRegisterPortable, 1);
    if (err == cudaSuccess)
        remote_recovery_off("managed", "the program allocated managed memory (cudaMallocManaged), which a replay "
                            "cannot reset: the kernels' writes to it would be applied twice");
    return err;
}

/* cudaFree of managed memory (the generated cudaFree stub asks first): the
 * result, or -1 when ptr is not managed memory (the proxy frees it). */
int remote_free_managed(void *ptr)
{
    struct rcall c;
    int have_proxy = remote_begin_quiet(&c, JITCKPT_RFN_HOST_UNREGISTER) == 0;
    struct region *found = find((uintptr_t)ptr);
    if (!found || !found->managed) {
        remote_end(&c);
        return -1;
    }
    cudaError_t err = free_region(&c, ptr, have_proxy);
    remote_end(&c);
    return err;
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct rcall c;
    int have_proxy = remote_begin_quiet(&c, JITCKPT_RFN_HOST_UNREGISTER) == 0;
    struct region *found = find((uintptr_t)ptr);
    if (!found || found->managed) {
        remote_end(&c);
        return cudaErrorInvalidValue;
    }
    cudaError_t err = free_region(&c, ptr, have_proxy);
    remote_end(&c);
    return err;
}

/* Drops the region at ptr (c begun for JITCKPT_RFN_HOST_UNREGISTER, the call lock held). */
static cudaError_t free_region(struct rcall *c, void *ptr, int have_proxy)
{
    struct region *found = find((uintptr_t)ptr);
    struct region r = *found;
    size_t i = (size_t)(found - regions);
    memmove(&regions[i], &regions[i + 1], (nregions - i - 1) * sizeof *regions);
    nregions--;                                  /* no call crosses it directly from here on */
    cudaError_t err = cudaSuccess;
    if (have_proxy && r.shared) {
        rc_put(c, &r.addr, sizeof r.addr);
        err = (cudaError_t)remote_call(c);       /* synchronises first: copies in flight complete */
    }
    if (r.mapped)
        munmap(ptr, r.size);
    else
        free(ptr);
    if (r.fd >= 0)
        close(r.fd);
    return err;                                  /* an error the synchronisation met, as cudaFreeHost's */
}

/* ---- cudaHostRegister: the program's own memory -------------------------------------
 * The proxy cannot map memory the program already has, so registration is
 * this process's record only: copies from and to the range keep going
 * through the arena, which is correct (the registration only makes them
 * faster on a GPU).  What promises the device direct access cannot be kept
 * across processes and is refused by name: cudaHostRegisterMapped,
 * IoMemory and ReadOnly, and cudaHostGetDevicePointer of such a range. */

struct range { uintptr_t addr; size_t size; unsigned flags; };
static struct range *ranges;
static size_t nranges, cap_ranges;

static struct range *range_at(uintptr_t a)
{
    for (size_t i = 0; i < nranges; i++)
        if (a - ranges[i].addr < ranges[i].size)
            return &ranges[i];
    return NULL;
}

int remote_registered_range(const void *p)
{
    return range_at((uintptr_t)p) != NULL;
}

EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    if (ptr == NULL || size == 0)
        return cudaErrorInvalidValue;
    if (flags & (cudaHostRegisterMapped | cudaHostRegisterIoMemory | cudaHostRegisterReadOnly))
        return remote_refuse_call("cudaHostRegister", "flags & (cudaHostRegisterMapped | cudaHostRegisterIoMemory | "
                                  "cudaHostRegisterReadOnly): device access to the program's own memory");
    if (flags & ~(unsigned)cudaHostRegisterPortable)
        return cudaErrorInvalidValue;
    struct rcall c;
    remote_begin_quiet(&c, 0);
    uintptr_t a = (uintptr_t)ptr;
    cudaError_t err = cudaSuccess;
    for (size_t i = 0; i < nranges && err == cudaSuccess; i++)
        if (a < ranges[i].addr + ranges[i].size && ranges[i].addr < a + size)
            err = cudaErrorHostMemoryAlreadyRegistered;
    size_t j = upper(a);
    if (err == cudaSuccess && ((j > 0 && a - regions[j - 1].addr < regions[j - 1].size) ||
                               (j < nregions && regions[j].addr < a + size)))
        err = cudaErrorHostMemoryAlreadyRegistered;         /* pinned memory of cudaHostAlloc */
    if (err == cudaSuccess && nranges == cap_ranges) {
        size_t n = cap_ranges ? cap_ranges * 2 : 16;
        struct range *p = realloc(ranges, n * sizeof *p);
        if (p == NULL)
            err = cudaErrorMemoryAllocation;
        else {
            ranges = p;
            cap_ranges = n;
        }
    }
    if (err == cudaSuccess)
        ranges[nranges++] = (struct range){a, size, flags};
    remote_end(&c);
    return err;
}

EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
    struct rcall c;
    remote_begin_quiet(&c, 0);
    cudaError_t err = cudaErrorHostMemoryNotRegistered;
    for (size_t i = 0; i < nranges; i++)
        if (ranges[i].addr == (uintptr_t)ptr) {
            ranges[i] = ranges[--nranges];
            err = cudaSuccess;
            break;
        }
    remote_end(&c);
    return ptr == NULL ? cudaErrorInvalidValue : err;
}

EXPORT cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    if (pFlags == NULL || pHost == NULL)
        return cudaErrorInvalidValue;
    struct rcall c;
    remote_begin_quiet(&c, 0);
    uintptr_t a = (uintptr_t)pHost;
    size_t i = upper(a);
    cudaError_t err = cudaErrorInvalidValue;
    if (i > 0 && a - regions[i - 1].addr < regions[i - 1].size && !regions[i - 1].managed) {
        *pFlags = regions[i - 1].flags & cudaHostRegisterPortable ? cudaHostAllocPortable : cudaHostAllocDefault;
        err = cudaSuccess;
    }                   /* (memory of cudaHostRegister has no allocation flags: cudaErrorInvalidValue, as the runtime) */
    remote_end(&c);
    return err;
}

/* With unified addressing, pinned memory's device pointer is its own address:
 * so it is for the regions shared with the proxy (mapped there at the same
 * address).  The program's own registered memory has none the device can use. */
EXPORT cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    if (pDevice == NULL || pHost == NULL || flags != 0)
        return cudaErrorInvalidValue;
    struct rcall c;
    remote_begin_quiet(&c, 0);
    int shared = remote_pinned_shared(pHost, 1), registered = range_at((uintptr_t)pHost) != NULL;
    remote_end(&c);
    if (shared) {
        *pDevice = pHost;
        return cudaSuccess;
    }
    if (registered)
        return remote_refuse_call("cudaHostGetDevicePointer", "pHost lies in the program's own memory registered "
                                  "with cudaHostRegister (the device proxy cannot map it)");
    return cudaErrorInvalidValue;
}
