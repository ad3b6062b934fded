/* alloc.c -- the allocators other than cudaMalloc, placed like it in the
 * proxy's reserved range (devmem.c), so that a restarted proxy re-creates them
 * at the same addresses; and cudaDeviceReset, after which that range's
 * bookkeeping must forget what the runtime dropped.
 *
 * The wire is the generated one (api_facts.py); only the proxy's half is
 * hand-written here, as special.c does for cudaMalloc:
 *   cudaMallocPitch  the runtime's own pitch for the width (asked with a
 *                    throw-away allocation), then pitch * height in the range;
 *   cudaMallocAsync  allocated at once, in the range (a stream-ordered
 *                    allocation may be usable earlier than the program asks);
 *                    on a capturing stream the runtime's own (a memory node
 *                    of the graph; graphs are not restartable anyway);
 *   cudaFreeAsync    returns at once, as the runtime's does (waiting in the
 *                    proxy could wait for ever behind a host function that
 *                    waits for the program); the memory is freed at the next
 *                    device-wide synchronisation (the program's
 *                    cudaDeviceSynchronize, a restart's, a recovery's,
 *                    validation's), when no queued work can use it any more,
 *                    or when an allocation does not fit without it (cudaFree
 *                    itself synchronises the device);
 *   ncclMemAlloc/ncclMemFree  device memory in the range as well. */

#include "dispatch.h"

#include <stdlib.h>

static __typeof__(cudaMallocPitch) *rt_malloc_pitch;
static __typeof__(cudaFree) *rt_free;
static __typeof__(cudaDeviceReset) *rt_reset;
static __typeof__(cudaStreamIsCapturing) *rt_is_capturing;
static __typeof__(cudaMallocAsync) *rt_malloc_async;
static __typeof__(cudaFreeAsync) *rt_free_async;

static void **deferred;          /* cudaFreeAsync's pointers, freed when the device is idle */
static size_t ndeferred, cap_deferred;

static int resolve(void)
{
    if (rt_reset)
        return 0;
    rt_malloc_pitch = (__typeof__(cudaMallocPitch) *)proxy_sym(cudart, "cudaMallocPitch");
    rt_free = (__typeof__(cudaFree) *)proxy_sym(cudart, "cudaFree");
    rt_reset = (__typeof__(cudaDeviceReset) *)proxy_sym(cudart, "cudaDeviceReset");
    rt_is_capturing = (__typeof__(cudaStreamIsCapturing) *)proxy_sym(cudart, "cudaStreamIsCapturing");
    rt_malloc_async = (__typeof__(cudaMallocAsync) *)proxy_sym(cudart, "cudaMallocAsync");
    rt_free_async = (__typeof__(cudaFreeAsync) *)proxy_sym(cudart, "cudaFreeAsync");
    return rt_malloc_pitch && rt_free && rt_reset && rt_is_capturing && rt_malloc_async && rt_free_async ? 0 : -1;
}

/* Makes the cudaFreeAsync frees, after a device-wide synchronisation (cudaFree
 * synchronises the device itself: only an idle device frees without waiting). */
void alloc_reap(void)
{
    while (ndeferred > 0)
        devmem_free(deferred[--ndeferred]);
}

/* Adds p to the frees made at the next device-wide synchronisation; 0 or -1. */
static int defer_free(void *p)
{
    if (ndeferred == cap_deferred) {
        size_t n = cap_deferred ? cap_deferred * 2 : 64;
        void **q = realloc(deferred, n * sizeof *q);
        if (q == NULL)
            return -1;
        deferred = q;
        cap_deferred = n;
    }
    deferred[ndeferred++] = p;
    return 0;
}

int alloc_is_deferred(const void *p)
{
    for (size_t i = 0; i < ndeferred; i++)
        if (deferred[i] == p)
            return 1;
    return 0;
}

/* 1 if the real stream is capturing: its allocations become the graph's memory nodes. */
static int capturing(void *stream)
{
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return rt_is_capturing((cudaStream_t)stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

/* devmem_malloc; when it does not fit while frees wait, it synchronises and makes them first. */
static int32_t malloc_now(void **p, size_t size)
{
    int32_t err = devmem_malloc(p, size);
    if (err == cudaErrorMemoryAllocation && ndeferred > 0 && proxy_sync_all() == cudaSuccess)
        err = devmem_malloc(p, size);
    return err;
}

/* cudaDeviceSynchronize (the generated wire: no arguments), then the frees. */
int32_t alloc_device_synchronize(void)
{
    static __typeof__(cudaDeviceSynchronize) *rt_sync;
    if (!rt_sync && (rt_sync = (__typeof__(cudaDeviceSynchronize) *)proxy_sym(cudart, "cudaDeviceSynchronize")) == NULL)
        return cudaErrorSymbolNotFound;
    int32_t err = rt_sync();
    if (err == cudaSuccess && ndeferred > 0)
        err = proxy_sync_all();       /* the frees may be on any device: all of them must be idle */
    return err;
}

static int32_t malloc_pitch(struct rdisp *d)
{
    int want_ptr = rd_flag(d), want_pitch = rd_flag(d);
    size_t width, height, pitch = 0;
    if (rd_get(d, &width, sizeof width) || rd_get(d, &height, sizeof height))
        return RD_BAD;
    if (!want_ptr || !want_pitch)
        return cudaErrorInvalidValue;
    void *probe = NULL;
    int32_t err = rt_malloc_pitch(&probe, &pitch, width, height ? 1 : 0);
    if (err != cudaSuccess)
        return err;
    if (probe && defer_free(probe) != 0)     /* (cudaFree now would wait for the whole device) */
        rt_free(probe);
    if (height && pitch > SIZE_MAX / height)
        return cudaErrorMemoryAllocation;
    void *p = NULL;
    if ((err = malloc_now(&p, pitch * height)) != cudaSuccess)
        return err;
    rd_put(d, &p, sizeof p);
    rd_put(d, &pitch, sizeof pitch);
    return cudaSuccess;
}

static int32_t malloc_async(struct rdisp *d)
{
    int want = rd_flag(d);
    size_t size;
    uint64_t vid;
    void *stream;
    if (rd_get(d, &size, sizeof size))
        return RD_BAD;
    if (rd_get_handle(d, VH_STREAM, &vid, &stream))
        return cudaErrorInvalidResourceHandle;
    void *p = NULL;
    int32_t err = capturing(stream) ? (int32_t)rt_malloc_async(want ? &p : NULL, size, (cudaStream_t)stream)
                                    : malloc_now(want ? &p : NULL, size);
    if (err == cudaSuccess && want)
        rd_put(d, &p, sizeof p);
    return err;
}

static int32_t free_async(struct rdisp *d)
{
    void *p;
    uint64_t vid;
    void *stream;
    if (rd_get(d, &p, sizeof p))
        return RD_BAD;
    if (rd_get_handle(d, VH_STREAM, &vid, &stream))
        return cudaErrorInvalidResourceHandle;
    if (p == NULL)
        return cudaSuccess;
    if (capturing(stream) || !devmem_is_allocation(p))   /* a graph's memory node, or not ours: the runtime's */
        return rt_free_async(p, (cudaStream_t)stream);
    if (alloc_is_deferred(p))
        return cudaErrorInvalidValue;           /* freed twice */
    return defer_free(p) == 0 ? cudaSuccess : cudaErrorMemoryAllocation;
}

static int32_t nccl_mem_alloc(struct rdisp *d)
{
    int want = rd_flag(d);
    size_t size;
    if (rd_get(d, &size, sizeof size))
        return ncclInvalidArgument;
    void *p = NULL;
    if (!want)
        return ncclInvalidArgument;
    if (malloc_now(&p, size) != cudaSuccess)
        return ncclUnhandledCudaError;
    rd_put(d, &p, sizeof p);
    return ncclSuccess;
}

static int32_t nccl_mem_free(struct rdisp *d)
{
    void *p;
    if (rd_get(d, &p, sizeof p))
        return ncclInvalidArgument;
    return devmem_free(p) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

int32_t dispatch_alloc(unsigned fn, struct rdisp *d)
{
    if (resolve() != 0)
        return cudaErrorSymbolNotFound;
    switch (fn) {
    case RFN_cudaMallocPitch: {
        int32_t err = malloc_pitch(d);
        proxy_note_error(err);
        return err;
    }
    case RFN_cudaMallocAsync: {
        int32_t err = malloc_async(d);
        proxy_note_error(err);
        return err;
    }
    case RFN_cudaFreeAsync: return free_async(d);
    case RFN_ncclMemAlloc: return nccl_mem_alloc(d);
    case RFN_ncclMemFree: return nccl_mem_free(d);
    case RFN_cudaDeviceReset: {
        int32_t err = rt_reset();
        if (err == cudaSuccess) {
            ndeferred = 0;              /* the reset dropped that memory: freeing it later would free what is
                                           placed there next */
            devmem_after_reset();
            watch_device_reset();       /* (its events, the proxy's watch events among them, are gone too) */
        }
        return err;
    }
    }
    return RD_BAD;
}
