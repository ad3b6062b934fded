/* devmem.c -- device memory at addresses a restarted proxy can re-create
 * (README.md, "Device pointers").
 *
 * Device pointers are not virtualised (they hide in kernel arguments and in
 * device memory), so after a proxy restart every allocation must come back at
 * the same address.  The proxy reserves one address range per rank at start
 * of its first allocation (JITCKPT_PROXY_VA_BASE/_SIZE, jitckpt_remote_restart.h)
 * and places every cudaMalloc in it itself, first fit; a restarted proxy
 * reserves the same range and re-creates each allocation at its address
 * (devmem_malloc_at, from the worker's table; restore.c).
 *
 * On the emulator the range and the allocations are the emulator's private
 * extension (jitckpt_simdev_reserve, jitckpt_simdev_malloc_at): the emulator
 * keeps its allocation table, capacity checks and cudaFree.  On a GPU the same
 * is the driver's virtual-memory API (cuMemAddressReserve once, then
 * cuMemCreate + cuMemMap + cuMemSetAccess per allocation; cuMemUnmap +
 * cuMemRelease to free): written below but UNVERIFIED ON GPU, so it is used
 * only with JITCKPT_PROXY_GPU_VMM=1.  Otherwise, with a runtime that lacks the
 * emulator's extension, the proxy uses the runtime's own cudaMalloc, says so
 * once, and a restart is refused (RST_INFO reports fixed = 0). */

#include "dispatch.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>

#include "jitckpt_remote_restart.h"

static uint64_t GRAIN = 4096;        /* the VMM path: the driver's allocation granularity */

typedef cudaError_t reserve_fn(void *base, size_t bytes);
typedef cudaError_t malloc_at_fn(void *addr, size_t bytes);
static reserve_fn *sim_reserve;
static malloc_at_fn *sim_malloc_at;
static __typeof__(cudaMalloc) *rt_malloc;
static __typeof__(cudaFree) *rt_free;
static __typeof__(cudaPointerGetAttributes) *rt_attrs;

static int state;                    /* 0: not yet, 1: fixed addresses, -1: the runtime's cudaMalloc */
static uint64_t base, size;
struct range { uint64_t addr, len, handle; };       /* handle: the VMM path's CUmemGenericAllocationHandle */

/* ---- the GPU path: the driver's VMM API (UNVERIFIED ON GPU; JITCKPT_PROXY_GPU_VMM=1) ---- */
static int vmm;
static CUresult (*cu_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*cu_addr_free)(CUdeviceptr, size_t);
static CUresult (*cu_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                             unsigned long long);
static CUresult (*cu_release)(CUmemGenericAllocationHandle);
static CUresult (*cu_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
static CUresult (*cu_unmap)(CUdeviceptr, size_t);
static CUresult (*cu_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
static CUresult (*cu_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
static __typeof__(cudaGetDevice) *rt_get_device;
static __typeof__(cudaDeviceSynchronize) *rt_sync;

static CUmemAllocationProp vmm_prop(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

static int vmm_init(void)
{
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cu)
        return -1;
#define CU(var, name) if ((*(void **)&var = dlsym(cu, name)) == NULL) return -1
    CU(cu_reserve, "cuMemAddressReserve");
    CU(cu_addr_free, "cuMemAddressFree");
    CU(cu_create, "cuMemCreate");
    CU(cu_release, "cuMemRelease");
    CU(cu_map, "cuMemMap");
    CU(cu_unmap, "cuMemUnmap");
    CU(cu_access, "cuMemSetAccess");
    CU(cu_granularity, "cuMemGetAllocationGranularity");
#undef CU
    rt_get_device = (__typeof__(cudaGetDevice) *)proxy_sym(cudart, "cudaGetDevice");
    rt_sync = (__typeof__(cudaDeviceSynchronize) *)proxy_sym(cudart, "cudaDeviceSynchronize");
    int device = 0;
    if (!rt_get_device || !rt_sync || rt_free(NULL) != cudaSuccess || rt_get_device(&device) != cudaSuccess)
        return -1;                           /* cudaFree(NULL): the primary context exists */
    CUmemAllocationProp prop = vmm_prop(device);
    size_t g = 0;
    if (cu_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || g == 0)
        return -1;
    GRAIN = g;
    size = (size + g - 1) / g * g;
    base = base / g * g;
    CUdeviceptr got = 0;
    if (cu_reserve(&got, size, g, (CUdeviceptr)base, 0) != CUDA_SUCCESS)
        return -1;
    if (got != base) {                       /* the address is only a hint to the driver */
        cu_addr_free(got, size);
        return -1;
    }
    return 0;
}

/* One allocation at addr: physical memory of the current device, mapped there. */
static int32_t vmm_map(uint64_t addr, uint64_t len, uint64_t *handle)
{
    int device = 0;
    if (rt_get_device(&device) != cudaSuccess)
        return cudaErrorInvalidDevice;
    CUmemAllocationProp prop = vmm_prop(device);
    CUmemGenericAllocationHandle h;
    if (cu_create(&h, len, &prop, 0) != CUDA_SUCCESS)
        return cudaErrorMemoryAllocation;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (cu_map((CUdeviceptr)addr, len, 0, h, 0) != CUDA_SUCCESS) {
        cu_release(h);
        return cudaErrorMemoryAllocation;
    }
    if (cu_access((CUdeviceptr)addr, len, &access, 1) != CUDA_SUCCESS) {
        cu_unmap((CUdeviceptr)addr, len);
        cu_release(h);
        return cudaErrorMemoryAllocation;
    }
    *handle = h;
    return cudaSuccess;
}

static struct range *used;           /* sorted by address */
static size_t nused, capused;

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *s = getenv(name);
    return s && *s ? strtoull(s, NULL, 0) : dflt;
}

static void init(void)
{
    if (state)
        return;
    rt_malloc = (__typeof__(cudaMalloc) *)proxy_sym(cudart, "cudaMalloc");
    rt_free = (__typeof__(cudaFree) *)proxy_sym(cudart, "cudaFree");
    rt_attrs = (__typeof__(cudaPointerGetAttributes) *)proxy_sym(cudart, "cudaPointerGetAttributes");
    sim_reserve = (reserve_fn *)dlsym(cudart, "jitckpt_simdev_reserve");
    sim_malloc_at = (malloc_at_fn *)dlsym(cudart, "jitckpt_simdev_malloc_at");
    const char *lr = getenv("LOCAL_RANK");
    uint64_t rank = lr && *lr ? strtoull(lr, NULL, 10) % 32 : 0;
    base = env_u64(JITCKPT_PROXY_VA_BASE_ENV, JITCKPT_PROXY_VA_DEFAULT_BASE + rank * (1ull << 40)) & ~(GRAIN - 1);
    size = env_u64(JITCKPT_PROXY_VA_SIZE_ENV, JITCKPT_PROXY_VA_DEFAULT_SIZE) & ~(GRAIN - 1);
    state = -1;
    const char *v = getenv("JITCKPT_PROXY_GPU_VMM");
    if ((!sim_reserve || !sim_malloc_at) && v && strcmp(v, "1") == 0) {
        if (vmm_init() == 0) {
            vmm = state = 1;
            plog("device memory through the driver's VMM API in [0x%llx, +0x%llx) (JITCKPT_PROXY_GPU_VMM=1: "
                 "unverified on GPU)", (unsigned long long)base, (unsigned long long)size);
        } else {
            plog("JITCKPT_PROXY_GPU_VMM=1 but the driver's VMM API or the address range is not available: "
                 "allocations are not at fixed addresses; a proxy restart will be refused");
        }
        return;
    }
    if (!sim_reserve || !sim_malloc_at) {
        plog("device allocations are not at fixed addresses: this CUDA runtime has no allocation-at-address "
             "extension (the driver VMM path is not built yet); a proxy restart will be refused");
        return;
    }
    cudaError_t err = sim_reserve((void *)(uintptr_t)base, size);
    if (err != cudaSuccess) {
        plog("cannot reserve the device address range [0x%llx, +0x%llx) (error %d; set "
             JITCKPT_PROXY_VA_BASE_ENV "): allocations are not at fixed addresses; a proxy restart will be refused",
             (unsigned long long)base, (unsigned long long)size, (int)err);
        return;
    }
    state = 1;
    pdebug("device memory in [0x%llx, +0x%llx)", (unsigned long long)base, (unsigned long long)size);
}

int devmem_info(uint64_t *b, uint64_t *s)
{
    init();
    *b = base;
    *s = size;
    return state == 1;
}

static int insert(uint64_t addr, uint64_t len, uint64_t handle)
{
    if (nused == capused) {
        size_t nc = capused ? capused * 2 : 256;
        struct range *n = realloc(used, nc * sizeof *n);
        if (!n)
            return -1;
        used = n;
        capused = nc;
    }
    size_t i = 0;
    while (i < nused && used[i].addr < addr)
        i++;
    memmove(&used[i + 1], &used[i], (nused - i) * sizeof *used);
    used[i] = (struct range){addr, len, handle};
    nused++;
    return 0;
}

/* cudaMalloc in the range, first fit. */
int32_t devmem_malloc(void **ptr, size_t n)
{
    init();
    if (!ptr)
        return cudaErrorInvalidValue;
    if (n == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    if (state != 1)
        return rt_malloc(ptr, n);
    uint64_t len = (n + GRAIN - 1) & ~(GRAIN - 1), at = base;
    for (size_t i = 0; i <= nused; i++) {
        uint64_t end = i < nused ? used[i].addr : base + size;
        if (end >= at && end - at >= len)
            break;
        if (i == nused)
            return cudaErrorMemoryAllocation;
        at = used[i].addr + used[i].len;
    }
    uint64_t handle = 0;
    int32_t err = vmm ? vmm_map(at, len, &handle) : (int32_t)sim_malloc_at((void *)(uintptr_t)at, n);
    if (err != cudaSuccess)
        return err;
    if (insert(at, len, handle) != 0) {
        devmem_free((void *)(uintptr_t)at);
        return cudaErrorMemoryAllocation;
    }
    *ptr = (void *)(uintptr_t)at;
    return cudaSuccess;
}

/* Re-creating an allocation of the proxy this one replaces. */
int32_t devmem_malloc_at(void *ptr, size_t n)
{
    init();
    uint64_t at = (uintptr_t)ptr, len = (n + GRAIN - 1) & ~(GRAIN - 1);
    if (state != 1)
        return cudaErrorNotSupported;
    if (n == 0 || at < base || at + len > base + size || (at & (GRAIN - 1)))
        return cudaErrorInvalidValue;
    for (size_t i = 0; i < nused; i++)
        if (used[i].addr < at + len && at < used[i].addr + used[i].len)
            return cudaErrorInvalidValue;
    uint64_t handle = 0;
    int32_t err = vmm ? vmm_map(at, len, &handle) : (int32_t)sim_malloc_at(ptr, n);
    if (err != cudaSuccess)
        return err;
    return insert(at, len, handle) == 0 ? cudaSuccess : cudaErrorMemoryAllocation;
}

int32_t devmem_free(void *ptr)
{
    init();
    if (vmm && ptr) {
        for (size_t i = 0; i < nused; i++)
            if (used[i].addr == (uintptr_t)ptr) {
                cudaError_t err = rt_sync();          /* cudaFree synchronises: queued work may use it */
                if (err != cudaSuccess)
                    return err;
                cu_unmap((CUdeviceptr)used[i].addr, used[i].len);
                cu_release((CUmemGenericAllocationHandle)used[i].handle);
                memmove(&used[i], &used[i + 1], (nused - i - 1) * sizeof *used);
                nused--;
                return cudaSuccess;
            }
    }
    cudaError_t err = rt_free(ptr);
    if (err == cudaSuccess && ptr)
        for (size_t i = 0; i < nused; i++)
            if (used[i].addr == (uintptr_t)ptr) {
                memmove(&used[i], &used[i + 1], (nused - i - 1) * sizeof *used);
                nused--;
                break;
            }
    return err;
}

/* After cudaDeviceReset: the runtime dropped the device's allocations (the
 * emulator keeps the range reserved), so the ranges it no longer knows are free
 * again.  On the VMM path (UNVERIFIED ON GPU) every mapping is released: the
 * proxy serves one device there. */
void devmem_after_reset(void)
{
    init();
    for (size_t i = nused; i-- > 0;) {
        int gone = 1;
        if (vmm) {
            cu_unmap((CUdeviceptr)used[i].addr, used[i].len);
            cu_release((CUmemGenericAllocationHandle)used[i].handle);
        } else {
            struct cudaPointerAttributes a;
            gone = !rt_attrs || rt_attrs(&a, (void *)(uintptr_t)used[i].addr) != cudaSuccess ||
                   a.type != cudaMemoryTypeDevice;
        }
        if (gone) {
            memmove(&used[i], &used[i + 1], (nused - i - 1) * sizeof *used);
            nused--;
        }
    }
}

/* 1 if p is the start of an allocation in the range (or the range is not in use:
 * the runtime's own cudaMalloc, which cudaFree checks itself). */
int devmem_is_allocation(void *p)
{
    init();
    if (state != 1)
        return 1;
    for (size_t i = 0; i < nused; i++)
        if (used[i].addr == (uintptr_t)p)
            return 1;
    return 0;
}
