/* handle.c -- cuDNN handles (cudnnCreate, cudnnDestroy, cudnnSetStream,
 * cudnnGetStream) and the library's version queries.
 *
 * Live handles are kept in a list, so that a NULL, never-created or destroyed
 * handle is CUDNN_STATUS_BAD_PARAM ("invalid (NULL) handle", as the cuDNN
 * documentation puts it) instead of a use after free.  A handle records the
 * current device at its creation and its stream (initially NULL, the legacy
 * default stream).  Queued jobs keep no reference to their handle (they copy
 * what they need), so cudnnDestroy frees it at once; unlike cuDNN it does not
 * synchronise the device (the emulated library calls no cuda* function). */

#include <pthread.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "internal.h"

#define HANDLE_MAGIC 0x6a636b646e6e484eull      /* "jckdnnHN" */

struct cudnnContext {
    uint64_t magic;
    struct cudnnContext *next;
    int device;
    cudaStream_t stream;
};

static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cudnnContext *handles;

/* The live handle `h`, or NULL; call with handles_lock held. */
static struct cudnnContext *find_locked(cudnnHandle_t h)
{
    if (!h)
        return NULL;
    for (struct cudnnContext *c = handles; c; c = c->next)
        if (c == h)
            return c->magic == HANDLE_MAGIC ? c : NULL;
    return NULL;
}

cudnnStatus_t dnn_handle_state(cudnnHandle_t h, struct dnn_handle_state *out)
{
    pthread_mutex_lock(&handles_lock);
    struct cudnnContext *c = find_locked(h);
    if (c && out) {
        out->device = c->device;
        out->stream = c->stream;
    }
    pthread_mutex_unlock(&handles_lock);
    return c ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t *handle)
{
    if (!handle)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnCreate", "handle is NULL");
    *handle = NULL;
    int device = jitckpt_simdev_current_device();
    cudaError_t err = jitckpt_simdev_device_error(device);
    if (err != cudaSuccess)
        return dnn_report(CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate",
                          "device %d is not usable (cuda error %d)", device, (int)err);
    struct cudnnContext *c = calloc(1, sizeof *c);
    if (!c)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    c->magic = HANDLE_MAGIC;
    c->device = device;
    c->stream = NULL;
    pthread_mutex_lock(&handles_lock);
    c->next = handles;
    handles = c;
    pthread_mutex_unlock(&handles_lock);
    *handle = c;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle)
{
    pthread_mutex_lock(&handles_lock);
    struct cudnnContext *c = find_locked(handle);
    if (c) {
        for (struct cudnnContext **p = &handles; *p; p = &(*p)->next)
            if (*p == c) {
                *p = c->next;
                break;
            }
        c->magic = 0;
    }
    pthread_mutex_unlock(&handles_lock);
    if (!c)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy",
                          "handle %p is NULL, was not made by cudnnCreate or is already destroyed",
                          (void *)handle);
    free(c);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId)
{
    pthread_mutex_lock(&handles_lock);
    struct cudnnContext *c = find_locked(handle);
    if (c)
        c->stream = streamId;
    pthread_mutex_unlock(&handles_lock);
    if (!c)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream", "invalid handle %p",
                          (void *)handle);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId)
{
    if (!streamId)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream", "streamId is NULL");
    struct dnn_handle_state st;
    if (dnn_handle_state(handle, &st) != CUDNN_STATUS_SUCCESS)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream", "invalid handle %p",
                          (void *)handle);
    *streamId = st.stream;
    return CUDNN_STATUS_SUCCESS;
}

/* CUDNN_VERSION of the header built against, e.g. 92801 for 9.28.1. */
size_t CUDNNWINAPI cudnnGetVersion(void)
{
    return CUDNN_VERSION;
}

/* The CUDA runtime version the library was built against (CUDART_VERSION). */
size_t CUDNNWINAPI cudnnGetCudartVersion(void)
{
    return CUDART_VERSION;
}

cudnnStatus_t CUDNNWINAPI cudnnGetProperty(libraryPropertyType type, int *value)
{
    if (!value)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnGetProperty", "value is NULL");
    switch (type) {
    case MAJOR_VERSION: *value = CUDNN_MAJOR; return CUDNN_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUDNN_MINOR; return CUDNN_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUDNN_PATCHLEVEL; return CUDNN_STATUS_SUCCESS;
    }
    return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnGetProperty", "unknown property type %d",
                      (int)type);
}
