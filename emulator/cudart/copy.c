/* copy.c -- cudaMemcpy*, cudaMemset* and their asynchronous forms.
 *
 * Every copy and set is stream work, ordered with kernels and collectives.
 * The host-side rules follow the CUDA documentation's "API synchronization
 * behavior":
 *   - cudaMemcpy returns when the copy is done;
 *   - cudaMemcpyAsync from pageable host memory takes a snapshot of the
 *     source before returning (the real runtime stages it), so the caller may
 *     overwrite its buffer at once;
 *   - cudaMemcpyAsync into pageable host memory returns when the copy is
 *     done;
 *   - cudaMemset is asynchronous with respect to the host unless the target
 *     is pinned host or managed memory.
 * "Device" pointers must lie inside an allocation the device can access;
 * anything else is cudaErrorInvalidValue, as on a GPU. */

#include <stdlib.h>
#include <string.h>

#include "simdev.h"

struct copy_job {
    void *dst;
    const void *src;
    void *staging;              /* owned snapshot of a pageable source */
    size_t dpitch, spitch, width, height;
    int value;
    int is_set;
};

static void run_job(void *arg)
{
    struct copy_job *j = arg;
    const char *src = j->staging ? j->staging : j->src;
    size_t spitch = j->staging ? j->width : j->spitch;
    for (size_t row = 0; row < j->height; row++) {
        char *d = (char *)j->dst + row * j->dpitch;
        if (j->is_set)
            memset(d, j->value, j->width);
        else
            memmove(d, src + row * spitch, j->width);
    }
}

static void free_job(void *arg)
{
    struct copy_job *j = arg;
    free(j->staging);
    free(j);
}

/* 1: ptr is in the allocation table (device-accessible); 0: pageable host. */
static int known(const void *ptr, struct simdev_alloc *a)
{
    return ptr && simdev_mem_find(ptr, a);
}

static cudaError_t check_extent(const void *ptr, size_t extent, int must_be_device)
{
    struct simdev_alloc a;
    if (!known(ptr, &a))
        return must_be_device ? simdev_mem_check_device_range(ptr, extent) : cudaSuccess;
    return simdev_mem_check_device_range(ptr, extent);
}

static int needs_sync_on_host(const void *dst, int is_set)
{
    struct simdev_alloc a;
    if (!known(dst, &a))
        return !is_set;          /* pageable destination of a copy */
    return is_set && (a.kind == SIMDEV_MEM_HOST || a.kind == SIMDEV_MEM_REGISTERED ||
                      a.kind == SIMDEV_MEM_MANAGED);
}

/* Validates, submits and (if the rules say so) waits.  The caller has
 * already called simdev_enter and passes its fault hit. */
static cudaError_t submit_job(struct copy_job *j, enum cudaMemcpyKind kind, cudaStream_t stream,
                              int ptds, int async, const struct simdev_fault_hit *hit,
                              const char *op)
{
    size_t dext = j->height ? (j->height - 1) * j->dpitch + j->width : 0;
    size_t sext = j->height ? (j->height - 1) * j->spitch + j->width : 0;
    cudaError_t err = cudaSuccess;

    if (j->width > j->dpitch || (!j->is_set && j->width > j->spitch))
        err = cudaErrorInvalidPitchValue;
    else if (j->is_set)
        err = check_extent(j->dst, dext, 1);
    else if ((int)kind < cudaMemcpyHostToHost || (int)kind > cudaMemcpyDefault)
        err = cudaErrorInvalidMemcpyDirection;
    else {
        int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        err = check_extent(j->dst, dext, dst_dev);
        if (err == cudaSuccess)
            err = check_extent(j->src, sext, src_dev);
    }
    if (err != cudaSuccess) {
        simdev_trace("%s rejected: %s", op, cudaGetErrorName(err));
        free_job(j);
        return err;
    }
    if (dext == 0) {
        free_job(j);
        return cudaSuccess;
    }

    struct simdev_alloc a;
    if (async && !j->is_set && !known(j->src, &a)) {
        /* Pageable source: snapshot it now, as the real runtime's staging does. */
        j->staging = malloc(j->width * j->height);
        if (!j->staging) {
            free_job(j);
            return cudaErrorMemoryAllocation;
        }
        for (size_t row = 0; row < j->height; row++)
            memcpy((char *)j->staging + row * j->width, (const char *)j->src + row * j->spitch,
                   j->width);
    }
    int wait = !async || needs_sync_on_host(j->dst, j->is_set);
    struct simdev_stream *s = NULL;
    uint64_t seq = 0;
    err = simdev_submit_call(stream, ptds, op, run_job, j, free_job, hit, wait ? &s : NULL, &seq);
    if (err != cudaSuccess || !wait)
        return err;
    err = simdev_stream_wait(s, seq);
    simdev_stream_unref(s);
    return err;
}

static struct copy_job *new_job(void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t height)
{
    struct copy_job *j = calloc(1, sizeof *j);
    if (j) {
        j->dst = dst;
        j->src = src;
        j->dpitch = dpitch;
        j->spitch = spitch;
        j->width = width;
        j->height = height;
    }
    return j;
}

cudaError_t simdev_memcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                          cudaStream_t stream, int ptds, int async, const char *op)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter(op, &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct copy_job *j = new_job(dst, n, src, n, n, 1);
    if (!j)
        return simdev_return(cudaErrorMemoryAllocation);
    return simdev_return(submit_job(j, kind, stream, ptds, async, &hit, op));
}

cudaError_t simdev_memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t height, enum cudaMemcpyKind kind,
                            cudaStream_t stream, int ptds, int async, const char *op)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter(op, &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct copy_job *j = new_job(dst, dpitch, src, spitch, width, height);
    if (!j)
        return simdev_return(cudaErrorMemoryAllocation);
    return simdev_return(submit_job(j, kind, stream, ptds, async, &hit, op));
}

cudaError_t simdev_memset(void *dst, int value, size_t n, cudaStream_t stream, int ptds,
                          int async, const char *op)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter(op, &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct copy_job *j = new_job(dst, n, NULL, n, n, 1);
    if (!j)
        return simdev_return(cudaErrorMemoryAllocation);
    j->is_set = 1;
    j->value = value;
    (void)async;                /* both forms are asynchronous for device memory */
    return simdev_return(submit_job(j, cudaMemcpyDefault, stream, ptds, 1, &hit, op));
}

cudaError_t simdev_memset2d(void *dst, size_t pitch, int value, size_t width, size_t height,
                            cudaStream_t stream, int ptds, int async, const char *op)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter(op, &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct copy_job *j = new_job(dst, pitch, NULL, pitch, width, height);
    if (!j)
        return simdev_return(cudaErrorMemoryAllocation);
    j->is_set = 1;
    j->value = value;
    (void)async;
    return simdev_return(submit_job(j, cudaMemcpyDefault, stream, ptds, 1, &hit, op));
}

cudaError_t simdev_memcpy_symbol(const void *symbol, void *host, size_t count, size_t offset,
                                 enum cudaMemcpyKind kind, int to_symbol, cudaStream_t stream,
                                 int ptds, int async, const char *op)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter(op, &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_var *v;
    err = simdev_var_lookup(symbol, &v);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (offset > v->size || count > v->size - offset)
        return simdev_return(cudaErrorInvalidValue);
    if (to_symbol ? (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost)
                  : (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost))
        return simdev_return(cudaErrorInvalidMemcpyDirection);
    char *dev = (char *)v->storage + offset;
    struct copy_job *j = to_symbol ? new_job(dev, count, host, count, count, 1)
                                   : new_job(host, count, dev, count, count, 1);
    if (!j)
        return simdev_return(cudaErrorMemoryAllocation);
    return simdev_return(submit_job(j, cudaMemcpyDefault, stream, ptds, async, &hit, op));
}

/* ---- public entry points (the _ptds/_ptsz forms are in ptds.c) ---------- */

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return simdev_memcpy(dst, src, count, kind, 0, 0, 0, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return simdev_memcpy(dst, src, count, kind, stream, 0, 1, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind)
{
    return simdev_memcpy2d(dst, dpitch, src, spitch, width, height, kind, 0, 0, 0,
                           "cudaMemcpy2D");
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream)
{
    return simdev_memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream, 0, 1,
                           "cudaMemcpy2DAsync");
}

cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
    if (!simdev_valid_device(dstDevice) || !simdev_valid_device(srcDevice))
        return simdev_return(cudaErrorInvalidDevice);
    return simdev_memcpy(dst, src, count, cudaMemcpyDeviceToDevice, 0, 0, 0, "cudaMemcpyPeer");
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
                                size_t count, cudaStream_t stream)
{
    if (!simdev_valid_device(dstDevice) || !simdev_valid_device(srcDevice))
        return simdev_return(cudaErrorInvalidDevice);
    return simdev_memcpy(dst, src, count, cudaMemcpyDeviceToDevice, stream, 0, 1,
                         "cudaMemcpyPeerAsync");
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    return simdev_memset(devPtr, value, count, 0, 0, 0, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return simdev_memset(devPtr, value, count, stream, 0, 1, "cudaMemsetAsync");
}

cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height)
{
    return simdev_memset2d(devPtr, pitch, value, width, height, 0, 0, 0, "cudaMemset2D");
}

cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream)
{
    return simdev_memset2d(devPtr, pitch, value, width, height, stream, 0, 1,
                           "cudaMemset2DAsync");
}

cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                               enum cudaMemcpyKind kind)
{
    return simdev_memcpy_symbol(symbol, (void *)src, count, offset, kind, 1, 0, 0, 0,
                                "cudaMemcpyToSymbol");
}

cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                 enum cudaMemcpyKind kind)
{
    return simdev_memcpy_symbol(symbol, dst, count, offset, kind, 0, 0, 0, 0,
                                "cudaMemcpyFromSymbol");
}

cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count,
                                    size_t offset, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return simdev_memcpy_symbol(symbol, (void *)src, count, offset, kind, 1, stream, 0, 1,
                                "cudaMemcpyToSymbolAsync");
}

cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count, size_t offset,
                                      enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return simdev_memcpy_symbol(symbol, dst, count, offset, kind, 0, stream, 0, 1,
                                "cudaMemcpyFromSymbolAsync");
}
