/* dnn.c -- cuDNN in transparent mode (issue 19): the worker's half.
 *
 * Three kinds of cuDNN object, three treatments:
 *
 *  - a cuDNN handle is a virtual handle (VH_DNN, like a cuBLAS handle); the
 *    worker remembers its device and stream (cudnnGetStream is answered
 *    here), re-creates it in a new proxy under the same id, and sends its
 *    stream again at each minibatch boundary so that a replayed minibatch
 *    starts with it;
 *  - a legacy tensor descriptor (what PyTorch's BatchNorm creates around every
 *    call) never leaves the worker: it is a few integers, set and read here;
 *    a call that uses one carries its contents (jitckpt_remote_wire.h: struct
 *    jitckpt_dnn_tensor) and the proxy makes a temporary descriptor;
 *  - a backend (graph API) descriptor is a virtual handle (VH_DNN_DESC) of a
 *    real descriptor in the proxy: finalizing an execution plan can take
 *    milliseconds, so it is done once, where the plan runs.  Every call that
 *    defined one (create, set, finalize, a get that fills descriptors,
 *    destroy) is kept here in order (the history), and played again to a new
 *    proxy after a restart, under the same ids.  Those calls stay out of the
 *    minibatch call log (calllog.c: LOG_SKIP): a replay finds every
 *    descriptor already made.  A destroyed descriptor that no other one
 *    refers to leaves the history.  The exception is the variant pack (the
 *    device pointers of one execution, which PyTorch makes for every call):
 *    kept here, and carried by the cudnnBackendExecute that uses it, which
 *    is thus one self-contained request (and one call-log record).
 *
 * Calls under the library's call lock (remote_begin .. remote_end); the
 * history and the handle table are only touched there, so no lock of their own. */

#include "remote.h"

#ifdef JITCKPT_REMOTE_CUDNN

#include <stdbool.h>
#include <stdlib.h>

#include "jitckpt_remote_restart.h"

/* remote_stubs.c, generated from cudnn_graph.h: the size of one element of each attribute type */
extern const size_t jitckpt_dnn_type_bytes[];
extern const unsigned jitckpt_dnn_type_count;

/* ---- handles ---------------------------------------------------------------------------- */

struct dnn_handle { cudnnHandle_t handle; int device; cudaStream_t stream; };
static struct dnn_handle *handles;
static size_t n_handles, cap_handles;

static struct dnn_handle *find_handle(cudnnHandle_t h)
{
    for (size_t i = 0; i < n_handles; i++)
        if (handles[i].handle == h)
            return &handles[i];
    return NULL;
}

static int grow(void **items, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 0;
    size_t more = *cap ? 2 * *cap : 16;
    void *p = realloc(*items, more * size);
    if (p == NULL)
        return -1;
    *items = p;
    *cap = more;
    return 0;
}

void remote_dnn_created(cudnnHandle_t *h)
{
    if (h == NULL || find_handle(*h) || grow((void **)&handles, &cap_handles, n_handles, sizeof *handles))
        return;
    handles[n_handles++] = (struct dnn_handle){*h, remote_current_device(), NULL};
}

void remote_dnn_destroyed(cudnnHandle_t h)
{
    struct dnn_handle *d = find_handle(h);
    if (d)
        *d = handles[--n_handles];
}

void remote_dnn_set_stream(cudnnHandle_t h, cudaStream_t stream)
{
    struct dnn_handle *d = find_handle(h);
    if (d)
        d->stream = stream;
}

int remote_dnn_get_stream(cudnnHandle_t h, cudaStream_t *stream)
{
    struct dnn_handle *d = find_handle(h);
    if (d == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    if (stream == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    *stream = d->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* calllog.c, after a minibatch boundary: each handle's stream opens the new minibatch's log. */
void remote_dnn_minibatch_begins(void)
{
    if (n_handles == 0 || !remote_recovery_enabled())
        return;
    for (size_t i = 0; i < n_handles; i++) {
        struct dnn_handle d = handles[i];
        cudnnSetStream(d.handle, d.stream);
    }
}

/* ---- legacy tensor descriptors (kept here) ----------------------------------------------- */

#define TENSOR_MAGIC 0x6a6b4474u                   /* "jkDt" */
struct dnn_tensor { uint32_t magic; struct jitckpt_dnn_tensor t; };

static struct dnn_tensor *tensor_of(const void *p)
{
    const struct dnn_tensor *t = p;
    return t && !JITCKPT_VH_IS_VIRTUAL((uint64_t)(uintptr_t)p) && t->magic == TENSOR_MAGIC ? (struct dnn_tensor *)t
                                                                                             : NULL;
}

EXPORT cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc)
{
    if (tensorDesc == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    struct dnn_tensor *t = calloc(1, sizeof *t);
    if (t == NULL)
        return CUDNN_STATUS_ALLOC_FAILED;
    t->magic = TENSOR_MAGIC;
    *tensorDesc = (cudnnTensorDescriptor_t)t;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
{
    struct dnn_tensor *t = tensor_of(tensorDesc);
    if (tensorDesc == NULL)
        return CUDNN_STATUS_SUCCESS;
    if (t == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    t->magic = 0;
    free(t);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set_nd(cudnnTensorDescriptor_t desc, cudnnDataType_t type, int nb, const int *dims,
                            const int *strides)
{
    struct dnn_tensor *t = tensor_of(desc);
    if (t == NULL || nb <= 0 || dims == NULL || strides == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    if (nb > JITCKPT_DNN_DIM_MAX)
        return CUDNN_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < nb; i++)
        if (dims[i] <= 0 || strides[i] <= 0)
            return CUDNN_STATUS_BAD_PARAM;
    t->t = (struct jitckpt_dnn_tensor){.set = 1, .data_type = type, .nb_dims = nb};
    memcpy(t->t.dims, dims, (size_t)nb * sizeof *dims);
    memcpy(t->t.strides, strides, (size_t)nb * sizeof *strides);
    return CUDNN_STATUS_SUCCESS;
}

/* The packed strides of dims in NCHW order, or in NHWC order (channels last). */
static void packed(int nb, const int *dims, int nhwc, int *strides)
{
    int order[JITCKPT_DNN_DIM_MAX], k = 0;
    if (nhwc && nb >= 3) {            /* innermost first: C, then the spatial dims last to first, then N */
        order[k++] = 1;
        for (int i = nb - 1; i >= 2; i--)
            order[k++] = i;
        order[k++] = 0;
    } else {
        for (int i = nb - 1; i >= 0; i--)
            order[k++] = i;
    }
    int s = 1;
    for (int i = 0; i < nb; i++) {
        strides[order[i]] = s;
        s *= dims[order[i]];
    }
}

EXPORT cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType,
                                                int nbDims, const int dimA[], const int strideA[])
{
    return set_nd(tensorDesc, dataType, nbDims, dimA, strideA);
}

EXPORT cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                                  cudnnDataType_t dataType, int nbDims, const int dimA[])
{
    int strides[JITCKPT_DNN_DIM_MAX];
    if (dimA == NULL || nbDims <= 0 || (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC))
        return CUDNN_STATUS_BAD_PARAM;
    if (nbDims > JITCKPT_DNN_DIM_MAX)
        return CUDNN_STATUS_NOT_SUPPORTED;
    packed(nbDims, dimA, format == CUDNN_TENSOR_NHWC, strides);
    return set_nd(tensorDesc, dataType, nbDims, dimA, strides);
}

EXPORT cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType,
                                                  int n, int c, int h, int w, int nStride, int cStride, int hStride,
                                                  int wStride)
{
    const int dims[4] = {n, c, h, w}, strides[4] = {nStride, cStride, hStride, wStride};
    return set_nd(tensorDesc, dataType, 4, dims, strides);
}

EXPORT cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                                cudnnDataType_t dataType, int n, int c, int h, int w)
{
    const int dims[4] = {n, c, h, w};
    return cudnnSetTensorNdDescriptorEx(tensorDesc, format, dataType, 4, dims);
}

EXPORT cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc, int nbDimsRequested,
                                                cudnnDataType_t *dataType, int *nbDims, int dimA[], int strideA[])
{
    struct dnn_tensor *t = tensor_of(tensorDesc);
    if (t == NULL || nbDimsRequested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (dataType)
        *dataType = (cudnnDataType_t)t->t.data_type;
    if (nbDims)
        *nbDims = t->t.nb_dims;
    for (int i = 0; i < nbDimsRequested && i < t->t.nb_dims; i++) {
        if (dimA)
            dimA[i] = t->t.dims[i];
        if (strideA)
            strideA[i] = t->t.strides[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t *dataType,
                                                int *n, int *c, int *h, int *w, int *nStride, int *cStride,
                                                int *hStride, int *wStride)
{
    struct dnn_tensor *t = tensor_of(tensorDesc);
    if (t == NULL || t->t.nb_dims != 4)
        return CUDNN_STATUS_BAD_PARAM;
    int *out[8] = {n, c, h, w, nStride, cStride, hStride, wStride};
    for (int i = 0; i < 8; i++)
        if (out[i])
            *out[i] = i < 4 ? t->t.dims[i] : t->t.strides[i - 4];
    if (dataType)
        *dataType = (cudnnDataType_t)t->t.data_type;
    return CUDNN_STATUS_SUCCESS;
}

/* As cuDNN documents it: 1xCx1x1 (spatial) or 1xCxHxW (per activation), packed; float for half and
 * bfloat16 data, the data's type otherwise. */
EXPORT cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
                                                   const cudnnTensorDescriptor_t xDesc, cudnnBatchNormMode_t mode)
{
    struct dnn_tensor *x = tensor_of(xDesc);
    if (x == NULL || tensor_of(derivedBnDesc) == NULL || !x->t.set || (x->t.nb_dims != 4 && x->t.nb_dims != 5))
        return CUDNN_STATUS_BAD_PARAM;
    int dims[JITCKPT_DNN_DIM_MAX], strides[JITCKPT_DNN_DIM_MAX];
    for (int i = 0; i < x->t.nb_dims; i++)
        dims[i] = i == 0 ? 1 : i == 1 || mode == CUDNN_BATCHNORM_PER_ACTIVATION ? x->t.dims[i] : 1;
    packed(x->t.nb_dims, dims, 0, strides);
    cudnnDataType_t type = x->t.data_type == CUDNN_DATA_HALF || x->t.data_type == CUDNN_DATA_BFLOAT16
                               ? CUDNN_DATA_FLOAT : (cudnnDataType_t)x->t.data_type;
    return set_nd(derivedBnDesc, type, x->t.nb_dims, dims, strides);
}

/* A tensor a call uses, as the wire carries it (a NULL or unknown descriptor: set 0, which the proxy
 * passes as NULL, so that cuDNN judges it). */
void remote_dnn_put_tensor(struct rcall *c, cudnnTensorDescriptor_t desc)
{
    struct dnn_tensor *t = tensor_of(desc);
    struct jitckpt_dnn_tensor none = {0};
    rc_put(c, t ? &t->t : &none, sizeof none);
}

size_t remote_dnn_scalar_bytes(cudnnTensorDescriptor_t desc, const void *scalar)
{
    struct dnn_tensor *t = tensor_of(desc);
    if (scalar == NULL)
        return 0;
    return t && t->t.data_type == CUDNN_DATA_DOUBLE ? sizeof(double) : sizeof(float);
}

/* ---- variant packs (kept here) ------------------------------------------------------------ */

#define PACK_MAGIC 0x6a6b4470u                     /* "jkDp" */
struct dnn_pack {
    uint32_t magic;
    int finalized;
    int64_t n_uids, n_ptrs, n_inter;
    int64_t uids[JITCKPT_DNN_PACK_MAX];
    void *ptrs[JITCKPT_DNN_PACK_MAX];
    int64_t inter[JITCKPT_DNN_PACK_MAX];
    void *workspace;
};

static struct dnn_pack *pack_of(const void *p)
{
    const struct dnn_pack *k = p;
    return k && !JITCKPT_VH_IS_VIRTUAL((uint64_t)(uintptr_t)p) && k->magic == PACK_MAGIC ? (struct dnn_pack *)k
                                                                                         : NULL;
}

static cudnnStatus_t pack_set(struct dnn_pack *k, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              int64_t count, const void *array)
{
    if (k->finalized)
        return CUDNN_STATUS_NOT_INITIALIZED;
    if (count < 0 || (count > 0 && array == NULL))
        return CUDNN_STATUS_BAD_PARAM;
    switch (name) {
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
    case CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES:
        if (type != CUDNN_TYPE_INT64)
            return CUDNN_STATUS_BAD_PARAM;
        if (count > JITCKPT_DNN_PACK_MAX)
            return CUDNN_STATUS_NOT_SUPPORTED;
        memcpy(name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS ? k->uids : k->inter, array, (size_t)count * 8);
        *(name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS ? &k->n_uids : &k->n_inter) = count;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
        if (type != CUDNN_TYPE_VOID_PTR)
            return CUDNN_STATUS_BAD_PARAM;
        if (count > JITCKPT_DNN_PACK_MAX)
            return CUDNN_STATUS_NOT_SUPPORTED;
        memcpy(k->ptrs, array, (size_t)count * sizeof(void *));
        k->n_ptrs = count;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
        if (type != CUDNN_TYPE_VOID_PTR || count != 1)
            return CUDNN_STATUS_BAD_PARAM;
        memcpy(&k->workspace, array, sizeof(void *));
        return CUDNN_STATUS_SUCCESS;
    default:
        return CUDNN_STATUS_BAD_PARAM;
    }
}

static cudnnStatus_t pack_get(struct dnn_pack *k, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              int64_t requested, int64_t *count, void *array)
{
    const void *src;
    int64_t n;
    size_t size = 8;
    switch (name) {
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: src = k->uids; n = k->n_uids; break;
    case CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES: src = k->inter; n = k->n_inter; break;
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: src = k->ptrs; n = k->n_ptrs; size = sizeof(void *); break;
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE: src = &k->workspace; n = 1; size = sizeof(void *); break;
    default: return CUDNN_STATUS_BAD_PARAM;
    }
    if ((type == CUDNN_TYPE_INT64) != (name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS ||
                                       name == CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES) || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (count)
        *count = n;
    if (array)
        memcpy(array, src, (size_t)(requested < n ? requested : n) * size);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- backend descriptors: the history ----------------------------------------------------- */

enum { H_CREATE, H_SET, H_FINALIZE, H_FILL, H_DESTROY };
struct hrec {
    int op, device;
    uint64_t vid;            /* the descriptor the call is about */
    uint32_t name, type;     /* H_CREATE: the descriptor type in name */
    int64_t count;
    size_t len;
    unsigned char *bytes;    /* H_SET: the elements; H_FILL: the descriptors filled (ids) */
};
static struct hrec *hist;
static size_t n_hist, cap_hist;

static int remember(int op, uint64_t vid, uint32_t name, uint32_t type, int64_t count, const void *bytes, size_t len)
{
    if (grow((void **)&hist, &cap_hist, n_hist, sizeof *hist))
        return -1;
    unsigned char *copy = NULL;
    if (len) {
        if ((copy = malloc(len)) == NULL)
            return -1;
        memcpy(copy, bytes, len);
    }
    hist[n_hist++] = (struct hrec){op, remote_current_device(), vid, name, type, count, len, copy};
    return 0;
}

/* 1 if a record about another descriptor names vid (as an attribute's value, or as a descriptor filled). */
static int referenced(uint64_t vid)
{
    for (size_t i = 0; i < n_hist; i++) {
        const struct hrec *r = &hist[i];
        if (r->vid == vid || !((r->op == H_SET && (r->type == CUDNN_TYPE_BACKEND_DESCRIPTOR)) || r->op == H_FILL))
            continue;
        for (size_t j = 0; j + 8 <= r->len; j += 8) {
            uint64_t v;
            memcpy(&v, r->bytes + j, 8);
            if (v == vid)
                return 1;
        }
    }
    return 0;
}

/* A destroyed descriptor nothing refers to: its records go (a restart need not make it). */
static void forget(uint64_t vid)
{
    if (referenced(vid))
        return;
    size_t k = 0;
    for (size_t i = 0; i < n_hist; i++) {
        if (hist[i].vid == vid)
            free(hist[i].bytes);
        else
            hist[k++] = hist[i];
    }
    n_hist = k;
}

/* The requests, built the same way for the program's call and for a restart's replay. */
static void put_create(struct rcall *c, uint32_t type)
{
    rc_put(c, &type, sizeof type);
}

static void put_set(struct rcall *c, uint64_t vid, uint32_t name, uint32_t type, int64_t count, const void *bytes,
                    size_t len)
{
    rc_put(c, &vid, sizeof vid);
    rc_put(c, &name, sizeof name);
    rc_put(c, &type, sizeof type);
    rc_put(c, &count, sizeof count);
    rc_put(c, bytes, len);
}

static void put_fill(struct rcall *c, uint64_t vid, uint32_t name, int64_t requested, const void *targets,
                     int want_count)
{
    uint32_t type = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    rc_put(c, &vid, sizeof vid);
    rc_put(c, &name, sizeof name);
    rc_put(c, &type, sizeof type);
    rc_put(c, &requested, sizeof requested);
    rc_put_flag(c, want_count);
    rc_put_flag(c, targets != NULL);
    if (targets)
        rc_put(c, targets, (size_t)requested * 8);
}

static size_t type_bytes(cudnnBackendAttributeType_t type)
{
    return (unsigned)type < jitckpt_dnn_type_count ? jitckpt_dnn_type_bytes[type] : 0;
}

#define MAX_ATTR_BYTES (16u * 1024u)

EXPORT cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                  cudnnBackendDescriptor_t *descriptor)
{
    if (descriptor == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    if (descriptorType == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
        struct dnn_pack *k = calloc(1, sizeof *k);
        if (k == NULL)
            return CUDNN_STATUS_ALLOC_FAILED;
        k->magic = PACK_MAGIC;
        *descriptor = (cudnnBackendDescriptor_t)k;
        return CUDNN_STATUS_SUCCESS;
    }
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendCreateDescriptor) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    put_create(&c, (uint32_t)descriptorType);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS) {
        void *vid = NULL;
        rc_get_handle(&c, &vid);
        *descriptor = (cudnnBackendDescriptor_t)vid;
        if (remember(H_CREATE, (uint64_t)(uintptr_t)vid, (uint32_t)descriptorType, 0, 0, NULL, 0))
            rlog("cuDNN: out of memory keeping a descriptor's history: a proxy restart could not re-create it");
    }
    remote_end(&c);
    return ret;
}

EXPORT cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
{
    struct dnn_pack *k = pack_of(descriptor);
    if (k) {
        k->magic = 0;
        free(k);
        return CUDNN_STATUS_SUCCESS;
    }
    if (descriptor == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    uint64_t vid = (uint64_t)(uintptr_t)descriptor;
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendDestroyDescriptor) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    rc_put(&c, &vid, sizeof vid);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS && remember(H_DESTROY, vid, 0, 0, 0, NULL, 0) == 0)
        forget(vid);
    remote_end(&c);
    return ret;
}

EXPORT cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor)
{
    (void)descriptor;
    return CUDNN_STATUS_NOT_SUPPORTED;            /* deprecated in cuDNN 9; PyTorch never calls it */
}

EXPORT cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                              cudnnBackendAttributeName_t attributeName,
                                              cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                              const void *arrayOfElements)
{
    struct dnn_pack *k = pack_of(descriptor);
    if (k)
        return pack_set(k, attributeName, attributeType, elementCount, arrayOfElements);
    size_t size = type_bytes(attributeType);
    if (descriptor == NULL || size == 0 || elementCount < 0 || (elementCount > 0 && arrayOfElements == NULL))
        return CUDNN_STATUS_BAD_PARAM;
    if ((uint64_t)elementCount * size > MAX_ATTR_BYTES) {
        remote_refuse_call("cudnnBackendSetAttribute", "more than 16 KiB of attribute values");
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    size_t len = (size_t)elementCount * size;
    uint64_t vid = (uint64_t)(uintptr_t)descriptor;
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendSetAttribute) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    put_set(&c, vid, attributeName, attributeType, elementCount, arrayOfElements, len);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS &&
        remember(H_SET, vid, attributeName, attributeType, elementCount, arrayOfElements, len))
        rlog("cuDNN: out of memory keeping a descriptor's history: a proxy restart could not re-create it");
    remote_end(&c);
    return ret;
}

EXPORT cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                              cudnnBackendAttributeName_t attributeName,
                                              cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount,
                                              int64_t *elementCount, void *arrayOfElements)
{
    struct dnn_pack *k = pack_of(descriptor);
    if (k)
        return pack_get(k, attributeName, attributeType, requestedElementCount, elementCount, arrayOfElements);
    size_t size = type_bytes(attributeType);
    if (descriptor == NULL || size == 0 || requestedElementCount < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if ((uint64_t)requestedElementCount * size > MAX_ATTR_BYTES) {
        remote_refuse_call("cudnnBackendGetAttribute", "more than 16 KiB of attribute values");
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    uint64_t vid = (uint64_t)(uintptr_t)descriptor;
    int fill = attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR && arrayOfElements != NULL;
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendGetAttribute) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    if (fill) {
        put_fill(&c, vid, attributeName, requestedElementCount, arrayOfElements, elementCount != NULL);
    } else {
        uint32_t name = attributeName, type = attributeType;
        rc_put(&c, &vid, sizeof vid);
        rc_put(&c, &name, sizeof name);
        rc_put(&c, &type, sizeof type);
        rc_put(&c, &requestedElementCount, sizeof requestedElementCount);
        rc_put_flag(&c, elementCount != NULL);
        rc_put_flag(&c, 0);
    }
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS) {
        int64_t n = 0, returned = 0;
        rc_get(&c, &n, sizeof n);
        rc_get(&c, &returned, sizeof returned);
        if (elementCount)
            *elementCount = n;
        if (!fill && arrayOfElements && returned > 0)
            rc_get(&c, arrayOfElements, (size_t)returned * size);
        if (fill && remember(H_FILL, vid, attributeName, attributeType, requestedElementCount, arrayOfElements,
                             (size_t)requestedElementCount * 8))
            rlog("cuDNN: out of memory keeping a descriptor's history: a proxy restart could not re-create it");
    }
    remote_end(&c);
    return ret;
}

EXPORT cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
{
    struct dnn_pack *k = pack_of(descriptor);
    if (k) {
        if (k->finalized)
            return CUDNN_STATUS_BAD_PARAM;
        if (k->n_uids != k->n_ptrs)
            return CUDNN_STATUS_BAD_PARAM;
        k->finalized = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (descriptor == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    uint64_t vid = (uint64_t)(uintptr_t)descriptor;
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendFinalize) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    rc_put(&c, &vid, sizeof vid);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS && remember(H_FINALIZE, vid, 0, 0, 0, NULL, 0))
        rlog("cuDNN: out of memory keeping a descriptor's history: a proxy restart could not re-create it");
    remote_end(&c);
    return ret;
}

EXPORT cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                         cudnnBackendDescriptor_t variantPack)
{
    struct dnn_pack *k = pack_of(variantPack);
    if (k == NULL || !k->finalized || executionPlan == NULL || pack_of(executionPlan))
        return CUDNN_STATUS_BAD_PARAM;
    uint64_t plan = (uint64_t)(uintptr_t)executionPlan;
    struct jitckpt_dnn_pack head = {(uint64_t)(uintptr_t)k->workspace, k->n_uids, k->n_inter};
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendExecute) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    rc_put_handle(&c, handle);
    rc_put(&c, &plan, sizeof plan);
    rc_put(&c, &head, sizeof head);
    rc_put(&c, k->uids, (size_t)k->n_uids * 8);
    rc_put(&c, k->ptrs, (size_t)k->n_uids * sizeof(void *));
    rc_put(&c, k->inter, (size_t)k->n_inter * 8);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    remote_end(&c);
    return ret;
}

/* ---- a new proxy: the handles, then the history ---------------------------------------------- */

static int32_t expect(struct rcall *c, int32_t kind, uint64_t vid)
{
    remote_begin_locked(c, JITCKPT_RFN_RST_EXPECT);
    rc_put(c, &kind, sizeof kind);
    rc_put(c, &vid, sizeof vid);
    return remote_call(c);
}

/* Every live handle, with its stream, then every descriptor's history in order, under the old ids.
 * 0 or the first error.  Called by restart.c (recreate) under the call lock, after the streams. */
int32_t remote_dnn_recreate(struct rcall *c, int32_t (*set_device)(struct rcall *c, int device))
{
    int32_t err;
    for (size_t i = 0; i < n_handles; i++) {
        struct dnn_handle *d = &handles[i];
        if ((err = set_device(c, d->device)) || (err = expect(c, VH_DNN, (uint64_t)(uintptr_t)d->handle)))
            return err;
        remote_begin_locked(c, RFN_cudnnCreate);
        rc_put_flag(c, 1);
        if ((err = remote_call(c)))
            return err;
        void *again = NULL;
        rc_get_handle(c, &again);
        if (again != (void *)d->handle)
            return CUDNN_STATUS_INTERNAL_ERROR;
        remote_begin_locked(c, RFN_cudnnSetStream);
        rc_put_handle(c, d->handle);
        rc_put_handle(c, d->stream);
        if ((err = remote_call(c)))
            return err;
    }
    int device = -1;
    for (size_t i = 0; i < n_hist; i++) {
        const struct hrec *r = &hist[i];
        if (r->device != device && (err = set_device(c, device = r->device)))
            return err;
        switch (r->op) {
        case H_CREATE:
            if ((err = expect(c, VH_DNN_DESC, r->vid)))
                return err;
            remote_begin_locked(c, RFN_cudnnBackendCreateDescriptor);
            put_create(c, r->name);
            if ((err = remote_call(c)))
                return err;
            void *again = NULL;
            rc_get_handle(c, &again);
            if ((uint64_t)(uintptr_t)again != r->vid)
                return CUDNN_STATUS_INTERNAL_ERROR;
            continue;
        case H_SET:
            remote_begin_locked(c, RFN_cudnnBackendSetAttribute);
            put_set(c, r->vid, r->name, r->type, r->count, r->bytes, r->len);
            break;
        case H_FINALIZE:
        case H_DESTROY:
            remote_begin_locked(c, r->op == H_FINALIZE ? RFN_cudnnBackendFinalize : RFN_cudnnBackendDestroyDescriptor);
            rc_put(c, &r->vid, sizeof r->vid);
            break;
        case H_FILL:
            remote_begin_locked(c, RFN_cudnnBackendGetAttribute);
            put_fill(c, r->vid, r->name, r->count, r->bytes, 0);
            break;
        }
        if ((err = remote_call(c)))
            return err;
    }
    return 0;
}

#endif
