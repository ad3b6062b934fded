/* blas.c -- what the worker keeps about each cuBLAS handle (issue 19).
 *
 * A cuBLAS handle is a virtual handle (proxy_server/src/handles.c); the
 * worker remembers its device and settings:
 *
 *  - the pointer mode: in host mode a GEMM's alpha and beta are host memory,
 *    copied to the proxy with the call; in device mode they are device
 *    addresses, which cross unchanged (api_facts.py: the size expression of
 *    their host_in is remote_blas_scalar_bytes);
 *  - the stream: cublasGetStream_v2 is answered here;
 *  - with the math mode and the workspace, everything a new proxy needs to
 *    re-create the handle under the same virtual id after a restart or a
 *    recovery (remote_blas_recreate, called by restart.c): the handle
 *    through an ordinary cublasCreate_v2 after JITCKPT_RFN_RST_EXPECT, then
 *    its settings through the ordinary calls, in the order cuBLAS allows;
 *  - at each minibatch boundary (jitckpt_phase_optimizer_end) the settings
 *    are sent again, so that they open the new minibatch's call log: a
 *    replay from the start of any minibatch in the log first puts every
 *    handle back as it was then (a program that switches the pointer mode
 *    around its optimizer step would otherwise replay its forward GEMMs in
 *    the wrong mode: tests/proxy_programs/blas_train.cpp).
 *
 * Read and written under the library's call lock (the stubs' `after` and
 * size expressions run between remote_begin and remote_end), so no lock of
 * its own. */

#include "remote.h"

#ifdef JITCKPT_REMOTE_CUBLAS

#include <stdlib.h>

#include "jitckpt_remote_restart.h"

struct blas_handle {
    cublasHandle_t handle;
    int device;
    cublasPointerMode_t mode;
    cudaStream_t stream;
    cublasMath_t math;
    int math_set;
    void *workspace;
    size_t workspace_bytes;
    int workspace_set;
};

static struct blas_handle *handles;
static size_t n_handles, cap_handles;

static struct blas_handle *find(cublasHandle_t h)
{
    for (size_t i = 0; i < n_handles; i++)
        if (handles[i].handle == h)
            return &handles[i];
    return NULL;
}

void remote_blas_created(cublasHandle_t *h)
{
    if (h == NULL || find(*h))
        return;
    if (n_handles == cap_handles) {
        size_t cap = cap_handles ? 2 * cap_handles : 8;
        struct blas_handle *more = realloc(handles, cap * sizeof *more);
        if (more == NULL)
            return;                      /* unknown handles count as host mode, stream 0 */
        handles = more;
        cap_handles = cap;
    }
    handles[n_handles++] = (struct blas_handle){.handle = *h, .device = remote_current_device(),
                                                .mode = CUBLAS_POINTER_MODE_HOST};
}

void remote_blas_destroyed(cublasHandle_t h)
{
    struct blas_handle *b = find(h);
    if (b == NULL)
        return;
    *b = handles[--n_handles];
}

void remote_blas_set_pointer_mode(cublasHandle_t h, cublasPointerMode_t mode)
{
    struct blas_handle *b = find(h);
    if (b)
        b->mode = mode;
}

void remote_blas_set_stream(cublasHandle_t h, cudaStream_t stream)
{
    struct blas_handle *b = find(h);
    if (b)
        b->stream = stream;
}

void remote_blas_set_math_mode(cublasHandle_t h, cublasMath_t mode)
{
    struct blas_handle *b = find(h);
    if (b) {
        b->math = mode;
        b->math_set = 1;
    }
}

void remote_blas_set_workspace(cublasHandle_t h, void *workspace, size_t bytes)
{
    struct blas_handle *b = find(h);
    if (b) {
        b->workspace = workspace;
        b->workspace_bytes = bytes;
        b->workspace_set = 1;
    }
}

size_t remote_blas_scalar_bytes(cublasHandle_t h, const void *scalar, size_t host_bytes)
{
    struct blas_handle *b = find(h);
    /* 0: the pointer crosses as it is (a device address, or NULL, which cuBLAS rejects itself) */
    return scalar == NULL || (b && b->mode == CUBLAS_POINTER_MODE_DEVICE) ? 0 : host_bytes;
}

int remote_blas_get_stream(cublasHandle_t h, cudaStream_t *stream)
{
    struct blas_handle *b = find(h);
    if (b == NULL)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    *stream = b->stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* calllog.c, after a minibatch boundary (outside the call lock): the settings open the new segment. */
void remote_blas_minibatch_begins(void)
{
    if (n_handles == 0 || !remote_recovery_enabled())
        return;
    for (size_t i = 0; i < n_handles; i++) {
        struct blas_handle b = handles[i];     /* (the calls below write the same values back) */
        cublasSetStream_v2(b.handle, b.stream);
        cublasSetPointerMode_v2(b.handle, b.mode);
        if (b.math_set)
            cublasSetMathMode(b.handle, b.math);
    }
}

/* Every live handle in the new proxy under its old id, with its settings; 0 or the first error.
 * Called by restart.c (recreate) under the call lock, after the allocations and streams. */
int32_t remote_blas_recreate(struct rcall *c, int32_t (*set_device)(struct rcall *c, int device))
{
    for (size_t i = 0; i < n_handles; i++) {
        struct blas_handle *b = &handles[i];
        int32_t err = set_device(c, b->device);
        if (err)
            return err;
        int32_t kind = VH_BLAS;
        uint64_t vid = (uint64_t)(uintptr_t)b->handle;
        remote_begin_locked(c, JITCKPT_RFN_RST_EXPECT);
        rc_put(c, &kind, sizeof kind);
        rc_put(c, &vid, sizeof vid);
        if ((err = remote_call(c)))
            return err;
        remote_begin_locked(c, RFN_cublasCreate_v2);
        rc_put_flag(c, 1);
        if ((err = remote_call(c)))
            return err;
        void *again = NULL;
        rc_get_handle(c, &again);
        if (again != (void *)b->handle)
            return CUBLAS_STATUS_INTERNAL_ERROR;
        remote_begin_locked(c, RFN_cublasSetStream_v2);
        rc_put_handle(c, b->handle);
        rc_put_handle(c, b->stream);
        if ((err = remote_call(c)))
            return err;
        remote_begin_locked(c, RFN_cublasSetPointerMode_v2);
        rc_put_handle(c, b->handle);
        rc_put(c, &b->mode, sizeof b->mode);
        if ((err = remote_call(c)))
            return err;
        if (b->math_set) {
            remote_begin_locked(c, RFN_cublasSetMathMode);
            rc_put_handle(c, b->handle);
            rc_put(c, &b->math, sizeof b->math);
            if ((err = remote_call(c)))
                return err;
        }
        if (b->workspace_set) {
            remote_begin_locked(c, RFN_cublasSetWorkspace_v2);
            rc_put_handle(c, b->handle);
            rc_put(c, &b->workspace, sizeof b->workspace);
            rc_put(c, &b->workspace_bytes, sizeof b->workspace_bytes);
            if ((err = remote_call(c)))
                return err;
        }
    }
    return 0;
}

#endif
