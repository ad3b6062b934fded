/* handle.c -- cuBLASLt handles (cublasLtCreate, cublasLtDestroy) and the
 * library's version queries.
 *
 * cuBLAS documents that any cublasHandle_t may be used as a
 * cublasLtHandle_t, and PyTorch does exactly that: it passes its cuBLAS
 * handle, cast, to every cublasLt call.  The emulated Lt therefore treats a
 * handle as opaque: the Lt calls only require it to be non-NULL (NULL is
 * CUBLAS_STATUS_NOT_INITIALIZED) and never read it, since everything they need
 * (the stream included) comes with the call.  cublasLtDestroy frees only
 * handles that cublasLtCreate made and are still live; anything else (a cuBLAS
 * handle, a destroyed one) is NOT_INITIALIZED and left alone. */

#include <pthread.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "internal.h"

#define LT_HANDLE_MAGIC 0x6a636b4c74484e44ull      /* "jckLtHND" */

struct cublasLtContext {
    uint64_t magic;
    struct cublasLtContext *next;
    int device;                 /* current device at creation, recorded */
};

static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cublasLtContext *handles;

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "lightHandle is NULL");
    *lightHandle = NULL;
    int device = jitckpt_simdev_current_device();
    cudaError_t err = jitckpt_simdev_device_error(device);
    if (err != cudaSuccess)
        return lt_report(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtCreate",
                         "device %d is not usable (cuda error %d)", device, (int)err);
    struct cublasLtContext *c = calloc(1, sizeof *c);
    if (!c)
        return CUBLAS_STATUS_ALLOC_FAILED;
    c->magic = LT_HANDLE_MAGIC;
    c->device = device;
    pthread_mutex_lock(&handles_lock);
    c->next = handles;
    handles = c;
    pthread_mutex_unlock(&handles_lock);
    *lightHandle = c;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    struct cublasLtContext *found = NULL;
    pthread_mutex_lock(&handles_lock);
    for (struct cublasLtContext **p = &handles; lightHandle && *p; p = &(*p)->next)
        if (*p == lightHandle) {
            found = *p;
            *p = found->next;
            found->magic = 0;
            break;
        }
    pthread_mutex_unlock(&handles_lock);
    if (!found)
        return lt_report(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy",
                         "handle %p was not made by cublasLtCreate or is already destroyed",
                         (void *)lightHandle);
    free(found);
    return CUBLAS_STATUS_SUCCESS;
}

/* The cuBLAS version of the header built against, e.g. 131000 (as
 * cublasGetVersion_v2 of the emulated cuBLAS). */
size_t CUBLASWINAPI cublasLtGetVersion(void)
{
    return CUBLAS_VERSION;
}

/* The CUDA runtime version the library was built against (CUDART_VERSION). */
size_t CUBLASWINAPI cublasLtGetCudartVersion(void)
{
    return CUDART_VERSION;
}
