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

#define MAX_ATTR_BYTES (16u * 1024u)                  /* the most attribute bytes one call carries */
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
    if (resolve() != 0 || n_tensors == MAX_TENSORS || r_tensor_create(out) != CUDNN_STATUS_SUCCESS) {
        rd_dnn_tensors_release();       /* (the dispatch returns at once: nothing of it may stay) */
        return -1;
    }
    tensors[n_tensors++] = *out;
    if (r_tensor_set(*out, (cudnnDataType_t)t.data_type, t.nb_dims, t.dims, t.strides) != CUDNN_STATUS_SUCCESS) {
        rd_dnn_tensors_release();       /* (the worker accepted it: an inconsistency, refused as a bad handle) */
        return -1;
    }
    return 0;
}

void rd_dnn_tensors_release(void)
{
    while (n_tensors > 0)
        r_tensor_destroy(tensors[--n_tensors]);
}

/* ---- backend descriptors ------------------------------------------------------------------- */

/* A virtual id's descriptor; NULL for 0 and for an id this proxy does not know (never made, or destroyed),
 * which cuDNN then judges as the NULL it is. */
static void *desc_of(uint64_t vid)
{
    void *real = NULL;
    if (vid != 0 && vh_lookup(VH_DNN_DESC, vid, &real) != 0)
        real = NULL;
    return real;
}

/* Virtual ids -> real pointers, in place, for the types that carry them (unknown ones: NULL). */
static void map_ids(uint32_t type, unsigned char *bytes, int64_t count)
{
    if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR && type != CUDNN_TYPE_HANDLE)
        return;
    for (int64_t i = 0; i < count; i++) {
        uint64_t vid;
        void *real = NULL;
        memcpy(&vid, bytes + i * 8, 8);
        if (type == CUDNN_TYPE_HANDLE) {
            if (vh_lookup(VH_DNN, vid, &real) != 0)
                real = NULL;
        } else {
            real = desc_of(vid);
        }
        memcpy(bytes + i * 8, &real, 8);
    }
}

static size_t type_bytes(uint32_t type)
{
    return type < jitckpt_dnn_type_count ? jitckpt_dnn_type_bytes[type] : 0;
}

/* count elements of type: their bytes, or more than MAX_ATTR_BYTES (without overflowing) when too many. */
static size_t array_bytes(uint32_t type, int64_t count)
{
    size_t size = type_bytes(type);
    if (count <= 0 || size == 0)
        return 0;
    return (uint64_t)count > MAX_ATTR_BYTES / size ? MAX_ATTR_BYTES + 1 : (size_t)count * size;
}


/* (vid, name, type, count, has_array, want_count) as interpose/remote/dnn.c puts them, and for a set (or a
 * fill) the array, its ids mapped.  0, or RD_BAD. */
struct attr_call { uint64_t vid; uint32_t name, type, has_array, want_count; int64_t count; };
static int get_attr_fields(struct rdisp *d, struct attr_call *a, unsigned char *bytes, int with_array);

static int get_attr_call(struct rdisp *d, struct attr_call *a, unsigned char *bytes, int with_array)
{
    if (rd_get(d, &a->vid, sizeof a->vid))
        return -1;
    return get_attr_fields(d, a, bytes, with_array);
}

/* The same without the id (a variant pack's question names its pack otherwise). */
static int get_attr_fields(struct rdisp *d, struct attr_call *a, unsigned char *bytes, int with_array)
{
    if (rd_get(d, &a->name, sizeof a->name) ||
        rd_get(d, &a->type, sizeof a->type) || rd_get(d, &a->count, sizeof a->count) ||
        rd_get(d, &a->has_array, sizeof a->has_array) || rd_get(d, &a->want_count, sizeof a->want_count))
        return -1;
    size_t len = array_bytes(a->type, a->count);
    if (len > MAX_ATTR_BYTES)
        return -1;
    if (with_array && a->has_array) {
        if (rd_get(d, bytes, len))
            return -1;
        map_ids(a->type, bytes, a->count);
    }
    return 0;
}

static int32_t create(struct rdisp *d)
{
    uint32_t type;
    cudnnBackendDescriptor_t desc = NULL;
    if (rd_get(d, &type, sizeof type))
        return RD_BAD;
    int out = rd_flag(d);
    cudnnStatus_t st = r_create((cudnnBackendDescriptorType_t)type, out ? &desc : NULL);
    if (st == CUDNN_STATUS_SUCCESS && out)
        rd_put_new_handle(d, VH_DNN_DESC, desc);
    return st;
}

static int32_t destroy(struct rdisp *d)
{
    uint64_t vid;
    if (rd_get(d, &vid, sizeof vid))
        return RD_BAD;
    cudnnStatus_t st = r_destroy(desc_of(vid));
    if (st == CUDNN_STATUS_SUCCESS && vid != 0)
        vh_forget(VH_DNN_DESC, vid);
    return st;
}

static int32_t set_attribute(struct rdisp *d)
{
    static unsigned char bytes[MAX_ATTR_BYTES];
    struct attr_call a;
    if (get_attr_call(d, &a, bytes, 1))
        return RD_BAD;
    return r_set(desc_of(a.vid), (cudnnBackendAttributeName_t)a.name, (cudnnBackendAttributeType_t)a.type, a.count,
                 a.has_array ? bytes : NULL);
}

/* A get on `desc`; answers (i64 count, i64 elements returned, the elements unless descriptors were filled). */
static int32_t get_on(struct rdisp *d, void *desc, const struct attr_call *a, unsigned char *bytes, int fill)
{
    int64_t count = 0, returned = 0;
    size_t size = type_bytes(a->type);
    if (!fill && a->has_array && (a->type == CUDNN_TYPE_HANDLE || a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR)) {
        plog("cudnnBackendGetAttribute: reading a handle back is not supported in transparent mode (attribute %u)",
             a->name);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    /* (the count is asked whenever there is an array, to know how much was written) */
    cudnnStatus_t st = r_get(desc, (cudnnBackendAttributeName_t)a->name, (cudnnBackendAttributeType_t)a->type,
                             a->count, a->want_count || a->has_array ? &count : NULL, a->has_array ? bytes : NULL);
    if (st == CUDNN_STATUS_SUCCESS) {
        returned = count < a->count ? count : a->count;
        if (returned < 0)
            returned = 0;
        rd_put(d, &count, sizeof count);
        rd_put(d, &returned, sizeof returned);
        if (!fill && a->has_array && returned > 0)
            rd_put(d, bytes, (size_t)returned * size);
    }
    return st;
}

static int32_t get_attribute(struct rdisp *d)
{
    static unsigned char bytes[MAX_ATTR_BYTES];
    struct attr_call a;
    if (get_attr_call(d, &a, bytes, 0))
        return RD_BAD;
    int fill = a.type == CUDNN_TYPE_BACKEND_DESCRIPTOR && a.has_array;
    if (fill && a.count < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (fill) {          /* the descriptors to fill, as virtual ids */
        if (array_bytes(a.type, a.count) > MAX_ATTR_BYTES || rd_get(d, bytes, (size_t)a.count * 8))
            return RD_BAD;
        map_ids(a.type, bytes, a.count);
    }
    return get_on(d, desc_of(a.vid), &a, bytes, fill);
}

static int32_t finalize(struct rdisp *d)
{
    uint64_t vid;
    if (rd_get(d, &vid, sizeof vid))
        return RD_BAD;
    return r_finalize(desc_of(vid));
}

/* ---- variant packs, made from what the worker kept --------------------------------------------- */

/* A descriptor argument (interpose/remote/dnn.c: put_desc_arg): NULL, a virtual id's descriptor, or a
 * variant pack made here from its sets (finalized if the worker's was), which *made is set to, for
 * unmake.  0, or RD_BAD. */
static int get_desc_arg(struct rdisp *d, void **desc, cudnnBackendDescriptor_t *made)
{
    uint32_t kind;
    *desc = *made = NULL;
    if (rd_get(d, &kind, sizeof kind))
        return -1;
    if (kind == 0)
        return 0;
    if (kind == 1) {
        uint64_t vid;
        if (rd_get(d, &vid, sizeof vid))
            return -1;
        *desc = desc_of(vid);
        return 0;
    }
    uint32_t n, finalized;
    if (kind != 2 || rd_get(d, &n, sizeof n) || rd_get(d, &finalized, sizeof finalized))
        return -1;
    cudnnStatus_t st = r_create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, made);
    if (st != CUDNN_STATUS_SUCCESS)
        *made = NULL;
    static unsigned char bytes[MAX_ATTR_BYTES];
    for (uint32_t i = 0; i < n; i++) {
        uint32_t name, type, has;
        int64_t count;
        if (rd_get(d, &name, sizeof name) || rd_get(d, &type, sizeof type) || rd_get(d, &count, sizeof count) ||
            rd_get(d, &has, sizeof has))
            return -1;
        size_t len = has ? array_bytes(type, count) : 0;
        if (len > MAX_ATTR_BYTES || rd_get(d, bytes, len))
            return -1;
        if (*made)       /* (the worker kept only sets that succeed: they do here too) */
            r_set(*made, (cudnnBackendAttributeName_t)name, (cudnnBackendAttributeType_t)type, count,
                  has ? bytes : NULL);
    }
    if (*made && finalized)
        r_finalize(*made);
    *desc = *made;
    return 0;
}

static void unmake(cudnnBackendDescriptor_t made)
{
    if (made)
        r_destroy(made);
}

/* A variant pack's question (interpose/remote/dnn.c: pack_ask): the pack, then a set, a get or a finalize
 * on it, answered as the program's call would be. */
static int32_t pack_ask(struct rdisp *d)
{
    static unsigned char bytes[MAX_ATTR_BYTES];
    void *pack;
    cudnnBackendDescriptor_t made = NULL;
    struct attr_call a = {0};
    uint32_t op;
    int32_t st = RD_BAD;
    if (get_desc_arg(d, &pack, &made) == 0 && rd_get(d, &op, sizeof op) == 0 &&
        get_attr_fields(d, &a, bytes, op == JITCKPT_DNN_PACK_SET) == 0) {
        if (op == JITCKPT_DNN_PACK_SET)
            st = r_set(pack, (cudnnBackendAttributeName_t)a.name, (cudnnBackendAttributeType_t)a.type, a.count,
                       a.has_array ? bytes : NULL);
        else if (op == JITCKPT_DNN_PACK_GET)
            st = get_on(d, pack, &a, bytes, 0);
        else
            st = r_finalize(pack);
    }
    unmake(made);
    return st;
}

static int32_t execute(struct rdisp *d)
{
    uint64_t handle_vid;
    void *handle, *plan, *pack;
    cudnnBackendDescriptor_t made_plan = NULL, made_pack = NULL;
    /* the handle first: watch.c holds the record back here while its stream waits for a collective */
    if (rd_get_handle(d, VH_DNN, &handle_vid, &handle) != 0)
        return CUDNN_STATUS_BAD_PARAM;        /* (or dropped: an abort came while it was held back) */
    int32_t st = RD_BAD;
    if (get_desc_arg(d, &plan, &made_plan) == 0 && get_desc_arg(d, &pack, &made_pack) == 0)
        st = r_execute((cudnnHandle_t)handle, plan, pack);
    unmake(made_plan);
    unmake(made_pack);
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
    case RFN_cudnnBackendInitialize: return pack_ask(d);   /* (the worker's variant-pack questions travel under it) */
    case RFN_cudnnGetLastErrorString: {
        static __typeof__(cudnnGetLastErrorString) *last;
        char text[1024] = "";
        if (last == NULL)
            last = (__typeof__(cudnnGetLastErrorString) *)proxy_sym(cudnn, "cudnnGetLastErrorString");
        if (last)
            last(text, sizeof text);
        rd_put_string(d, text);
        return 0;
    }
    default: return CUDNN_STATUS_NOT_SUPPORTED;      /* the worker keeps the rest itself */
    }
}

#endif
