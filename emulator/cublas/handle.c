/* handle.c -- cuBLAS handles: creation, destruction and the per-handle
 * settings (stream, pointer mode, math mode, workspace).
 *
 * Live handles are kept in a list, so that a NULL, never-created or destroyed
 * handle is CUBLAS_STATUS_NOT_INITIALIZED instead of a use after free: a call
 * only compares the handle with the list, under the lock, before it reads it.
 * Queued GEMM jobs keep no reference to their handle (they copy what they
 * need), so cublasDestroy_v2 frees it at once and does not synchronise. */

#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

#define HANDLE_MAGIC 0x6a6974636b63626cull

struct cublasContext {
    uint64_t magic;
    struct cublasContext *next;
    int device;
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math_mode;
    void *workspace;            /* recorded; the emulator needs none */
    size_t workspace_bytes;
};

static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cublasContext *handles;

/* The live handle `h`, or NULL; call with handles_lock held. */
static struct cublasContext *find_locked(cublasHandle_t h)
{
    if (!h)
        return NULL;
    for (struct cublasContext *c = handles; c; c = c->next)
        if (c == h)
            return c->magic == HANDLE_MAGIC ? c : NULL;
    return NULL;
}

cublasStatus_t handle_state(cublasHandle_t handle, struct handle_state *out)
{
    pthread_mutex_lock(&handles_lock);
    struct cublasContext *c = find_locked(handle);
    if (c) {
        out->device = c->device;
        out->stream = c->stream;
        out->pointer_mode = c->pointer_mode;
        out->math_mode = c->math_mode;
    }
    pthread_mutex_unlock(&handles_lock);
    return c ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return report(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate_v2", "handle is NULL");
    *handle = NULL;
    int device = jitckpt_simdev_current_device();
    cudaError_t err = jitckpt_simdev_device_error(device);
    if (err != cudaSuccess)
        return report(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate_v2",
                      "device %d is not usable (cuda error %d)", device, (int)err);
    struct cublasContext *c = calloc(1, sizeof *c);
    if (!c)
        return CUBLAS_STATUS_ALLOC_FAILED;
    c->magic = HANDLE_MAGIC;
    c->device = device;
    c->stream = NULL;
    c->pointer_mode = CUBLAS_POINTER_MODE_HOST;
    c->math_mode = CUBLAS_DEFAULT_MATH;
    pthread_mutex_lock(&handles_lock);
    c->next = handles;
    handles = c;
    pthread_mutex_unlock(&handles_lock);
    *handle = c;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle)
{
    pthread_mutex_lock(&handles_lock);
    struct cublasContext *c = find_locked(handle);
    if (c) {
        for (struct cublasContext **p = &handles; *p; p = &(*p)->next)
            if (*p == c) {
                *p = c->next;
                break;
            }
        c->magic = 0;
    }
    pthread_mutex_unlock(&handles_lock);
    if (!c)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    free(c);
    return CUBLAS_STATUS_SUCCESS;
}

/* The version does not depend on the handle: any handle, NULL included. */
cublasStatus_t CUBLASWINAPI cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

/* Runs `body` on the live handle `c` under the lock and returns `status`:
 * NOT_INITIALIZED without a live handle (checked first, as cuBLAS does),
 * else SUCCESS unless the body set it to an error. */
#define WITH_HANDLE(handle, body)                                   \
    do {                                                            \
        cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;      \
        pthread_mutex_lock(&handles_lock);                          \
        struct cublasContext *c = find_locked(handle);              \
        if (c) {                                                    \
            status = CUBLAS_STATUS_SUCCESS;                         \
            body;                                                   \
        }                                                           \
        pthread_mutex_unlock(&handles_lock);                        \
        return status;                                              \
    } while (0)

/* As in cuBLAS, setting the stream also resets the workspace to the default. */
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    WITH_HANDLE(handle, {
        c->stream = streamId;
        c->workspace = NULL;
        c->workspace_bytes = 0;
    });
}

cublasStatus_t CUBLASWINAPI cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId)
{
    WITH_HANDLE(handle, {
        if (!streamId)
            status = CUBLAS_STATUS_INVALID_VALUE;
        else
            *streamId = c->stream;
    });
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace,
                                                  size_t workspaceSizeInBytes)
{
    WITH_HANDLE(handle, {
        c->workspace = workspace;
        c->workspace_bytes = workspace ? workspaceSizeInBytes : 0;
    });
}

cublasStatus_t CUBLASWINAPI cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    WITH_HANDLE(handle, {
        if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
            status = CUBLAS_STATUS_INVALID_VALUE;
        else
            c->pointer_mode = mode;
    });
}

cublasStatus_t CUBLASWINAPI cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode)
{
    WITH_HANDLE(handle, {
        if (!mode)
            status = CUBLAS_STATUS_INVALID_VALUE;
        else
            *mode = c->pointer_mode;
    });
}

/* A math mode is one of the base modes, optionally with
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION.  It is recorded only:
 * the emulator computes single precision in full FP32 whatever the mode. */
static int valid_math_mode(cublasMath_t mode)
{
    unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    switch (base) {
    case CUBLAS_DEFAULT_MATH:
    case CUBLAS_TENSOR_OP_MATH:
    case CUBLAS_PEDANTIC_MATH:
    case CUBLAS_TF32_TENSOR_OP_MATH:
    case CUBLAS_FP32_EMULATED_BF16X9_MATH:
    case CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH:
        return 1;
    default:
        return 0;
    }
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    WITH_HANDLE(handle, {
        if (!valid_math_mode(mode))
            status = CUBLAS_STATUS_INVALID_VALUE;
        else
            c->math_mode = mode;
    });
}

cublasStatus_t CUBLASWINAPI cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    WITH_HANDLE(handle, {
        if (!mode)
            status = CUBLAS_STATUS_INVALID_VALUE;
        else
            *mode = c->math_mode;
    });
}
