/* blas.c -- what the worker keeps about each cuBLAS handle (issue 19).
 *
 * A cuBLAS handle is a virtual handle (proxy_server/src/handles.c); the
 * worker remembers two of its settings, because its own stubs need them:
 *
 *  - the pointer mode: in host mode a GEMM's alpha and beta are host memory,
 *    copied to the proxy with the call; in device mode they are device
 *    addresses, which cross unchanged (api_facts.py: the size expression of
 *    their host_in is remote_blas_scalar_bytes);
 *  - the stream: cublasGetStream_v2 is answered here.
 *
 * Read and written under the library's call lock (the stubs' `after` and
 * size expressions run between remote_begin and remote_end), so no lock of
 * its own. */

#include "remote.h"
#include "track.h"

#ifdef JITCKPT_REMOTE_CUBLAS

#include <stdlib.h>

struct blas_handle {
    cublasHandle_t handle;
    cublasPointerMode_t mode;
    cudaStream_t stream;
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
    handles[n_handles++] = (struct blas_handle){*h, CUBLAS_POINTER_MODE_HOST, NULL};
    remote_track_blas_handles(1);
}

void remote_blas_destroyed(cublasHandle_t h)
{
    struct blas_handle *b = find(h);
    if (b == NULL)
        return;
    *b = handles[--n_handles];
    remote_track_blas_handles(-1);
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

#endif
