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

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "jitckpt_remote_restart.h"

/* remote_stubs.c, generated from cudnn_graph.h: the size of one element of each attribute type */
extern const size_t jitckpt_dnn_type_bytes[];
extern const unsigned jitckpt_dnn_type_count;
extern const int jitckpt_dnn_last_data_type;     /* (the largest cudnnDataType_t the header declares) */

#define MAX_ATTR_BYTES (16u * 1024u)      /* the most attribute bytes one call carries */
/* A variant pack's question to the proxy (pack_ask) travels under the id of cudnnBackendInitialize, which
 * this library answers itself and never sends (proxy_server/src/dnn.c reads it so). */
#define RFN_DNN_PACK_ASK RFN_cudnnBackendInitialize

/* ---- handles ---------------------------------------------------------------------------- */

struct dnn_handle { cudnnHandle_t handle; int device; cudaStream_t stream; };
static struct dnn_handle *handles;
static size_t n_handles, cap_handles;
/* Written under the call lock; cudnnGetStream's answer and the minibatch boundary read it without: a lock of
 * its own around every access. */
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;

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
    pthread_mutex_lock(&handles_lock);
    if (h != NULL && !find_handle(*h) && grow((void **)&handles, &cap_handles, n_handles, sizeof *handles) == 0)
        handles[n_handles++] = (struct dnn_handle){*h, remote_current_device(), NULL};
    pthread_mutex_unlock(&handles_lock);
}

void remote_dnn_destroyed(cudnnHandle_t h)
{
    pthread_mutex_lock(&handles_lock);
    struct dnn_handle *d = find_handle(h);
    if (d)
        *d = handles[--n_handles];
    pthread_mutex_unlock(&handles_lock);
}

void remote_dnn_set_stream(cudnnHandle_t h, cudaStream_t stream)
{
    pthread_mutex_lock(&handles_lock);
    struct dnn_handle *d = find_handle(h);
    if (d)
        d->stream = stream;
    pthread_mutex_unlock(&handles_lock);
}

int remote_dnn_get_stream(cudnnHandle_t h, cudaStream_t *stream)
{
    pthread_mutex_lock(&handles_lock);
    struct dnn_handle *d = find_handle(h);
    int st = d == NULL || stream == NULL ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_SUCCESS;
    if (st == CUDNN_STATUS_SUCCESS)
        *stream = d->stream;
    pthread_mutex_unlock(&handles_lock);
    return st;
}

static size_t n_pend;               /* destroys deferred while a replay may need the descriptor (below) */
static void flush_destroys(void);

/* calllog.c, after a minibatch boundary: each handle's stream opens the new minibatch's log. */
void remote_dnn_minibatch_begins(void)
{
    if (n_pend > 0) {
        struct rcall c;
        if (remote_begin_quiet(&c, RFN_cudnnBackendDestroyDescriptor) == 0)
            flush_destroys();
        remote_end(&c);
    }
    if (!remote_recovery_enabled())
        return;
    pthread_mutex_lock(&handles_lock);
    size_t n = n_handles;
    struct dnn_handle *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (copy)
        memcpy(copy, handles, n * sizeof *copy);
    pthread_mutex_unlock(&handles_lock);
    for (size_t i = 0; copy && i < n; i++)
        cudnnSetStream(copy[i].handle, copy[i].stream);   /* (the calls write the same values back) */
    free(copy);
}

/* A pure query: the worker's own libcudnn answers (remote/bypass.c keeps the driver out of reach meanwhile). */
EXPORT cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int *value)
{
    static void *fn;
    __typeof__(cudnnGetProperty) *next = (__typeof__(cudnnGetProperty) *)remote_local_fn(&fn, "cudnnGetProperty",
                                                                                         remote_next_cudnn);
    remote_pure_call(1);
    cudnnStatus_t st = next(type, value);
    remote_pure_call(0);
    return st;
}

/* The last error message of the proxy's cuDNN, which made the calls. */
EXPORT void cudnnGetLastErrorString(char *message, size_t max_size)
{
    struct rcall c;
    if (message == NULL || max_size == 0)
        return;
    message[0] = '\0';
    if (remote_begin(&c, RFN_cudnnGetLastErrorString) != 0)
        return;
    if (remote_call(&c) == 0) {
        const char *text = rc_get_string(&c);
        if (text) {
            strncpy(message, text, max_size - 1);
            message[max_size - 1] = '\0';
        }
    }
    remote_end(&c);
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

/* A BatchNorm forward pass in training mode updated its running statistics in place.  The device state a
 * recovery meets (the forward passes over, the optimizer not yet run) already holds the update, and a replay
 * of the minibatch would make it a second time, unless those bytes are rewound first: rewind.c learns that
 * from replay validation; here it hears of the whole mean and variance (the descriptor's extent), so that no
 * channel the validated minibatch happened to leave unchanged is missed, and until it has them a failure
 * stops the job with the reason. */
void remote_dnn_running_stats(const void *desc, const void *mean, const void *variance, double factor)
{
    const struct dnn_tensor *t = tensor_of(desc);
    if ((mean == NULL && variance == NULL) || factor == 0.0 || !remote_recovery_enabled() || !t || !t->t.set)
        return;
    uint64_t extent = 1;                               /* elements, from the largest offset + 1 */
    for (int i = 0; i < t->t.nb_dims; i++)
        extent += (uint64_t)(t->t.dims[i] - 1) * (uint64_t)t->t.strides[i];
    uint64_t bytes = extent * (t->t.data_type == CUDNN_DATA_DOUBLE ? 8u : 4u);
    const char *why = "cudnnBatchNormalizationForwardTraining updates the running mean and variance in place "
                      "during the forward pass";
    remote_rewind_hint(why, (uintptr_t)mean, bytes);
    remote_rewind_hint(why, (uintptr_t)variance, bytes);
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

/* cuDNN's documented rules: an unknown data type is BAD_PARAM, nbDims outside [4, CUDNN_DIM_MAX] or more than
 * 2^31 elements NOT_SUPPORTED, a non-positive dimension or stride BAD_PARAM. */
static cudnnStatus_t set_nd(cudnnTensorDescriptor_t desc, cudnnDataType_t type, int nb, const int *dims,
                            const int *strides)
{
    struct dnn_tensor *t = tensor_of(desc);
    if (t == NULL || (int)type < 0 || (int)type > jitckpt_dnn_last_data_type)
        return CUDNN_STATUS_BAD_PARAM;
    if (nb < 4 || nb > JITCKPT_DNN_DIM_MAX)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (dims == NULL || strides == NULL)
        return CUDNN_STATUS_BAD_PARAM;
    int64_t elements = 1;
    for (int i = 0; i < nb; i++) {
        if (dims[i] <= 0 || strides[i] <= 0)
            return CUDNN_STATUS_BAD_PARAM;
        elements *= dims[i];
    }
    if (elements > INT32_MAX)
        return CUDNN_STATUS_NOT_SUPPORTED;
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
    if (format == CUDNN_TENSOR_NCHW_VECT_C)
        return CUDNN_STATUS_NOT_SUPPORTED;     /* (vectorized int8 layouts: not forwarded) */
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
        return CUDNN_STATUS_BAD_PARAM;
    if (nbDims < 4 || nbDims > JITCKPT_DNN_DIM_MAX)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (dimA == NULL)
        return CUDNN_STATUS_BAD_PARAM;
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
    if (nbDimsRequested < 0 || !dataType || !nbDims || (nbDimsRequested > 0 && (!dimA || !strideA)) || t == NULL)
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
    if (x == NULL || !x->t.set || (mode != CUDNN_BATCHNORM_PER_ACTIVATION && mode != CUDNN_BATCHNORM_SPATIAL &&
                                   mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT) ||
        (x->t.nb_dims != 4 && x->t.nb_dims != 5) || tensor_of(derivedBnDesc) == NULL)
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

/* A variant pack is the list of the attribute values the program set, in order, and whether it was
 * finalized.  The common path is answered here: a set of UNIQUE_IDS, DATA_POINTERS, WORKSPACE or
 * INTERMEDIATES with the documented type, a finalize with all three required attributes, as many pointers as
 * ids and no id twice.  Anything else (an error, a get, another attribute) is asked of the proxy's cuDNN on
 * a copy of the pack (pack_ask), so that the program gets the library's own answer; a cudnnBackendExecute
 * carries the pack and the proxy makes a real one from it. */
#define PACK_MAGIC 0x6a6b4470u                     /* "jkDp" */
struct pack_set { uint32_t name, type; int64_t count; size_t len; unsigned char *bytes; int has_array; };
struct dnn_pack {
    uint32_t magic;
    int finalized;
    size_t n, cap;
    struct pack_set *sets;
};

static struct dnn_pack *pack_of(const void *p)
{
    const struct dnn_pack *k = p;
    return k && !JITCKPT_VH_IS_VIRTUAL((uint64_t)(uintptr_t)p) && k->magic == PACK_MAGIC ? (struct dnn_pack *)k
                                                                                         : NULL;
}

static size_t type_bytes(cudnnBackendAttributeType_t type)
{
    return (unsigned)type < jitckpt_dnn_type_count ? jitckpt_dnn_type_bytes[type] : 0;
}

/* The bytes an attribute array of `count` elements of `type` takes on the wire (0 when not sizeable; more
 * than MAX_ATTR_BYTES, without overflowing, when too large). */
static size_t array_bytes(cudnnBackendAttributeType_t type, int64_t count)
{
    size_t size = type_bytes(type);
    if (count <= 0 || size == 0)
        return 0;
    return (uint64_t)count > MAX_ATTR_BYTES / size ? MAX_ATTR_BYTES + 1 : (size_t)count * size;
}

static void pack_free(struct dnn_pack *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->sets[i].bytes);
    free(k->sets);
    k->magic = 0;
    free(k);
}

/* The pack on the wire: u32 sets, u32 finalized, then per set u32 name, u32 type, i64 count, u32 has_array,
 * the array's bytes. */
static void put_pack(struct rcall *c, const struct dnn_pack *k)
{
    uint32_t n = (uint32_t)k->n, fin = (uint32_t)k->finalized;
    rc_put(c, &n, sizeof n);
    rc_put(c, &fin, sizeof fin);
    for (size_t i = 0; i < k->n; i++) {
        const struct pack_set *e = &k->sets[i];
        uint32_t has = (uint32_t)e->has_array;
        rc_put(c, &e->name, sizeof e->name);
        rc_put(c, &e->type, sizeof e->type);
        rc_put(c, &e->count, sizeof e->count);
        rc_put(c, &has, sizeof has);
        rc_put(c, e->bytes, e->len);
    }
}

/* A descriptor argument of cudnnBackendExecute: u32 kind (0 NULL, 1 a backend descriptor's virtual id,
 * 2 a variant pack kept here), then the id or the pack. */
static void put_desc_arg(struct rcall *c, const void *desc)
{
    const struct dnn_pack *k = pack_of(desc);
    uint32_t kind = desc == NULL ? 0 : k ? 2 : 1;
    rc_put(c, &kind, sizeof kind);
    if (kind == 1) {
        uint64_t vid = (uint64_t)(uintptr_t)desc;
        rc_put(c, &vid, sizeof vid);
    } else if (kind == 2) {
        put_pack(c, k);
    }
}


/* The proxy's cuDNN answers for a copy of the pack: `op` applied after the sets so far (a set's value, or
 * a get's request).  The call log skips it: it changes nothing on the device. */
static cudnnStatus_t pack_ask(struct dnn_pack *k, uint32_t op, uint32_t name, uint32_t type, int64_t count,
                              const void *array, int64_t *element_count, void *out)
{
    size_t len = array_bytes(type, count);
    if (len > MAX_ATTR_BYTES) {
        remote_refuse_call("cudnnBackendSetAttribute", "more than 16 KiB of attribute values");
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    struct rcall c;
    if (remote_begin(&c, RFN_DNN_PACK_ASK) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    put_desc_arg(&c, k);
    uint32_t has = (op == JITCKPT_DNN_PACK_SET ? array : out) != NULL, want = element_count != NULL;
    rc_put(&c, &op, sizeof op);
    rc_put(&c, &name, sizeof name);
    rc_put(&c, &type, sizeof type);
    rc_put(&c, &count, sizeof count);
    rc_put(&c, &has, sizeof has);
    rc_put(&c, &want, sizeof want);
    if (op == JITCKPT_DNN_PACK_SET && has)
        rc_put(&c, array, len);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS && op == JITCKPT_DNN_PACK_GET) {
        int64_t n = 0, returned = 0;
        rc_get(&c, &n, sizeof n);
        rc_get(&c, &returned, sizeof returned);
        if (element_count)
            *element_count = n;
        if (out && returned > 0)
            rc_get(&c, out, array_bytes(type, returned));
    }
    remote_end(&c);
    return ret;
}

/* The attributes answered here, and their type (the others, intermediates and shape overrides among them,
 * go to the proxy's cuDNN, which keeps the last word). */
static int pack_attribute_type(uint32_t name, uint32_t *type)
{
    switch (name) {
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: *type = CUDNN_TYPE_INT64; return 1;
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE: *type = CUDNN_TYPE_VOID_PTR; return 1;
    default: return 0;
    }
}

/* Why an execution with this pack cannot be forwarded, or NULL: a data pointer (or the workspace) in the
 * worker's host memory (what cudnn_frontend passes for a tensor given by value, such as attention's scale),
 * which the proxy cannot read; or a pointer-valued attribute only the worker's memory gives a meaning to
 * (shape overrides).  Device memory and NULL cross as they are. */
static const char *pack_host_pointer(const struct dnn_pack *k)
{
    for (size_t i = 0; k && i < k->n; i++) {
        const struct pack_set *e = &k->sets[i];
        if (e->type != CUDNN_TYPE_VOID_PTR)
            continue;
        if (e->name != CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS && e->name != CUDNN_ATTR_VARIANT_PACK_WORKSPACE &&
            e->name != CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES)
            return "a variant pack with shape overrides (pointers into the worker's memory) is not forwarded";
        for (size_t j = 0; j + sizeof(void *) <= e->len; j += sizeof(void *)) {
            void *p;
            memcpy(&p, e->bytes + j, sizeof p);
            if (p && !remote_is_device_ptr(p))
                return "a variant pack names host memory (a tensor passed by value, such as attention's scale), "
                       "which the device proxy cannot read";
        }
    }
    return NULL;
}

static const struct pack_set *pack_find(const struct dnn_pack *k, uint32_t name)
{
    for (size_t i = k->n; i-- > 0;)
        if (k->sets[i].name == name)
            return &k->sets[i];
    return NULL;
}

static cudnnStatus_t pack_set(struct dnn_pack *k, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              int64_t count, const void *array)
{
    uint32_t want;
    size_t len = array ? array_bytes(type, count) : 0;
    if (k->finalized || !pack_attribute_type(name, &want) || want != type || count < 0 || (count > 0 && !array) ||
        count > JITCKPT_DNN_PACK_MAX || (name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE && count != 1)) {
        /* the proxy's cuDNN judges; a set it accepts is kept, as any other */
        cudnnStatus_t st = pack_ask(k, JITCKPT_DNN_PACK_SET, name, type, count, array, NULL, NULL);
        if (st != CUDNN_STATUS_SUCCESS || k->finalized)
            return st;
    }
    unsigned char *copy = len ? malloc(len) : NULL;
    if ((len && copy == NULL) || grow((void **)&k->sets, &k->cap, k->n, sizeof *k->sets)) {
        free(copy);
        return CUDNN_STATUS_ALLOC_FAILED;
    }
    if (len)
        memcpy(copy, array, len);
    k->sets[k->n++] = (struct pack_set){name, type, count, len, copy, array != NULL};
    return CUDNN_STATUS_SUCCESS;
}

/* The documented finalize checks: the ids, the pointers (as many) and the workspace set, no id twice. */
static int pack_complete(const struct dnn_pack *k)
{
    const struct pack_set *ids = pack_find(k, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS),
                          *ptrs = pack_find(k, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS),
                          *ws = pack_find(k, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
    if (!ids || !ptrs || !ws || ids->count != ptrs->count)
        return 0;
    const int64_t *u = (const int64_t *)ids->bytes;
    for (int64_t i = 0; i < ids->count; i++)
        for (int64_t j = 0; j < i; j++)
            if (u[i] == u[j])
                return 0;
    return 1;
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

/* 0, or -1 (said: out of memory, a restart could not re-create the descriptor). */
static int remember(int op, uint64_t vid, uint32_t name, uint32_t type, int64_t count, const void *bytes, size_t len)
{
    unsigned char *copy = NULL;
    if (grow((void **)&hist, &cap_hist, n_hist, sizeof *hist) || (len && (copy = malloc(len)) == NULL)) {
        rlog("cuDNN: out of memory keeping a descriptor's history: a proxy restart could not re-create it");
        return -1;
    }
    if (len)
        memcpy(copy, bytes, len);
    hist[n_hist++] = (struct hrec){op, remote_current_device(), vid, name, type, count, len, copy};
    return 0;
}

/* ---- pruning: what a new proxy must still be given ---------------------------------------------
 *
 * After a destroy, the history keeps only the descriptors a live one needs: the live ones, what their
 * attributes name (recursively), and for a descriptor filled by a get (an engine configuration from the
 * heuristics) the descriptor that filled it and every other descriptor that same get filled, with their own
 * needs.  Everything else, a whole destroyed plan with its graph and heuristics, leaves the history. */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static long find_id(const uint64_t *ids, size_t n, uint64_t vid)
{
    const uint64_t *p = bsearch(&vid, ids, n, sizeof *ids, cmp_u64);
    return p ? (long)(p - ids) : -1;
}

/* Marks every descriptor a record names in its elements (H_SET of descriptors, H_FILL's targets); 1 if any
 * was newly marked. */
static int mark_elements(const struct hrec *r, const uint64_t *ids, size_t n, unsigned char *mark)
{
    int changed = 0;
    for (size_t j = 0; j + 8 <= r->len; j += 8) {
        uint64_t v;
        memcpy(&v, r->bytes + j, 8);
        long k = find_id(ids, n, v);
        if (k >= 0 && !mark[k])
            mark[k] = changed = 1;
    }
    return changed;
}

static void prune(void)
{
    size_t n = 0;
    for (size_t i = 0; i < n_hist; i++)
        n += hist[i].op == H_CREATE;
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    unsigned char *mark = calloc(n ? n : 1, 1);
    if (ids == NULL || mark == NULL) {
        free(ids);
        free(mark);
        return;                       /* (kept whole: correct, only larger) */
    }
    n = 0;
    for (size_t i = 0; i < n_hist; i++)
        if (hist[i].op == H_CREATE)
            ids[n++] = hist[i].vid;
    qsort(ids, n, sizeof *ids, cmp_u64);
    memset(mark, 1, n);               /* the live ones are the roots */
    for (size_t i = 0; i < n_hist; i++) {
        long k = hist[i].op == H_DESTROY ? find_id(ids, n, hist[i].vid) : -1;
        if (k >= 0)
            mark[k] = 0;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t i = 0; i < n_hist; i++) {
            const struct hrec *r = &hist[i];
            long owner = find_id(ids, n, r->vid);
            if (owner < 0)
                continue;
            if (r->op == H_SET && r->type == CUDNN_TYPE_BACKEND_DESCRIPTOR && mark[owner])
                changed |= mark_elements(r, ids, n, mark);
            else if (r->op == H_FILL) {
                int needed = mark[owner];
                for (size_t j = 0; !needed && j + 8 <= r->len; j += 8) {
                    uint64_t v;
                    memcpy(&v, r->bytes + j, 8);
                    long t = find_id(ids, n, v);
                    needed = t >= 0 && mark[t];
                }
                if (needed) {
                    if (!mark[owner])
                        mark[owner] = changed = 1;
                    changed |= mark_elements(r, ids, n, mark);
                }
            }
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n_hist; i++) {
        long owner = find_id(ids, n, hist[i].vid);
        if (owner >= 0 && mark[owner])
            hist[k++] = hist[i];
        else
            free(hist[i].bytes);
    }
    n_hist = k;
    free(ids);
    free(mark);
}

/* ---- destroys deferred while the call log may replay an execution of the descriptor -------------
 *
 * A replay re-runs the executions of the minibatches the device has not completed; a plan the program
 * destroyed in the meantime (PyTorch's trial plans, an evicted cache entry) must still be there.  So while
 * recovery is on, destroying a backend descriptor only queues it; it is destroyed (and leaves the history)
 * once the call log no longer holds the minibatch it was destroyed in.  Under the call lock. */
struct pending { uint64_t vid, minibatch; };
static struct pending *pend;
static size_t cap_pend;

static int is_live(uint64_t vid)
{
    int live = 0;
    for (size_t i = 0; i < n_hist; i++)
        if (hist[i].vid == vid)
            live = hist[i].op == H_CREATE ? 1 : hist[i].op == H_DESTROY ? 0 : live;
    for (size_t i = 0; live && i < n_pend; i++)
        if (pend[i].vid == vid)
            live = 0;
    return live;
}

/* The requests, built the same way for the program's call and for a restart's replay. */
static void put_create(struct rcall *c, uint32_t type, int has_out)
{
    rc_put(c, &type, sizeof type);
    rc_put_flag(c, has_out);
}

static void put_set(struct rcall *c, uint64_t vid, uint32_t name, uint32_t type, int64_t count, const void *bytes,
                    size_t len);
static void put_fill(struct rcall *c, uint64_t vid, uint32_t name, int64_t requested, const void *targets,
                     int want_count);

EXPORT cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                  cudnnBackendDescriptor_t *descriptor)
{
    if (descriptorType == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR && descriptor != NULL) {
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
    put_create(&c, (uint32_t)descriptorType, descriptor != NULL);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS && descriptor != NULL) {
        void *vid = NULL;
        rc_get_handle(&c, &vid);
        *descriptor = (cudnnBackendDescriptor_t)vid;
        remember(H_CREATE, (uint64_t)(uintptr_t)vid, (uint32_t)descriptorType, 0, 0, NULL, 0);
    }
    remote_end(&c);
    return ret;
}

/* The destroy itself, under the call lock (c begun): 0 or cuDNN's status. */
static cudnnStatus_t destroy_now(struct rcall *c, uint64_t vid)
{
    rc_put(c, &vid, sizeof vid);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(c);
    if (ret == CUDNN_STATUS_SUCCESS && vid != 0 && remember(H_DESTROY, vid, 0, 0, 0, NULL, 0) == 0)
        prune();
    return ret;
}

EXPORT cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
{
    struct dnn_pack *k = pack_of(descriptor);
    if (k) {
        pack_free(k);
        return CUDNN_STATUS_SUCCESS;
    }
    uint64_t vid = (uint64_t)(uintptr_t)descriptor;
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendDestroyDescriptor) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    cudnnStatus_t ret;
    if (vid != 0 && remote_recovery_enabled() && calllog_enabled() && is_live(vid) &&
        grow((void **)&pend, &cap_pend, n_pend, sizeof *pend) == 0) {
        pend[n_pend++] = (struct pending){vid, calllog_minibatch()};
        ret = CUDNN_STATUS_SUCCESS;
    } else {
        ret = destroy_now(&c, vid);
    }
    remote_end(&c);
    return ret;
}

/* The queued destroys whose minibatch the call log no longer holds (calllog.c, at a minibatch boundary). */
static void flush_destroys(void)
{
    for (size_t i = 0; i < n_pend;) {
        if (pend[i].minibatch >= calllog_first()) {
            i++;
            continue;
        }
        uint64_t vid = pend[i].vid;
        pend[i] = pend[--n_pend];
        struct rcall c;
        remote_begin_locked(&c, RFN_cudnnBackendDestroyDescriptor);
        destroy_now(&c, vid);
    }
}

EXPORT cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor)
{
    (void)descriptor;
    return CUDNN_STATUS_NOT_SUPPORTED;            /* deprecated in cuDNN 9; PyTorch never calls it */
}

/* Set and get carry (vid, u32 name, u32 type, i64 count, u32 has_array, u32 want_count) and, for a set,
 * the array; the library judges every argument (a NULL array, a negative count, an unknown descriptor,
 * which the proxy passes as NULL).  Only what cannot cross is refused here. */
static void put_attribute_call(struct rcall *c, uint64_t vid, uint32_t name, uint32_t type, int64_t count,
                               const void *array, int want_count)
{
    uint32_t has = array != NULL, want = (uint32_t)want_count;
    rc_put(c, &vid, sizeof vid);
    rc_put(c, &name, sizeof name);
    rc_put(c, &type, sizeof type);
    rc_put(c, &count, sizeof count);
    rc_put(c, &has, sizeof has);
    rc_put(c, &want, sizeof want);
}

static void put_set(struct rcall *c, uint64_t vid, uint32_t name, uint32_t type, int64_t count, const void *bytes,
                    size_t len)
{
    put_attribute_call(c, vid, name, type, count, bytes, 0);
    rc_put(c, bytes, len);
}

static void put_fill(struct rcall *c, uint64_t vid, uint32_t name, int64_t requested, const void *targets,
                     int want_count)
{
    put_attribute_call(c, vid, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, requested, targets, want_count);
    if (targets && requested > 0)
        rc_put(c, targets, (size_t)requested * 8);
}

static int too_large(const char *function, cudnnBackendAttributeType_t type, int64_t count)
{
    if (type_bytes(type) == 0 && count > 0) {
        remote_refuse_call(function, "an attribute type this build does not know the size of");
        return 1;
    }
    if (array_bytes(type, count) > MAX_ATTR_BYTES) {
        remote_refuse_call(function, "more than 16 KiB of attribute values");
        return 1;
    }
    return 0;
}

EXPORT cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                              cudnnBackendAttributeName_t attributeName,
                                              cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                              const void *arrayOfElements)
{
    struct dnn_pack *k = pack_of(descriptor);
    if (k)
        return pack_set(k, attributeName, attributeType, elementCount, arrayOfElements);
    if (too_large("cudnnBackendSetAttribute", attributeType, elementCount))
        return CUDNN_STATUS_NOT_SUPPORTED;
    size_t len = arrayOfElements ? array_bytes(attributeType, elementCount) : 0;
    uint64_t vid = (uint64_t)(uintptr_t)descriptor;
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendSetAttribute) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    put_attribute_call(&c, vid, attributeName, attributeType, elementCount, arrayOfElements, 0);
    rc_put(&c, arrayOfElements, len);
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
        return pack_ask(k, JITCKPT_DNN_PACK_GET, attributeName, attributeType, requestedElementCount, NULL, elementCount,
                        arrayOfElements);
    if (too_large("cudnnBackendGetAttribute", attributeType, requestedElementCount))
        return CUDNN_STATUS_NOT_SUPPORTED;
    uint64_t vid = (uint64_t)(uintptr_t)descriptor;
    /* descriptors filled in the proxy (the engine heuristics' results): the ids go, nothing comes back */
    int fill = attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR && arrayOfElements != NULL;
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendGetAttribute) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    if (fill)
        put_fill(&c, vid, attributeName, requestedElementCount, arrayOfElements, elementCount != NULL);
    else
        put_attribute_call(&c, vid, attributeName, attributeType, requestedElementCount, arrayOfElements,
                           elementCount != NULL);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret == CUDNN_STATUS_SUCCESS) {
        int64_t n = 0, returned = 0;
        rc_get(&c, &n, sizeof n);
        rc_get(&c, &returned, sizeof returned);
        if (elementCount)
            *elementCount = n;
        if (!fill && arrayOfElements && returned > 0)
            rc_get(&c, arrayOfElements, array_bytes(attributeType, returned));
        if (fill)
            remember(H_FILL, vid, attributeName, attributeType, requestedElementCount, arrayOfElements,
                     (size_t)requestedElementCount * 8);
    }
    remote_end(&c);
    return ret;
}

EXPORT cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
{
    struct dnn_pack *k = pack_of(descriptor);
    if (k) {
        cudnnStatus_t st = !k->finalized && pack_complete(k) ? CUDNN_STATUS_SUCCESS
                                                             : pack_ask(k, JITCKPT_DNN_PACK_FINALIZE, 0, 0, 0, NULL, NULL, NULL);
        if (st == CUDNN_STATUS_SUCCESS)
            k->finalized = 1;
        return st;
    }
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

/* One self-contained request: the handle, the plan and the pack (each as put_desc_arg says), so that the
 * call log replays it as it is. */
EXPORT cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                         cudnnBackendDescriptor_t variantPack)
{
    struct rcall c;
    if (remote_begin(&c, RFN_cudnnBackendExecute) != 0)
        return CUDNN_STATUS_NOT_INITIALIZED;
    const char *host = pack_host_pointer(pack_of(variantPack));
    if (host) {
        remote_end(&c);
        remote_refuse_call("cudnnBackendExecute", host);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    rc_put_handle(&c, handle);
    put_desc_arg(&c, executionPlan);
    put_desc_arg(&c, variantPack);
    cudnnStatus_t ret = (cudnnStatus_t)remote_call(&c);
    if (ret != CUDNN_STATUS_SUCCESS)
        calllog_unlog_last();               /* (a failed execution changed nothing: a replay skips it) */
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
            put_create(c, r->name, 1);
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
