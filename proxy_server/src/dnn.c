/* dnn.c -- the proxy's half of cuDNN (issue 19; the worker's: interpose/remote/dnn.c).
 *
 *  - Backend descriptors live here, each behind a virtual id (VH_DNN_DESC).
 *    An attribute value of type CUDNN_TYPE_BACKEND_DESCRIPTOR or
 *    CUDNN_TYPE_HANDLE crosses as virtual ids, mapped here before cuDNN sees
 *    it; a get that fills descriptors fills the real ones the worker names.
 *    Reading a handle or descriptor attribute back is refused (the worker
 *    would receive a real pointer).
 *  - cudnnBackendExecute carries its variant pack (kept in the worker): a
 *    temporary real one is made, used and destroyed here.  It is work on the
 *    handle's stream: watch.c holds it back while that stream waits for an
 *    unfinished collective, as a kernel launch.
 *  - A legacy tensor descriptor arrives by value (rd_dnn_tensor, called by
 *    the generated dispatch): a temporary real one, released when the
 *    dispatch ends (rd_dnn_tensors_release).
 * The functions come from the cuDNN loaded (libs.c); without one every call
 * fails with CUDNN_STATUS_NOT_INITIALIZED, said once. */

#include "dispatch.h"

#ifdef JITCKPT_REMOTE_CUDNN

#include <stdbool.h>
#include <stdlib.h>

#include <cudnn.h>

extern const size_t jitckpt_dnn_type_bytes[];    /* proxy_dispatch.c, generated from cudnn_graph.h */
extern const unsigned jitckpt_dnn_type_count;

static __typeof__(cudnnBackendCreateDescriptor) *r_create;
static __typeof__(cudnnBackendDestroyDescriptor) *r_destroy;
static __typeof__(cudnnBackendSetAttribute) *r_set;
static __typeof__(cudnnBackendGetAttribute) *r_get;
static __typeof__(cudnnBackendFinalize) *r_finalize;
static __typeof__(cudnnBackendExecute) *r_execute;
static __typeof__(cudnnCreateTensorDescriptor) *r_tensor_create;
static __typeof__(cudnnDestroyTensorDescriptor) *r_tensor_destroy;
static __typeof__(cudnnSetTensorNdDescriptor) *r_tensor_set;
static int resolved;

/* 0, or CUDNN_STATUS_NOT_INITIALIZED when no cuDNN is loaded or it lacks a function (said once). */
static int32_t resolve(void)
{
    if (resolved)
        return resolved > 0 ? 0 : CUDNN_STATUS_NOT_INITIALIZED;
#define R(var, name) (var = (__typeof__(name) *)proxy_sym(cudnn, #name)) != NULL
    int ok = cudnn && R(r_create, cudnnBackendCreateDescriptor) && R(r_destroy, cudnnBackendDestroyDescriptor) &&
             R(r_set, cudnnBackendSetAttribute) && R(r_get, cudnnBackendGetAttribute) &&
             R(r_finalize, cudnnBackendFinalize) && R(r_execute, cudnnBackendExecute) &&
             R(r_tensor_create, cudnnCreateTensorDescriptor) && R(r_tensor_destroy, cudnnDestroyTensorDescriptor) &&
             R(r_tensor_set, cudnnSetTensorNdDescriptor);
#undef R
    resolved = ok ? 1 : -1;
    if (!ok)
        plog("cuDNN calls fail: %s (set --cudnn or " PROXY_ENV_CUDNN ")",
             cudnn ? "the loaded cuDNN lacks a function this proxy calls" : "no cuDNN is loaded");
    return ok ? 0 : CUDNN_STATUS_NOT_INITIALIZED;
}

/* ---- legacy tensor descriptors, one dispatch long ------------------------------------------ */

#define MAX_TENSORS 16
static cudnnTensorDescriptor_t tensors[MAX_TENSORS];
static int n_tensors;

int rd_dnn_tensor(struct rdisp *d, cudnnTensorDescriptor_t *out)
{
    struct jitckpt_dnn_tensor t;
    *out = NULL;
    if (rd_get(d, &t, sizeof t) || t.nb_dims < 0 || t.nb_dims > JITCKPT_DNN_DIM_MAX)
        return -1;
    if (!t.set)
        return 0;                       /* NULL (or never set): cuDNN judges it */
    if (resolve() != 0 || n_tensors == MAX_TENSORS || r_tensor_create(out) != CUDNN_STATUS_SUCCESS)
        return -1;
    tensors[n_tensors++] = *out;
    if (r_tensor_set(*out, (cudnnDataType_t)t.data_type, t.nb_dims, t.dims, t.strides) != CUDNN_STATUS_SUCCESS)
        return -1;                      /* (the worker accepted it: an inconsistency, refused as a bad handle) */
    return 0;
}

void rd_dnn_tensors_release(void)
{
    while (n_tensors > 0)
        r_tensor_destroy(tensors[--n_tensors]);
}

/* ---- backend descriptors ------------------------------------------------------------------- */

static int desc_of(uint64_t vid, void **real)
{
    return vid == 0 || vh_lookup(VH_DNN_DESC, vid, real) != 0 ? -1 : 0;
}

/* Virtual ids -> real pointers, in place, for the types that carry them.  0, or a status. */
static int32_t map_ids(uint32_t type, unsigned char *bytes, int64_t count)
{
    if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR && type != CUDNN_TYPE_HANDLE)
        return 0;
    for (int64_t i = 0; i < count; i++) {
        uint64_t vid;
        void *real = NULL;
        memcpy(&vid, bytes + i * 8, 8);
        if (type == CUDNN_TYPE_HANDLE ? vh_lookup(VH_DNN, vid, &real) != 0 || real == NULL : desc_of(vid, &real))
            return CUDNN_STATUS_BAD_PARAM;
        memcpy(bytes + i * 8, &real, 8);
    }
    return 0;
}

static size_t type_bytes(uint32_t type)
{
    return type < jitckpt_dnn_type_count ? jitckpt_dnn_type_bytes[type] : 0;
}

#define MAX_ATTR_BYTES (16u * 1024u)

static int32_t create(struct rdisp *d)
{
    uint32_t type;
    cudnnBackendDescriptor_t desc = NULL;
    if (rd_get(d, &type, sizeof type))
        return RD_BAD;
    cudnnStatus_t st = r_create((cudnnBackendDescriptorType_t)type, &desc);
    if (st == CUDNN_STATUS_SUCCESS)
        rd_put_new_handle(d, VH_DNN_DESC, desc);
    return st;
}

static int32_t destroy(struct rdisp *d)
{
    uint64_t vid;
    void *real;
    if (rd_get(d, &vid, sizeof vid))
        return RD_BAD;
    if (desc_of(vid, &real))
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = r_destroy(real);
    if (st == CUDNN_STATUS_SUCCESS)
        vh_forget(VH_DNN_DESC, vid);
    return st;
}

static int32_t set_attribute(struct rdisp *d)
{
    uint64_t vid;
    uint32_t name, type;
    int64_t count;
    void *real;
    static unsigned char bytes[MAX_ATTR_BYTES];
    if (rd_get(d, &vid, sizeof vid) || rd_get(d, &name, sizeof name) || rd_get(d, &type, sizeof type) ||
        rd_get(d, &count, sizeof count))
        return RD_BAD;
    size_t size = type_bytes(type);
    if (size == 0 || count < 0 || (uint64_t)count * size > MAX_ATTR_BYTES || rd_get(d, bytes, (size_t)count * size))
        return CUDNN_STATUS_BAD_PARAM;
    if (desc_of(vid, &real))
        return CUDNN_STATUS_BAD_PARAM;
    int32_t st = map_ids(type, bytes, count);
    if (st)
        return st;
    return r_set(real, (cudnnBackendAttributeName_t)name, (cudnnBackendAttributeType_t)type, count,
                 count ? bytes : NULL);
}

/* Answers (i64 count, i64 elements returned, the elements unless descriptors were filled). */
static int32_t get_attribute(struct rdisp *d)
{
    uint64_t vid;
    uint32_t name, type;
    int64_t requested, count = 0, returned = 0;
    void *real;
    static unsigned char bytes[MAX_ATTR_BYTES];
    if (rd_get(d, &vid, sizeof vid) || rd_get(d, &name, sizeof name) || rd_get(d, &type, sizeof type) ||
        rd_get(d, &requested, sizeof requested))
        return RD_BAD;
    int want_count = rd_flag(d), fill = rd_flag(d);
    size_t size = type_bytes(type);
    if (size == 0 || requested < 0 || (uint64_t)requested * size > MAX_ATTR_BYTES)
        return CUDNN_STATUS_BAD_PARAM;
    if (fill) {
        if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR || rd_get(d, bytes, (size_t)requested * 8))
            return RD_BAD;
        int32_t st = map_ids(type, bytes, requested);
        if (st)
            return st;
    } else if (type == CUDNN_TYPE_HANDLE || type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        if (requested > 0) {
            plog("cudnnBackendGetAttribute: reading a handle or a descriptor back into an array the proxy "
                 "does not fill is not supported in transparent mode (attribute %u)", name);
            return CUDNN_STATUS_NOT_SUPPORTED;
        }
    }
    if (desc_of(vid, &real))
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = r_get(real, (cudnnBackendAttributeName_t)name, (cudnnBackendAttributeType_t)type, requested,
                             want_count ? &count : NULL, requested > 0 ? bytes : NULL);
    if (st == CUDNN_STATUS_SUCCESS) {
        returned = count < requested ? count : requested;
        if (returned < 0)
            returned = 0;
        rd_put(d, &count, sizeof count);
        rd_put(d, &returned, sizeof returned);
        if (!fill && returned > 0)
            rd_put(d, bytes, (size_t)returned * size);
    }
    return st;
}

static int32_t finalize(struct rdisp *d)
{
    uint64_t vid;
    void *real;
    if (rd_get(d, &vid, sizeof vid))
        return RD_BAD;
    if (desc_of(vid, &real))
        return CUDNN_STATUS_BAD_PARAM;
    return r_finalize(real);
}

static int32_t execute(struct rdisp *d)
{
    uint64_t handle_vid, plan_vid;
    void *handle, *plan;
    struct jitckpt_dnn_pack head;
    int64_t uids[JITCKPT_DNN_PACK_MAX], inter[JITCKPT_DNN_PACK_MAX];
    void *ptrs[JITCKPT_DNN_PACK_MAX];
    /* the handle first: watch.c holds the record back here while its stream waits for a collective */
    if (rd_get_handle(d, VH_DNN, &handle_vid, &handle) != 0)
        return CUDNN_STATUS_BAD_PARAM;        /* (or dropped: an abort came while it was held back) */
    if (rd_get(d, &plan_vid, sizeof plan_vid) || rd_get(d, &head, sizeof head) || head.n < 0 ||
        head.n > JITCKPT_DNN_PACK_MAX || head.n_inter < 0 || head.n_inter > JITCKPT_DNN_PACK_MAX ||
        rd_get(d, uids, (size_t)head.n * 8) || rd_get(d, ptrs, (size_t)head.n * sizeof(void *)) ||
        rd_get(d, inter, (size_t)head.n_inter * 8))
        return RD_BAD;
    if (desc_of(plan_vid, &plan))
        return CUDNN_STATUS_BAD_PARAM;
    cudnnBackendDescriptor_t pack = NULL;
    void *workspace = (void *)(uintptr_t)head.workspace;
    cudnnStatus_t st = r_create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = r_set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, head.n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = r_set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, head.n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS && workspace)
        st = r_set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS && head.n_inter > 0)
        st = r_set(pack, CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES, CUDNN_TYPE_INT64, head.n_inter, inter);
    if (st == CUDNN_STATUS_SUCCESS)
        st = r_finalize(pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = r_execute((cudnnHandle_t)handle, plan, pack);
    if (pack)
        r_destroy(pack);
    return st;
}

int32_t dispatch_dnn(unsigned fn, struct rdisp *d)
{
    int32_t st = resolve();
    if (st)
        return st;
    switch (fn) {
    case RFN_cudnnBackendCreateDescriptor: return create(d);
    case RFN_cudnnBackendDestroyDescriptor: return destroy(d);
    case RFN_cudnnBackendSetAttribute: return set_attribute(d);
    case RFN_cudnnBackendGetAttribute: return get_attribute(d);
    case RFN_cudnnBackendFinalize: return finalize(d);
    case RFN_cudnnBackendExecute: return execute(d);
    default: return CUDNN_STATUS_NOT_SUPPORTED;      /* the worker keeps the rest itself */
    }
}

#endif
