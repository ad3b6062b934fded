/* tensor.c -- the legacy tensor descriptors (cudnnCreateTensorDescriptor,
 * cudnnSetTensor4dDescriptor[Ex], cudnnSetTensorNdDescriptor,
 * cudnnGetTensorNdDescriptor, cudnnDestroyTensorDescriptor), as PyTorch's
 * BatchNorm sets them, and the helpers that check a tensor's memory.
 *
 * As documented: dimensions (and here strides) must be positive and the data
 * type a cudnnDataType_t (else CUDNN_STATUS_BAD_PARAM); nbDims outside [4,
 * CUDNN_DIM_MAX] is CUDNN_STATUS_NOT_SUPPORTED, as is the NCHW_VECT_C format.
 * A NULL, never-created or destroyed descriptor is BAD_PARAM (live
 * descriptors are kept in a list). */

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define TENSOR_MAGIC 0x6a636b646e6e5444ull      /* "jckdnnTD" */

static pthread_mutex_t tensors_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cudnnTensorStruct *tensors;

int dnn_legacy_tensor(cudnnTensorDescriptor_t t, struct legacy_tensor *out)
{
    int ok = 0;
    pthread_mutex_lock(&tensors_lock);
    for (struct cudnnTensorStruct *p = tensors; t && p; p = p->next)
        if (p == t) {
            ok = p->magic == TENSOR_MAGIC;
            if (ok && out)
                *out = p->t;
            break;
        }
    pthread_mutex_unlock(&tensors_lock);
    return ok;
}

/* Runs `body` on the live descriptor `d` under the lock; `status` is
 * BAD_PARAM without one. */
#define WITH_TENSOR(api, desc, body)                                                        \
    do {                                                                                    \
        cudnnStatus_t status = CUDNN_STATUS_BAD_PARAM;                                      \
        pthread_mutex_lock(&tensors_lock);                                                  \
        struct cudnnTensorStruct *d = NULL;                                                 \
        for (struct cudnnTensorStruct *p = tensors; (desc) && p; p = p->next)               \
            if (p == (desc) && p->magic == TENSOR_MAGIC)                                    \
                d = p;                                                                      \
        if (d) {                                                                            \
            status = CUDNN_STATUS_SUCCESS;                                                  \
            body;                                                                           \
        }                                                                                   \
        pthread_mutex_unlock(&tensors_lock);                                                \
        if (!d)                                                                             \
            return dnn_report(CUDNN_STATUS_BAD_PARAM, api,                                  \
                              "tensor descriptor %p is NULL, unknown or destroyed",         \
                              (void *)(desc));                                              \
        return status;                                                                      \
    } while (0)

cudnnStatus_t CUDNNWINAPI cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc)
{
    if (!tensorDesc)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnCreateTensorDescriptor", "tensorDesc is NULL");
    struct cudnnTensorStruct *d = calloc(1, sizeof *d);
    if (!d)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    d->magic = TENSOR_MAGIC;
    pthread_mutex_lock(&tensors_lock);
    d->next = tensors;
    tensors = d;
    pthread_mutex_unlock(&tensors_lock);
    *tensorDesc = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
{
    /* Destroying NULL is a no-op, as in cuDNN. */
    if (!tensorDesc)
        return CUDNN_STATUS_SUCCESS;
    struct cudnnTensorStruct *found = NULL;
    pthread_mutex_lock(&tensors_lock);
    for (struct cudnnTensorStruct **p = &tensors; *p; p = &(*p)->next)
        if (*p == tensorDesc && (*p)->magic == TENSOR_MAGIC) {
            found = *p;
            *p = found->next;
            found->magic = 0;
            break;
        }
    pthread_mutex_unlock(&tensors_lock);
    if (!found)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnDestroyTensorDescriptor",
                          "tensor descriptor %p is unknown or already destroyed", (void *)tensorDesc);
    free(found);
    return CUDNN_STATUS_SUCCESS;
}

static int valid_dtype(cudnnDataType_t t)
{
    return (int)t >= CUDNN_DATA_FLOAT && (int)t <= CUDNN_DATA_FP8_E5M3;
}

/* Validates and fills `out` from nbDims dims and strides. */
static cudnnStatus_t make(const char *api, cudnnDataType_t dataType, int nbDims, const int *dimA, const int *strideA,
                          struct legacy_tensor *out)
{
    if (!valid_dtype(dataType))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "unknown data type %d", (int)dataType);
    if (nbDims < 4 || nbDims > DNN_MAX_DIMS)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, api, "nbDims %d is outside [4, %d]", nbDims, DNN_MAX_DIMS);
    if (!dimA || !strideA)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "dimA or strideA is NULL");
    int64_t elements = 1;
    for (int i = 0; i < nbDims; i++) {
        if (dimA[i] <= 0 || strideA[i] <= 0)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "dimension %d is %d with stride %d: both must be positive",
                              i, dimA[i], strideA[i]);
        elements *= dimA[i];
    }
    if (elements > INT32_MAX)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, api, "%lld elements: beyond the 2 Giga-element limit",
                          (long long)elements);
    out->dtype = dataType;
    out->nd = nbDims;
    for (int i = 0; i < nbDims; i++) {
        out->dims[i] = dimA[i];
        out->strides[i] = strideA[i];
    }
    out->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType,
                                                     int nbDims, const int dimA[], const int strideA[])
{
    static const char api[] = "cudnnSetTensorNdDescriptor";
    struct legacy_tensor t;
    cudnnStatus_t s = make(api, dataType, nbDims, dimA, strideA, &t);
    if (s)
        return s;
    WITH_TENSOR(api, tensorDesc, d->t = t);
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType,
                                                       int n, int c, int h, int w, int nStride, int cStride,
                                                       int hStride, int wStride)
{
    static const char api[] = "cudnnSetTensor4dDescriptorEx";
    const int dims[4] = {n, c, h, w}, strides[4] = {nStride, cStride, hStride, wStride};
    struct legacy_tensor t;
    cudnnStatus_t s = make(api, dataType, 4, dims, strides, &t);
    if (s)
        return s;
    WITH_TENSOR(api, tensorDesc, d->t = t);
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                                     cudnnDataType_t dataType, int n, int c, int h, int w)
{
    static const char api[] = "cudnnSetTensor4dDescriptor";
    const int dims[4] = {n, c, h, w};
    int strides[4];
    if (format == CUDNN_TENSOR_NCHW) {
        strides[3] = 1;
        strides[2] = w;
        strides[1] = h * w;
        strides[0] = c * h * w;
    } else if (format == CUDNN_TENSOR_NHWC) {
        strides[1] = 1;
        strides[3] = c;
        strides[2] = w * c;
        strides[0] = h * w * c;
    } else if (format == CUDNN_TENSOR_NCHW_VECT_C) {
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, api, "CUDNN_TENSOR_NCHW_VECT_C is not implemented");
    } else {
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "unknown format %d", (int)format);
    }
    struct legacy_tensor t;
    cudnnStatus_t s = make(api, dataType, 4, dims, strides, &t);
    if (s)
        return s;
    WITH_TENSOR(api, tensorDesc, d->t = t);
}

cudnnStatus_t CUDNNWINAPI cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc, int nbDimsRequested,
                                                     cudnnDataType_t *dataType, int *nbDims, int dimA[],
                                                     int strideA[])
{
    static const char api[] = "cudnnGetTensorNdDescriptor";
    if (nbDimsRequested < 0 || !dataType || !nbDims || (nbDimsRequested > 0 && (!dimA || !strideA)))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "nbDimsRequested %d or a NULL output pointer",
                          nbDimsRequested);
    WITH_TENSOR(api, tensorDesc, {
        *dataType = (cudnnDataType_t)d->t.dtype;
        *nbDims = d->t.nd;
        for (int i = 0; i < nbDimsRequested && i < d->t.nd; i++) {
            dimA[i] = (int)d->t.dims[i];
            strideA[i] = (int)d->t.strides[i];
        }
    });
}

/* ---- memory checks ---------------------------------------------------------------------- */

int dnn_extent(int nd, const int64_t *dims, const int64_t *strides, int64_t *lo, int64_t *hi)
{
    int64_t l = 0, h = 0;
    for (int i = 0; i < nd; i++) {
        int64_t step;
        if (dims[i] <= 0)
            return -1;
        if (__builtin_mul_overflow(dims[i] - 1, strides[i], &step))
            return -1;
        if (step < 0 ? __builtin_add_overflow(l, step, &l) : __builtin_add_overflow(h, step, &h))
            return -1;
    }
    *lo = l;
    *hi = h;
    return 0;
}

cudnnStatus_t dnn_check_tensor(const char *api, const char *what, const void *p, int nd, const int64_t *dims,
                               const int64_t *strides, size_t es)
{
    int64_t lo, hi, bytes;
    if (dnn_extent(nd, dims, strides, &lo, &hi) ||
        __builtin_mul_overflow(hi - lo + 1, (int64_t)es, &bytes))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "tensor %s is too large", what);
    if (!p)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "%s is NULL", what);
    if (jitckpt_simdev_check_range(p, 1) != cudaSuccess)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api,
                          "%s %p is not memory of the emulated device (allocate it with cudaMalloc)", what, p);
    if (jitckpt_simdev_check_range((const char *)p + lo * (int64_t)es, (size_t)bytes) != cudaSuccess)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "%s %p: the tensor (%lld bytes) runs past the end of its "
                          "allocation", what, p, (long long)bytes);
    return CUDNN_STATUS_SUCCESS;
}
