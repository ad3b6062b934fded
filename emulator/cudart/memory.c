/* memory.c -- emulated device memory and the allocation table.
 *
 * Device memory is host memory (a program's kernels run as host twins, so
 * they must be able to dereference it), but the emulator keeps the books a GPU
 * would: every allocation is in a table sorted by address, so that copies
 * can check that a "device" pointer really is one, cudaPointerGetAttributes
 * can tell device from pinned from pageable memory, cudaMemGetInfo sees what
 * is used, and running out of the emulated capacity fails with
 * cudaErrorMemoryAllocation even if the host has memory to spare. */

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "jitckpt_simdev.h"
#include "simdev.h"

#define ALIGNMENT 256
#define MMAP_THRESHOLD (1u << 20)

struct entry {
    struct simdev_alloc a;
    int owned;                  /* the emulator allocated it (and frees it) */
    int mmapped;
    size_t storage_len;         /* length of the mapping, if mmapped */
    size_t charged;             /* bytes counted against the device capacity */
    int reserved;               /* inside the reserved range: freeing maps PROT_NONE back */
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *table;
static size_t count, capacity;
static size_t used[SIMDEV_MAX_DEVICES];

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* Index of the first entry whose base is > addr. */
static size_t upper_bound(uintptr_t addr)
{
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (table[mid].a.base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct entry *find_locked(uintptr_t addr)
{
    size_t i = upper_bound(addr);
    if (i == 0)
        return NULL;
    struct entry *e = &table[i - 1];
    size_t span = e->a.size ? e->a.size : 1;
    return addr - e->a.base < span ? e : NULL;
}

static int insert_locked(const struct entry *e)
{
    if (count == capacity) {
        size_t nc = capacity ? capacity * 2 : 256;
        struct entry *nt = realloc(table, nc * sizeof *nt);
        if (!nt)
            return 0;
        table = nt;
        capacity = nc;
    }
    size_t i = upper_bound(e->a.base);
    memmove(&table[i + 1], &table[i], (count - i) * sizeof *table);
    table[i] = *e;
    count++;
    return 1;
}

static void remove_at_locked(size_t i)
{
    memmove(&table[i], &table[i + 1], (count - i - 1) * sizeof *table);
    count--;
}

static void free_storage(const struct entry *e)
{
    if (!e->owned)
        return;
    if (e->reserved)            /* give the pages back, keep the address range reserved */
        mmap((void *)e->a.base, e->storage_len, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    else if (e->mmapped)
        munmap((void *)e->a.base, e->storage_len);
    else
        free((void *)e->a.base);
}

static int charged_kind(enum simdev_mem_kind kind)
{
    return kind == SIMDEV_MEM_DEVICE || kind == SIMDEV_MEM_MANAGED;
}

cudaError_t simdev_mem_alloc(enum simdev_mem_kind kind, int device, size_t size,
                             unsigned flags, void **out)
{
    struct entry e;
    memset(&e, 0, sizeof e);
    e.a.kind = kind;
    e.a.device = device;
    e.a.flags = flags;
    e.a.size = size;
    e.owned = 1;
    e.charged = charged_kind(kind) ? round_up(size, ALIGNMENT) : 0;

    pthread_mutex_lock(&mem_lock);
    if (e.charged && used[device] + e.charged > simdev_config.memory_bytes) {
        pthread_mutex_unlock(&mem_lock);
        simdev_trace("allocation of %zu bytes on device %d fails: %zu of %zu bytes in use "
                     "(JITCKPT_SIMDEV_MEMORY)", size, device, used[device],
                     simdev_config.memory_bytes);
        return cudaErrorMemoryAllocation;
    }
    used[device] += e.charged;
    pthread_mutex_unlock(&mem_lock);

    void *p = NULL;
    size_t bytes = round_up(size ? size : 1, ALIGNMENT);
    if (bytes >= MMAP_THRESHOLD) {
        e.storage_len = round_up(bytes, 4096);
        p = mmap(NULL, e.storage_len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            p = NULL;
        e.mmapped = 1;
    } else {
        p = aligned_alloc(ALIGNMENT, bytes);
    }
    if (!p) {
        pthread_mutex_lock(&mem_lock);
        used[device] -= e.charged;
        pthread_mutex_unlock(&mem_lock);
        return cudaErrorMemoryAllocation;
    }
    e.a.base = (uintptr_t)p;

    pthread_mutex_lock(&mem_lock);
    int ok = insert_locked(&e);
    if (!ok)
        used[device] -= e.charged;
    pthread_mutex_unlock(&mem_lock);
    if (!ok) {
        free_storage(&e);
        return cudaErrorMemoryAllocation;
    }
    *out = p;
    return cudaSuccess;
}

cudaError_t simdev_mem_register(enum simdev_mem_kind kind, int device, void *base,
                                size_t size, unsigned flags)
{
    struct entry e;
    memset(&e, 0, sizeof e);
    e.a.base = (uintptr_t)base;
    e.a.size = size;
    e.a.kind = kind;
    e.a.device = device;
    e.a.flags = flags;
    pthread_mutex_lock(&mem_lock);
    uintptr_t b = (uintptr_t)base;
    size_t i = upper_bound(b + (size ? size - 1 : 0));
    int overlaps = i > 0 && table[i - 1].a.base + (table[i - 1].a.size ? table[i - 1].a.size : 1) > b;
    int ok = !overlaps && insert_locked(&e);
    pthread_mutex_unlock(&mem_lock);
    if (overlaps)
        return cudaErrorHostMemoryAlreadyRegistered;
    return ok ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t simdev_mem_release(void *ptr, unsigned kinds_mask)
{
    pthread_mutex_lock(&mem_lock);
    size_t i = upper_bound((uintptr_t)ptr);
    if (i == 0 || table[i - 1].a.base != (uintptr_t)ptr ||
        !(kinds_mask & (1u << table[i - 1].a.kind))) {
        pthread_mutex_unlock(&mem_lock);
        return cudaErrorInvalidValue;
    }
    struct entry e = table[i - 1];
    remove_at_locked(i - 1);
    if (e.charged)
        used[e.a.device] -= e.charged;
    pthread_mutex_unlock(&mem_lock);
    free_storage(&e);
    return cudaSuccess;
}

int simdev_mem_find(const void *ptr, struct simdev_alloc *out)
{
    pthread_mutex_lock(&mem_lock);
    struct entry *e = find_locked((uintptr_t)ptr);
    if (e && out)
        *out = e->a;
    pthread_mutex_unlock(&mem_lock);
    return e != NULL;
}

cudaError_t simdev_mem_check_device_range(const void *ptr, size_t n)
{
    struct simdev_alloc a;
    if (!ptr || !simdev_mem_find(ptr, &a)) {
        simdev_trace("%p is not device-accessible memory (no allocation contains it)", ptr);
        return cudaErrorInvalidValue;
    }
    if ((uintptr_t)ptr - a.base + n > a.size) {
        simdev_trace("range [%p, +%zu) runs past the end of its allocation [%p, +%zu)", ptr, n,
                     (void *)a.base, a.size);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

size_t simdev_mem_used(int device)
{
    pthread_mutex_lock(&mem_lock);
    size_t u = used[device];
    pthread_mutex_unlock(&mem_lock);
    return u;
}

void simdev_mem_reset_device(int device)
{
    pthread_mutex_lock(&mem_lock);
    for (size_t i = count; i-- > 0;) {
        struct entry e = table[i];
        if (e.a.device != device || e.a.kind == SIMDEV_MEM_SYMBOL)
            continue;
        remove_at_locked(i);
        if (e.charged)
            used[device] -= e.charged;
        free_storage(&e);
    }
    pthread_mutex_unlock(&mem_lock);
}

/* ---- public allocation API --------------------------------------------- */

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    cudaError_t err = simdev_enter("cudaMalloc", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!devPtr)
        return simdev_return(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    return simdev_return(simdev_mem_alloc(SIMDEV_MEM_DEVICE, simdev_current_device(), size, 0,
                                          devPtr));
}

cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    cudaError_t err = simdev_enter("cudaMallocPitch", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!devPtr || !pitch)
        return simdev_return(cudaErrorInvalidValue);
    size_t p = round_up(width ? width : 1, 512);
    *pitch = p;
    if (width == 0 || height == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    return simdev_return(simdev_mem_alloc(SIMDEV_MEM_DEVICE, simdev_current_device(), p * height,
                                          0, devPtr));
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    cudaError_t err = simdev_enter("cudaMallocManaged", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!devPtr || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return simdev_return(cudaErrorInvalidValue);
    err = simdev_mem_alloc(SIMDEV_MEM_MANAGED, simdev_current_device(), size, flags, devPtr);
    if (err == cudaSuccess)
        memset(*devPtr, 0, size);
    return simdev_return(err);
}

cudaError_t cudaFree(void *devPtr)
{
    cudaError_t err = simdev_enter("cudaFree", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!devPtr)
        return cudaSuccess;
    struct simdev_alloc a;
    if (!simdev_mem_find(devPtr, &a) || a.base != (uintptr_t)devPtr ||
        (a.kind != SIMDEV_MEM_DEVICE && a.kind != SIMDEV_MEM_MANAGED)) {
        simdev_trace("cudaFree(%p): not the start of a device allocation", devPtr);
        return simdev_return(cudaErrorInvalidValue);
    }
    /* cudaFree synchronises the device, as on a GPU: work still queued may
     * use the memory. */
    err = simdev_device_synchronize(a.device);
    if (err != cudaSuccess)
        return simdev_return(err);
    return simdev_return(simdev_mem_release(devPtr, 1u << SIMDEV_MEM_DEVICE |
                                                        1u << SIMDEV_MEM_MANAGED));
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    cudaError_t err = simdev_enter("cudaMallocHost", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!ptr)
        return simdev_return(cudaErrorInvalidValue);
    return simdev_return(simdev_mem_alloc(SIMDEV_MEM_HOST, simdev_current_device(),
                                          size ? size : 1, cudaHostAllocDefault, ptr));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    cudaError_t err = simdev_enter("cudaHostAlloc", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (!pHost || (flags & ~known))
        return simdev_return(cudaErrorInvalidValue);
    return simdev_return(simdev_mem_alloc(SIMDEV_MEM_HOST, simdev_current_device(),
                                          size ? size : 1, flags, pHost));
}

cudaError_t cudaFreeHost(void *ptr)
{
    cudaError_t err = simdev_enter("cudaFreeHost", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!ptr)
        return cudaSuccess;
    struct simdev_alloc a;
    if (!simdev_mem_find(ptr, &a) || a.base != (uintptr_t)ptr || a.kind != SIMDEV_MEM_HOST)
        return simdev_return(cudaErrorInvalidValue);
    err = simdev_device_synchronize(a.device);
    if (err != cudaSuccess)
        return simdev_return(err);
    return simdev_return(simdev_mem_release(ptr, 1u << SIMDEV_MEM_HOST));
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    cudaError_t err = simdev_enter("cudaHostRegister", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!ptr || size == 0)
        return simdev_return(cudaErrorInvalidValue);
    return simdev_return(simdev_mem_register(SIMDEV_MEM_REGISTERED, simdev_current_device(), ptr,
                                             size, flags));
}

cudaError_t cudaHostUnregister(void *ptr)
{
    cudaError_t err = simdev_enter("cudaHostUnregister", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    err = simdev_mem_release(ptr, 1u << SIMDEV_MEM_REGISTERED);
    return simdev_return(err == cudaSuccess ? err : cudaErrorHostMemoryNotRegistered);
}

cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    cudaError_t err = simdev_enter("cudaHostGetDevicePointer", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_alloc a;
    if (!pDevice || flags != 0 || !simdev_mem_find(pHost, &a) ||
        (a.kind != SIMDEV_MEM_HOST && a.kind != SIMDEV_MEM_REGISTERED))
        return simdev_return(cudaErrorInvalidValue);
    *pDevice = pHost;             /* unified addressing: same address */
    return cudaSuccess;
}

cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    cudaError_t err = simdev_enter("cudaHostGetFlags", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_alloc a;
    if (!pFlags || !simdev_mem_find(pHost, &a) || a.kind != SIMDEV_MEM_HOST)
        return simdev_return(cudaErrorInvalidValue);
    *pFlags = a.flags;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    cudaError_t err = simdev_enter("cudaMemGetInfo", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!free_bytes || !total)
        return simdev_return(cudaErrorInvalidValue);
    size_t u = simdev_mem_used(simdev_current_device());
    *total = simdev_config.memory_bytes;
    *free_bytes = simdev_config.memory_bytes - u;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    cudaError_t err = simdev_enter("cudaPointerGetAttributes", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!attributes)
        return simdev_return(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    struct simdev_alloc a;
    if (!ptr || !simdev_mem_find(ptr, &a)) {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
        return cudaSuccess;
    }
    attributes->device = a.device;
    switch (a.kind) {
    case SIMDEV_MEM_DEVICE:
    case SIMDEV_MEM_SYMBOL:
        attributes->type = cudaMemoryTypeDevice;
        attributes->devicePointer = (void *)ptr;
        break;
    case SIMDEV_MEM_HOST:
    case SIMDEV_MEM_REGISTERED:
        attributes->type = cudaMemoryTypeHost;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = (void *)ptr;
        break;
    case SIMDEV_MEM_MANAGED:
        attributes->type = cudaMemoryTypeManaged;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = (void *)ptr;
        break;
    }
    if (a.kind == SIMDEV_MEM_SYMBOL)
        attributes->device = simdev_current_device();
    return cudaSuccess;
}

/* ---- stream-ordered allocation ------------------------------------------ */

static void free_on_stream(void *ptr)
{
    simdev_mem_release(ptr, 1u << SIMDEV_MEM_DEVICE);
}

cudaError_t simdev_malloc_async(void **ptr, size_t size, cudaStream_t stream, int ptds)
{
    cudaError_t err = simdev_enter("cudaMallocAsync", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!ptr)
        return simdev_return(cudaErrorInvalidValue);
    int device;
    err = simdev_stream_get_device(stream, ptds, &device);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    /* Memory is available at once, which is a valid stream-ordered schedule. */
    return simdev_return(simdev_mem_alloc(SIMDEV_MEM_DEVICE, device, size, 0, ptr));
}

cudaError_t simdev_free_async(void *ptr, cudaStream_t stream, int ptds)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter("cudaFreeAsync", &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!ptr)
        return cudaSuccess;
    struct simdev_alloc a;
    if (!simdev_mem_find(ptr, &a) || a.base != (uintptr_t)ptr || a.kind != SIMDEV_MEM_DEVICE)
        return simdev_return(cudaErrorInvalidValue);
    return simdev_return(simdev_submit_call(stream, ptds, "cudaFreeAsync", free_on_stream, ptr,
                                            NULL, &hit, NULL, NULL));
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    return simdev_malloc_async(devPtr, size, hStream, 0);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    return simdev_free_async(devPtr, hStream, 0);
}

/* ---- allocation at an address (jitckpt_simdev.h) -------------------------
 *
 * For transparent mode's device proxy (proxy_server/README.md, "Device
 * pointers"): a restarted proxy re-creates every allocation of the one it
 * replaces at the same address, so that device pointers kept by the program
 * (in host variables, kernel arguments, or device memory itself) stay valid.
 * The proxy reserves one address range (PROT_NONE, MAP_NORESERVE: no memory)
 * and places every allocation in it; an allocation maps its pages over the
 * reservation with MAP_FIXED (the range is ours), and freeing it maps
 * PROT_NONE back, so the range stays reserved.  An address outside the
 * reservation is mapped with MAP_FIXED_NOREPLACE: it fails rather than
 * replace anything.  Capacity checks and the allocation table are the same as
 * cudaMalloc's, so copies, cudaPointerGetAttributes and cudaFree work on these
 * allocations unchanged. */

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static uintptr_t reserved_base;
static size_t reserved_len;

cudaError_t jitckpt_simdev_reserve(void *base, size_t bytes)
{
    simdev_init();
    if (!base || ((uintptr_t)base & 4095) || bytes == 0 || (bytes & 4095))
        return cudaErrorInvalidValue;
    pthread_mutex_lock(&mem_lock);
    int busy = reserved_len != 0;
    pthread_mutex_unlock(&mem_lock);
    if (busy)
        return cudaErrorInvalidValue;      /* one range per process */
    void *p = mmap(base, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                   -1, 0);
    if (p == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    if (p != base) {                       /* a kernel older than 4.17 took the address as a hint */
        munmap(p, bytes);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&mem_lock);
    reserved_base = (uintptr_t)base;
    reserved_len = bytes;
    pthread_mutex_unlock(&mem_lock);
    return cudaSuccess;
}

cudaError_t jitckpt_simdev_malloc_at(void *addr, size_t bytes)
{
    simdev_init();
    int device = simdev_current_device();
    if (!simdev_valid_device(device))
        return cudaErrorNoDevice;
    cudaError_t err = __atomic_load_n(&simdev_devices[device].fatal, __ATOMIC_ACQUIRE);
    if (err != cudaSuccess)
        return err;
    uintptr_t a = (uintptr_t)addr;
    if (!addr || (a & 4095) || bytes == 0)
        return cudaErrorInvalidValue;
    struct entry e;
    memset(&e, 0, sizeof e);
    e.a.base = a;
    e.a.kind = SIMDEV_MEM_DEVICE;
    e.a.device = device;
    e.a.size = bytes;
    e.owned = 1;
    e.mmapped = 1;
    e.storage_len = round_up(bytes, 4096);
    e.charged = round_up(bytes, ALIGNMENT);

    pthread_mutex_lock(&mem_lock);
    size_t i = upper_bound(a + e.storage_len - 1);
    int overlaps = i > 0 && table[i - 1].a.base + (table[i - 1].a.size ? table[i - 1].a.size : 1) > a;
    e.reserved = reserved_len && a >= reserved_base && a + e.storage_len <= reserved_base + reserved_len;
    if (overlaps || used[device] + e.charged > simdev_config.memory_bytes) {
        pthread_mutex_unlock(&mem_lock);
        simdev_trace("allocation of %zu bytes at %p on device %d fails: %s", bytes, addr, device,
                     overlaps ? "another allocation is there" : "the device is full (JITCKPT_SIMDEV_MEMORY)");
        return overlaps ? cudaErrorInvalidValue : cudaErrorMemoryAllocation;
    }
    used[device] += e.charged;
    pthread_mutex_unlock(&mem_lock);

    void *p = mmap(addr, e.storage_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (e.reserved ? MAP_FIXED : MAP_FIXED_NOREPLACE),
                   -1, 0);
    int ok = p == addr;
    if (p != MAP_FAILED && !ok)
        munmap(p, e.storage_len);
    pthread_mutex_lock(&mem_lock);
    if (ok)
        ok = insert_locked(&e);
    if (!ok)
        used[device] -= e.charged;
    pthread_mutex_unlock(&mem_lock);
    if (!ok) {
        if (p == addr)
            free_storage(&e);
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}
