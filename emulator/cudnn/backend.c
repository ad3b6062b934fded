/* backend.c -- the cuDNN backend ("graph") API's descriptors:
 * cudnnBackendCreateDescriptor, cudnnBackendDestroyDescriptor,
 * cudnnBackendInitialize, cudnnBackendSetAttribute, cudnnBackendFinalize and
 * cudnnBackendGetAttribute, for the descriptor types a convolution needs
 * (what cudnn_frontend builds for PyTorch): TENSOR, CONVOLUTION,
 * OPERATION_CONVOLUTION_FORWARD / _BACKWARD_DATA / _BACKWARD_FILTER,
 * OPERATIONGRAPH, ENGINEHEUR, ENGINECFG, ENGINE, KNOB_CHOICE, EXECUTION_PLAN,
 * VARIANT_PACK, and the read-only KNOB_INFO, LAYOUT_INFO and
 * INTERMEDIATE_INFO.  Any other type: cudnnBackendCreateDescriptor returns
 * CUDNN_STATUS_NOT_SUPPORTED.
 *
 * The protocol, as cudnn_graph.h documents it:
 *   - A descriptor handle is a heap pointer, registered until destroyed; a
 *     NULL, unknown or destroyed one is CUDNN_STATUS_BAD_PARAM.
 *   - Set: only before finalize (after it: NOT_INITIALIZED).  The attribute
 *     must belong to the descriptor type and be settable (else BAD_PARAM),
 *     with its documented attribute type (else BAD_PARAM_ATTRIBUTE_TYPE) and
 *     element count (else BAD_PARAM); arrayOfElements NULL with a nonzero
 *     count is BAD_PARAM_NULL_POINTER.  A descriptor given as a value must be
 *     live and of the documented type (else BAD_PARAM_DESCRIPTOR_TYPE); its
 *     contents are copied when the descriptor that refers to it is
 *     finalized, when it must be finalized itself (else
 *     BAD_PARAM_NOT_FINALIZED).  After that it may be destroyed.
 *   - Finalize: required attributes missing or inconsistent -> BAD_PARAM;
 *     values the emulator does not implement -> NOT_SUPPORTED.  Finalizing
 *     twice is BAD_PARAM; the read-only types cannot be finalized
 *     (NOT_SUPPORTED).
 *   - Get: only after finalize (before: NOT_INITIALIZED).  The attribute type
 *     must be the documented one (BAD_PARAM_ATTRIBUTE_TYPE).  *elementCount
 *     (if elementCount is not NULL) is the number of elements the attribute
 *     has; min(requestedElementCount, that) are written.  arrayOfElements
 *     NULL only asks for the count (elementCount must then be given).
 *     Attributes whose values are descriptors are written into descriptors
 *     the caller created, of the documented type, which are then finalized
 *     (how cuDNN hands out engine configurations, engines and so on).
 * Attributes that cannot change an FP32/FP64 convolution are accepted and
 * recorded: SM_COUNT_TARGET, SHARED_MEMORY_LIMIT, the heuristic mode,
 * CUDA_GRAPH_RETENTION, the tensor's vector count 1 and reordering NONE, the
 * graph's dynamic/override shape flags set to false. */

#include <pthread.h>
#include <search.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DESC_MAGIC 0x6a636b646e6e4253ull        /* "jckdnnBS" */

/* ---- the registry of live descriptors ------------------------------------------- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static void *registry;          /* tsearch tree of struct dnn_desc * */

static int compare_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y ? -1 : x > y;
}

struct dnn_desc *dnn_desc_lookup(cudnnBackendDescriptor_t d)
{
    if (!d)
        return NULL;
    pthread_mutex_lock(&registry_lock);
    void *found = tfind(d, &registry, compare_ptr);
    pthread_mutex_unlock(&registry_lock);
    struct dnn_desc *desc = found ? *(struct dnn_desc **)found : NULL;
    return desc && desc->magic == DESC_MAGIC ? desc : NULL;
}

/* ---- small helpers -------------------------------------------------------------- */

#define SET_API "cudnnBackendSetAttribute"
#define GET_API "cudnnBackendGetAttribute"
#define FIN_API "cudnnBackendFinalize"

static const char *type_name(int32_t t)
{
    switch (t) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return "CONVOLUTION";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: return "OPERATION_CONVOLUTION_FORWARD";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
        return "OPERATION_CONVOLUTION_BACKWARD_DATA";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
        return "OPERATION_CONVOLUTION_BACKWARD_FILTER";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return "KNOB_CHOICE";
    case CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR: return "KNOB_INFO";
    case CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR: return "LAYOUT_INFO";
    case CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR: return "INTERMEDIATE_INFO";
    }
    return "(unsupported type)";
}

static int is_conv_op(int32_t t)
{
    return t == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
}

size_t dnn_type_size(int32_t dtype)
{
    switch (dtype) {
    case CUDNN_DATA_FLOAT: case CUDNN_DATA_INT32: case CUDNN_DATA_UINT32:
    case CUDNN_DATA_INT8x4: case CUDNN_DATA_UINT8x4:
        return 4;
    case CUDNN_DATA_DOUBLE: case CUDNN_DATA_INT64: case CUDNN_DATA_COMPLEX_FP32:
        return 8;
    case CUDNN_DATA_COMPLEX_FP64:
        return 16;
    case CUDNN_DATA_HALF: case CUDNN_DATA_BFLOAT16:
        return 2;
    case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: case CUDNN_DATA_BOOLEAN: case CUDNN_DATA_FP8_E4M3:
    case CUDNN_DATA_FP8_E5M2: case CUDNN_DATA_FP8_E8M0: case CUDNN_DATA_BYTE_BOOLEAN:
    case CUDNN_DATA_FP8_E5M3:
        return 1;
    case CUDNN_DATA_INT8x32:
        return 32;
    }
    return 0;
}

/* The attribute's type is `expected`, `count` is in [lo, hi], and the array
 * is there when count > 0. */
static cudnnStatus_t want(int32_t attr, cudnnBackendAttributeType_t got, cudnnBackendAttributeType_t expected,
                          int64_t count, int64_t lo, int64_t hi, const void *arr)
{
    if (got != expected)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, SET_API,
                          "attribute %d takes attribute type %d, not %d", (int)attr, (int)expected, (int)got);
    if (count < lo || count > hi)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API,
                          "attribute %d takes %lld to %lld elements, not %lld", (int)attr, (long long)lo,
                          (long long)hi, (long long)count);
    if (count > 0 && !arr)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, SET_API,
                          "attribute %d: arrayOfElements is NULL", (int)attr);
    return CUDNN_STATUS_SUCCESS;
}

/* Element i of a set attribute's array of descriptors: live and of type `dtype`. */
static cudnnStatus_t want_desc(int32_t attr, const void *arr, int64_t i, int32_t dtype, void **out)
{
    cudnnBackendDescriptor_t d = ((const cudnnBackendDescriptor_t *)arr)[i];
    struct dnn_desc *r = dnn_desc_lookup(d);
    if (!r)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API,
                          "attribute %d: descriptor %p is NULL, unknown or destroyed", (int)attr, d);
    if (r->type != dtype)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, SET_API,
                          "attribute %d takes a %s descriptor, not %s", (int)attr, type_name(dtype),
                          type_name(r->type));
    *out = r;
    return CUDNN_STATUS_SUCCESS;
}

/* A descriptor referred to by attribute `what` of a descriptor being
 * finalized: still live, of its type, and finalized. */
static cudnnStatus_t resolve(const char *what, void *ref, int32_t dtype, struct dnn_desc **out)
{
    struct dnn_desc *r = dnn_desc_lookup(ref);
    if (!r)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "%s: descriptor %p was destroyed", what, ref);
    if (r->type != dtype)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, FIN_API, "%s: a %s descriptor, not %s",
                          what, type_name(dtype), type_name(r->type));
    if (!r->finalized)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, FIN_API, "%s: descriptor %p is not finalized",
                          what, ref);
    *out = r;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t missing(const struct dnn_desc *d, const char *attr)
{
    return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "%s descriptor: the required attribute %s is not set",
                      type_name(d->type), attr);
}

static cudnnStatus_t not_settable(const struct dnn_desc *d, int32_t attr)
{
    return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API,
                      "attribute %d is not a settable attribute of a %s descriptor", (int)attr,
                      type_name(d->type));
}

static int64_t i64(const void *arr, int64_t i)
{
    return ((const int64_t *)arr)[i];
}

static int32_t i32(const void *arr)
{
    return *(const int32_t *)arr;
}

static int boolean(const void *arr)
{
    return *(const bool *)arr;
}

/* ---- create, destroy, initialize --------------------------------------------------- */

cudnnStatus_t CUDNNWINAPI cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                       cudnnBackendDescriptor_t *descriptor)
{
    static const char api[] = "cudnnBackendCreateDescriptor";
    if (!descriptor)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, api, "descriptor is NULL");
    *descriptor = NULL;
    if (!strcmp(type_name(descriptorType), "(unsupported type)"))
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, api,
                          "descriptor type %d is not implemented by the emulator (only what a convolution "
                          "needs)", (int)descriptorType);
    struct dnn_desc *d = calloc(1, sizeof *d);
    if (!d)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    d->magic = DESC_MAGIC;
    d->type = descriptorType;
    switch (descriptorType) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        d->u.tensor.vector_count = 1;
        d->u.tensor.vectorized_dim = -1;
        break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: d->u.op.kind = CONV_FWD; break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: d->u.op.kind = CONV_BWD_DATA; break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: d->u.op.kind = CONV_BWD_FILTER; break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: d->u.graph.mode = CUDNN_OPERATIONGRAPH_MODE_AUTO; break;
    default: break;
    }
    pthread_mutex_lock(&registry_lock);
    void *node = tsearch(d, &registry, compare_ptr);
    pthread_mutex_unlock(&registry_lock);
    if (!node) {
        free(d);
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    }
    *descriptor = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
{
    struct dnn_desc *d = NULL;
    pthread_mutex_lock(&registry_lock);
    void *found = descriptor ? tfind(descriptor, &registry, compare_ptr) : NULL;
    if (found) {
        d = *(struct dnn_desc **)found;
        tdelete(descriptor, &registry, compare_ptr);
        d->magic = 0;
    }
    pthread_mutex_unlock(&registry_lock);
    if (!d)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor",
                          "descriptor %p is NULL, unknown or already destroyed", descriptor);
    if (d->type == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
        free(d->u.variant.uids);
        free(d->u.variant.ptrs);
    }
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

/* Deprecated since cuDNN 9.2 (it re-initialised memory the caller allocated
 * for a descriptor); descriptors here are made by cudnnBackendCreateDescriptor only. */
cudnnStatus_t CUDNNWINAPI cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor)
{
    return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendInitialize",
                      "deprecated; use cudnnBackendCreateDescriptor (descriptor %p)", descriptor);
}

/* ---- set ----------------------------------------------------------------------------- */

enum { T_UID = 1, T_DTYPE = 2, T_DIMS = 4, T_STRIDES = 8, T_ALIGN = 16 };

static cudnnStatus_t set_tensor(struct dnn_tensor *t, int32_t attr, cudnnBackendAttributeType_t ty,
                                int64_t n, const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_TENSOR_UNIQUE_ID:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, 1, a)))
            return s;
        t->uid = i64(a, 0);
        t->set |= T_UID;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_DATA_TYPE:
        if ((s = want(attr, ty, CUDNN_TYPE_DATA_TYPE, n, 1, 1, a)))
            return s;
        if (i32(a) < CUDNN_DATA_FLOAT || i32(a) > CUDNN_DATA_FP8_E5M3)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "unknown data type %d", (int)i32(a));
        t->dtype = i32(a);
        t->set |= T_DTYPE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
    case CUDNN_ATTR_TENSOR_STRIDES: {
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, DNN_MAX_DIMS, a)))
            return s;
        int dims = attr == CUDNN_ATTR_TENSOR_DIMENSIONS;
        if (dims)
            t->nd = (int)n;
        else
            t->nd_strides = (int)n;
        memcpy(dims ? t->dims : t->strides, a, (size_t)n * sizeof(int64_t));
        t->set |= dims ? T_DIMS : T_STRIDES;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, 1, a)))
            return s;
        t->alignment = i64(a, 0);
        t->set |= T_ALIGN;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
    case CUDNN_ATTR_TENSOR_IS_BY_VALUE:
        if ((s = want(attr, ty, CUDNN_TYPE_BOOLEAN, n, 1, 1, a)))
            return s;
        if (attr == CUDNN_ATTR_TENSOR_IS_VIRTUAL)
            t->is_virtual = boolean(a);
        else
            t->is_by_value = boolean(a);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_VECTOR_COUNT:
    case CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, 1, a)))
            return s;
        if (attr == CUDNN_ATTR_TENSOR_VECTOR_COUNT)
            t->vector_count = i64(a, 0);
        else
            t->vectorized_dim = i64(a, 0);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_REORDERING_MODE:
        if ((s = want(attr, ty, CUDNN_TYPE_TENSOR_REORDERING_MODE, n, 1, 1, a)))
            return s;
        t->reordering = i32(a);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_RAGGED_OFFSET_MULTIPLIER:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, 1, a)))
            return s;
        if (i64(a, 0) != 1)
            return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, SET_API, "ragged tensors are not implemented");
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC:
    case CUDNN_ATTR_TENSOR_CONSTANT_VALUE:
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, SET_API,
                          "attribute %d (ragged offsets, constant values) is not implemented", (int)attr);
    }
    return CUDNN_STATUS_BAD_PARAM;
}

enum { C_COMP = 1, C_MODE = 2, C_SPATIAL = 4 };

static cudnnStatus_t set_conv(struct dnn_conv *c, int32_t attr, cudnnBackendAttributeType_t ty, int64_t n,
                              const void *a)
{
    cudnnStatus_t s;
    int64_t *dst = NULL;
    int *count = NULL;
    switch (attr) {
    case CUDNN_ATTR_CONVOLUTION_COMP_TYPE:
        if ((s = want(attr, ty, CUDNN_TYPE_DATA_TYPE, n, 1, 1, a)))
            return s;
        c->comp_type = i32(a);
        c->set |= C_COMP;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_CONVOLUTION_CONV_MODE:
        if ((s = want(attr, ty, CUDNN_TYPE_CONVOLUTION_MODE, n, 1, 1, a)))
            return s;
        if (i32(a) != CUDNN_CONVOLUTION && i32(a) != CUDNN_CROSS_CORRELATION)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "unknown convolution mode %d", (int)i32(a));
        c->mode = i32(a);
        c->set |= C_MODE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, 1, a)))
            return s;
        c->spatial = i64(a, 0);
        c->set |= C_SPATIAL;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_CONVOLUTION_DILATIONS: dst = c->dil; count = &c->n_dil; break;
    case CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES: dst = c->stride; count = &c->n_stride; break;
    case CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS: dst = c->pre; count = &c->n_pre; break;
    case CUDNN_ATTR_CONVOLUTION_POST_PADDINGS: dst = c->post; count = &c->n_post; break;
    default:
        return CUDNN_STATUS_BAD_PARAM;
    }
    if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, DNN_MAX_DIMS, a)))
        return s;
    memcpy(dst, a, (size_t)n * sizeof(int64_t));
    *count = (int)n;
    return CUDNN_STATUS_SUCCESS;
}

enum { O_ALPHA = 1, O_BETA = 2, O_CONV = 4, O_X = 8, O_W = 16, O_Y = 32 };

static cudnnStatus_t set_op(struct dnn_op *o, int32_t attr, cudnnBackendAttributeType_t ty, int64_t n,
                            const void *a)
{
    /* The attribute numbers of the three operations, by role. */
    static const int32_t ids[3][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY},
    };
    const int32_t *id = ids[o->kind];
    int role = -1;
    for (int i = 0; i < 6; i++)
        if (id[i] == attr)
            role = i;
    if (role < 0)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t s;
    if (role <= 1) {    /* alpha, beta: FLOAT or DOUBLE, 1+ elements (the first is used) */
        if (ty != CUDNN_TYPE_FLOAT && ty != CUDNN_TYPE_DOUBLE)
            return dnn_report(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, SET_API,
                              "attribute %d takes CUDNN_TYPE_FLOAT or CUDNN_TYPE_DOUBLE, not %d", (int)attr,
                              (int)ty);
        if ((s = want(attr, ty, ty, n, 1, INT64_MAX, a)))
            return s;
        double v = ty == CUDNN_TYPE_FLOAT ? (double)*(const float *)a : *(const double *)a;
        if (role == 0) {
            o->alpha = v;
            o->alpha_type = ty;
            o->set |= O_ALPHA;
        } else {
            o->beta = v;
            o->beta_type = ty;
            o->set |= O_BETA;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    if ((s = want(attr, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, 1, a)))
        return s;
    void *r;
    static const unsigned bits[6] = {O_ALPHA, O_BETA, O_CONV, O_X, O_W, O_Y};
    void **slot[6] = {NULL, NULL, &o->ref_conv, &o->ref_x, &o->ref_w, &o->ref_y};
    if ((s = want_desc(attr, a, 0,
                       role == 2 ? CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR : CUDNN_BACKEND_TENSOR_DESCRIPTOR, &r)))
        return s;
    *slot[role] = r;
    o->set |= bits[role];
    return CUDNN_STATUS_SUCCESS;
}

enum { G_OPS = 1, G_HANDLE = 2 };

static cudnnStatus_t set_graph(struct dnn_graph *g, int32_t attr, cudnnBackendAttributeType_t ty, int64_t n,
                               const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_OPERATIONGRAPH_HANDLE:
        if ((s = want(attr, ty, CUDNN_TYPE_HANDLE, n, 1, 1, a)))
            return s;
        if (dnn_handle_state(*(const cudnnHandle_t *)a, NULL) != CUDNN_STATUS_SUCCESS)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "invalid cuDNN handle %p",
                              (void *)*(const cudnnHandle_t *)a);
        g->handle = *(const cudnnHandle_t *)a;
        g->set |= G_HANDLE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_OPERATIONGRAPH_OPS: {
        if ((s = want(attr, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, INT64_MAX, a)))
            return s;
        if (n > (int64_t)(sizeof g->ref_ops / sizeof g->ref_ops[0]))
            return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, SET_API,
                              "%lld operations: the emulator runs graphs of one convolution", (long long)n);
        void *refs[16];
        for (int64_t i = 0; i < n; i++) {
            cudnnBackendDescriptor_t d = ((const cudnnBackendDescriptor_t *)a)[i];
            struct dnn_desc *r = dnn_desc_lookup(d);
            if (!r)
                return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API,
                                  "operation %lld: descriptor %p is NULL, unknown or destroyed", (long long)i, d);
            if (!is_conv_op(r->type))
                return dnn_report(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, SET_API,
                                  "operation %lld is a %s descriptor, not an operation", (long long)i,
                                  type_name(r->type));
            refs[i] = r;
        }
        memcpy(g->ref_ops, refs, (size_t)n * sizeof refs[0]);
        g->nops = (int)n;
        g->set |= G_OPS;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED:
    case CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED:
        if ((s = want(attr, ty, CUDNN_TYPE_BOOLEAN, n, 1, 1, a)))
            return s;
        if (attr == CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED)
            g->dynamic_shape = boolean(a);
        else
            g->override_shape = boolean(a);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_OPERATIONGRAPH_MODE:
        if ((s = want(attr, ty, CUDNN_TYPE_OPERATIONGRAPH_MODE, n, 1, 1, a)))
            return s;
        g->mode = i32(a);
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_BAD_PARAM;
}

enum { E_GRAPH = 1, E_INDEX = 2 };

static cudnnStatus_t set_engine(struct dnn_engine *e, int32_t attr, cudnnBackendAttributeType_t ty, int64_t n,
                                const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
        if ((s = want(attr, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, 1, a)) ||
            (s = want_desc(attr, a, 0, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &e->ref_graph)))
            return s;
        e->set |= E_GRAPH;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, 1, a)))
            return s;
        e->index = i64(a, 0);
        e->set |= E_INDEX;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINE_SM_COUNT_TARGET:
    case CUDNN_ATTR_ENGINE_SHARED_MEMORY_LIMIT:
        if ((s = want(attr, ty, CUDNN_TYPE_INT32, n, 1, 1, a)))
            return s;
        if (i32(a) < 0)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "attribute %d: %d is negative", (int)attr,
                              (int)i32(a));
        if (attr == CUDNN_ATTR_ENGINE_SM_COUNT_TARGET)
            e->sm_count = i32(a);
        else
            e->shared_memory_limit = i32(a);
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_BAD_PARAM;
}

enum { K_TYPE = 1, K_VALUE = 2 };

static cudnnStatus_t set_knob(struct dnn_knob_choice *k, int32_t attr, cudnnBackendAttributeType_t ty,
                              int64_t n, const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE:
        if ((s = want(attr, ty, CUDNN_TYPE_KNOB_TYPE, n, 1, 1, a)))
            return s;
        k->type = i32(a);
        k->set |= K_TYPE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 1, 1, a)))
            return s;
        k->value = i64(a, 0);
        k->set |= K_VALUE;
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_BAD_PARAM;
}

enum { F_ENGINE = 1 };

static cudnnStatus_t set_cfg(struct dnn_cfg *c, int32_t attr, cudnnBackendAttributeType_t ty, int64_t n,
                             const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_ENGINECFG_ENGINE:
        if ((s = want(attr, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, 1, a)) ||
            (s = want_desc(attr, a, 0, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &c->ref_engine)))
            return s;
        c->set |= F_ENGINE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES:
        if ((s = want(attr, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 0, CUDNN_KNOB_TYPE_COUNTS, a)))
            return s;
        /* Knob choices are small values: copied now (they must be finalized). */
        for (int64_t i = 0; i < n; i++) {
            void *r;
            if ((s = want_desc(attr, a, i, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &r)))
                return s;
            if (!((struct dnn_desc *)r)->finalized)
                return dnn_report(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, SET_API,
                                  "knob choice %lld is not finalized", (long long)i);
        }
        for (int64_t i = 0; i < n; i++)
            c->knobs[i] = dnn_desc_lookup(((const cudnnBackendDescriptor_t *)a)[i])->u.knob;
        c->nknobs = (int)n;
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_BAD_PARAM;
}

enum { H_GRAPH = 1, H_MODE = 2 };

static cudnnStatus_t set_heur(struct dnn_heur *h, int32_t attr, cudnnBackendAttributeType_t ty, int64_t n,
                              const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH:
        if ((s = want(attr, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, 1, a)) ||
            (s = want_desc(attr, a, 0, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &h->ref_graph)))
            return s;
        h->set |= H_GRAPH;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINEHEUR_MODE:
        if ((s = want(attr, ty, CUDNN_TYPE_HEUR_MODE, n, 1, 1, a)))
            return s;
        if (i32(a) < 0 || i32(a) >= CUDNN_HEUR_MODES_COUNT)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "unknown heuristic mode %d", (int)i32(a));
        h->mode = i32(a);
        h->set |= H_MODE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET:
    case CUDNN_ATTR_ENGINEHEUR_SHARED_MEMORY_LIMIT:
        if ((s = want(attr, ty, CUDNN_TYPE_INT32, n, 1, 1, a)))
            return s;
        if (i32(a) < 0)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "attribute %d: %d is negative", (int)attr,
                              (int)i32(a));
        if (attr == CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET)
            h->sm_count = i32(a);
        else
            h->shared_memory_limit = i32(a);
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_BAD_PARAM;
}

enum { P_CFG = 1, P_HANDLE = 2 };

static cudnnStatus_t set_plan(struct dnn_plan *p, int32_t attr, cudnnBackendAttributeType_t ty, int64_t n,
                              const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_EXECUTION_PLAN_HANDLE:
        if ((s = want(attr, ty, CUDNN_TYPE_HANDLE, n, 1, 1, a)))
            return s;
        if (dnn_handle_state(*(const cudnnHandle_t *)a, NULL) != CUDNN_STATUS_SUCCESS)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "invalid cuDNN handle %p",
                              (void *)*(const cudnnHandle_t *)a);
        p->handle = *(const cudnnHandle_t *)a;
        p->set |= P_HANDLE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
        if ((s = want(attr, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, 1, a)) ||
            (s = want_desc(attr, a, 0, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &p->ref_cfg)))
            return s;
        p->set |= P_CFG;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS:
    case CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS:
        if ((s = want(attr, ty, CUDNN_TYPE_INT64, n, 0, INT64_MAX, a)))
            return s;
        if (n > 0)
            return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, SET_API,
                              "execution intermediates are not implemented (the engine has none)");
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_EXECUTION_PLAN_CUDA_GRAPH_RETENTION:
        if ((s = want(attr, ty, CUDNN_TYPE_CUDA_GRAPH_RETENTION, n, 1, 1, a)))
            return s;
        p->graph_retention = i32(a);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION:
    case CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE:
    case CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP:
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, SET_API,
                          "attribute %d (plan serialization, kernel caches, device properties) is not "
                          "implemented", (int)attr);
    }
    return CUDNN_STATUS_BAD_PARAM;
}

enum { V_UIDS = 1, V_PTRS = 2, V_WORKSPACE = 4 };

static cudnnStatus_t set_variant(struct dnn_variant *v, int32_t attr, cudnnBackendAttributeType_t ty,
                                 int64_t n, const void *a)
{
    cudnnStatus_t s;
    switch (attr) {
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: {
        int uids = attr == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS;
        if ((s = want(attr, ty, uids ? CUDNN_TYPE_INT64 : CUDNN_TYPE_VOID_PTR, n, 0, 1 << 20, a)))
            return s;
        size_t bytes = (size_t)n * (uids ? sizeof(int64_t) : sizeof(void *));
        void *copy = malloc(bytes ? bytes : 1);
        if (!copy)
            return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
        if (bytes)
            memcpy(copy, a, bytes);
        if (uids) {
            free(v->uids);
            v->uids = copy;
            v->n_uids = (int)n;
            v->set |= V_UIDS;
        } else {
            free(v->ptrs);
            v->ptrs = copy;
            v->n_ptrs = (int)n;
            v->set |= V_PTRS;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
        if ((s = want(attr, ty, CUDNN_TYPE_VOID_PTR, n, 1, 1, a)))
            return s;
        v->workspace = *(void *const *)a;
        v->set |= V_WORKSPACE;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES:
    case CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS:
    case CUDNN_ATTR_VARIANT_PACK_OVERRIDE_SHAPES:
    case CUDNN_ATTR_VARIANT_PACK_OVERRIDE_STRIDES:
        if ((s = want(attr, ty, attr == CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES ? CUDNN_TYPE_VOID_PTR : CUDNN_TYPE_INT64,
                      n, 0, INT64_MAX, a)))
            return s;
        if (n > 0)
            return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, SET_API,
                              "attribute %d (intermediates, shape overrides) is not implemented", (int)attr);
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t CUDNNWINAPI cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                                   cudnnBackendAttributeName_t attributeName,
                                                   cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                                   const void *arrayOfElements)
{
    struct dnn_desc *d = dnn_desc_lookup(descriptor);
    if (!d)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "descriptor %p is NULL, unknown or destroyed",
                          descriptor);
    if (d->finalized)
        return dnn_report(CUDNN_STATUS_NOT_INITIALIZED, SET_API,
                          "the %s descriptor is finalized: its attributes can no longer be set",
                          type_name(d->type));
    if (elementCount < 0)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, SET_API, "elementCount %lld is negative",
                          (long long)elementCount);
    cudnnStatus_t s = CUDNN_STATUS_BAD_PARAM;
    int32_t attr = attributeName;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        s = set_tensor(&d->u.tensor, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
        s = set_conv(&d->u.conv, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
        s = set_op(&d->u.op, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        s = set_graph(&d->u.graph, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        s = set_engine(&d->u.engine, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        s = set_cfg(&d->u.cfg, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        s = set_heur(&d->u.heur, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        s = set_plan(&d->u.plan, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        s = set_variant(&d->u.variant, attr, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR:
        s = set_knob(&d->u.knob, attr, attributeType, elementCount, arrayOfElements);
        break;
    default:    /* the read-only KNOB_INFO, LAYOUT_INFO, INTERMEDIATE_INFO */
        break;
    }
    /* The set_* functions report their own errors, except a bare BAD_PARAM:
     * an attribute that does not belong to the type. */
    if (s == CUDNN_STATUS_BAD_PARAM)
        return not_settable(d, attr);
    return s;
}

/* ---- finalize -------------------------------------------------------------------------- */

static cudnnStatus_t finalize_tensor(struct dnn_desc *d)
{
    struct dnn_tensor *t = &d->u.tensor;
    if (!(t->set & T_UID))
        return missing(d, "CUDNN_ATTR_TENSOR_UNIQUE_ID");
    if (!(t->set & T_DTYPE))
        return missing(d, "CUDNN_ATTR_TENSOR_DATA_TYPE");
    if (!(t->set & T_DIMS))
        return missing(d, "CUDNN_ATTR_TENSOR_DIMENSIONS");
    if (!(t->set & T_STRIDES))
        return missing(d, "CUDNN_ATTR_TENSOR_STRIDES");
    if (!(t->set & T_ALIGN))
        return missing(d, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT");
    if (t->nd != t->nd_strides)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "tensor %lld: %d dimensions but %d strides",
                          (long long)t->uid, t->nd, t->nd_strides);
    for (int i = 0; i < t->nd; i++)
        if (t->dims[i] <= 0 || t->strides[i] <= 0)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API,
                              "tensor %lld: dimension %d is %lld with stride %lld: both must be positive",
                              (long long)t->uid, i, (long long)t->dims[i], (long long)t->strides[i]);
    if (t->dtype == CUDNN_DATA_INT8x4 || t->dtype == CUDNN_DATA_UINT8x4 || t->dtype == CUDNN_DATA_INT8x32)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API, "tensor %lld: data type %d is not supported",
                          (long long)t->uid, (int)t->dtype);
    size_t es = dnn_type_size(t->dtype);
    if (t->alignment <= 0 || (es && t->alignment % (int64_t)es))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API,
                          "tensor %lld: byte alignment %lld is not a positive multiple of the element size %zu",
                          (long long)t->uid, (long long)t->alignment, es);
    if (t->vector_count < 1 || (t->vector_count > 1 && (t->vectorized_dim < 0 || t->vectorized_dim >= t->nd)))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "tensor %lld: vector count %lld, vectorized dimension %lld",
                          (long long)t->uid, (long long)t->vector_count, (long long)t->vectorized_dim);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_conv(struct dnn_desc *d)
{
    struct dnn_conv *c = &d->u.conv;
    if (!(c->set & C_COMP))
        return missing(d, "CUDNN_ATTR_CONVOLUTION_COMP_TYPE");
    if (!(c->set & C_MODE))
        return missing(d, "CUDNN_ATTR_CONVOLUTION_CONV_MODE");
    if (!(c->set & C_SPATIAL))
        return missing(d, "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS");
    static const char *const names[4] = {"DILATIONS", "FILTER_STRIDES", "PRE_PADDINGS", "POST_PADDINGS"};
    const int counts[4] = {c->n_dil, c->n_stride, c->n_pre, c->n_post};
    const int64_t *vals[4] = {c->dil, c->stride, c->pre, c->post};
    if (c->spatial < 1 || c->spatial > DNN_MAX_DIMS - 2)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "%lld spatial dimensions", (long long)c->spatial);
    for (int i = 0; i < 4; i++) {
        if (counts[i] == 0)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API,
                              "CONVOLUTION descriptor: the required attribute CUDNN_ATTR_CONVOLUTION_%s is not set",
                              names[i]);
        if (counts[i] != c->spatial)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API,
                              "CUDNN_ATTR_CONVOLUTION_%s has %d elements, SPATIAL_DIMS is %lld", names[i],
                              counts[i], (long long)c->spatial);
        for (int j = 0; j < counts[i]; j++)
            if (i < 2 ? vals[i][j] < 1 : vals[i][j] < 0)
                return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "CUDNN_ATTR_CONVOLUTION_%s[%d] is %lld",
                                  names[i], j, (long long)vals[i][j]);
    }
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_op(struct dnn_desc *d)
{
    struct dnn_op *o = &d->u.op;
    static const char *const prefix[3] = {"FORWARD", "BWD_DATA", "BWD_FILTER"};
    static const char *const role_names[3][3] = {{"X", "W", "Y"}, {"DX", "W", "DY"}, {"X", "DW", "DY"}};
    char names[6][80];
    static const char *const suffix[3] = {"ALPHA", "BETA", "CONV_DESC"};
    for (int i = 0; i < 6; i++)
        snprintf(names[i], sizeof names[i], "CUDNN_ATTR_OPERATION_CONVOLUTION_%s_%s", prefix[o->kind],
                 i < 3 ? suffix[i] : role_names[o->kind][i - 3]);
    const unsigned bits[6] = {O_ALPHA, O_BETA, O_CONV, O_X, O_W, O_Y};
    for (int i = 0; i < 6; i++)
        if (!(o->set & bits[i]))
            return missing(d, names[i]);
    void *refs[3] = {o->ref_x, o->ref_w, o->ref_y};
    struct dnn_tensor *snap[3] = {&o->x, &o->w, &o->y};
    const char *const *roles = role_names[o->kind];
    struct dnn_desc *r;
    cudnnStatus_t s;
    if ((s = resolve(names[2], o->ref_conv, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &r)))
        return s;
    struct dnn_conv conv = r->u.conv;
    struct dnn_tensor t[3];
    for (int i = 0; i < 3; i++) {
        if ((s = resolve(names[3 + i], refs[i], CUDNN_BACKEND_TENSOR_DESCRIPTOR, &r)))
            return s;
        t[i] = r->u.tensor;
    }
    /* [N, GC, ...], [GK, C, ...], [N, GK, ...]: spatial + 2 dimensions each. */
    int64_t sp = conv.spatial;
    for (int i = 0; i < 3; i++)
        if (t[i].nd != sp + 2) {
            if (t[i].nd == sp + 3)
                return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API,
                                  "%s has %d dimensions: tensors with an explicit group dimension are not "
                                  "implemented", roles[i], t[i].nd);
            return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API,
                              "%s has %d dimensions; a convolution with %lld spatial dimensions needs %lld",
                              roles[i], t[i].nd, (long long)sp, (long long)sp + 2);
        }
    const struct dnn_tensor *x = &t[0], *w = &t[1], *y = &t[2];
    if (x->dims[0] != y->dims[0])
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "batch sizes differ: %s %lld, %s %lld", roles[0],
                          (long long)x->dims[0], roles[2], (long long)y->dims[0]);
    if (x->dims[1] % w->dims[1] != 0 || w->dims[0] != y->dims[1] || w->dims[0] % (x->dims[1] / w->dims[1]) != 0)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API,
                          "channels do not form a convolution: %s has %lld, %s is %lld x %lld, %s has %lld",
                          roles[0], (long long)x->dims[1], roles[1], (long long)w->dims[0], (long long)w->dims[1],
                          roles[2], (long long)y->dims[1]);
    for (int i = 0; i < sp; i++) {
        int64_t span = (w->dims[2 + i] - 1) * conv.dil[i] + 1;
        int64_t padded = x->dims[2 + i] + conv.pre[i] + conv.post[i];
        int64_t out = padded >= span ? (padded - span) / conv.stride[i] + 1 : 0;
        if (out != y->dims[2 + i])
            return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API,
                              "spatial dimension %d: input %lld, paddings %lld/%lld, filter %lld, dilation %lld, "
                              "stride %lld give an output of %lld, but %s has %lld", i, (long long)x->dims[2 + i],
                              (long long)conv.pre[i], (long long)conv.post[i], (long long)w->dims[2 + i],
                              (long long)conv.dil[i], (long long)conv.stride[i], (long long)out, roles[2],
                              (long long)y->dims[2 + i]);
    }
    if (x->uid == w->uid || x->uid == y->uid || w->uid == y->uid)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, FIN_API,
                          "the operation's tensors share a unique id (%lld, %lld, %lld)", (long long)x->uid,
                          (long long)w->uid, (long long)y->uid);
    o->conv = conv;
    for (int i = 0; i < 3; i++)
        *snap[i] = t[i];
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_graph(struct dnn_desc *d)
{
    struct dnn_graph *g = &d->u.graph;
    if (!(g->set & G_OPS))
        return missing(d, "CUDNN_ATTR_OPERATIONGRAPH_OPS");
    cudnnStatus_t s;
    struct dnn_desc *r;
    for (int i = 0; i < g->nops; i++) {
        struct dnn_desc *probe = dnn_desc_lookup(g->ref_ops[i]);
        if ((s = resolve("CUDNN_ATTR_OPERATIONGRAPH_OPS", g->ref_ops[i], probe ? probe->type : -1, &r)))
            return s;
        if (!is_conv_op(r->type))
            return dnn_report(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, FIN_API,
                              "operation %d is a %s descriptor", i, type_name(r->type));
        if (i == 0)
            g->op = r->u.op;
    }
    if (g->nops != 1)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API,
                          "%d operations: the emulator runs graphs of exactly one convolution", g->nops);
    if ((g->set & G_HANDLE) && dnn_handle_state(g->handle, NULL) != CUDNN_STATUS_SUCCESS)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "the graph's handle %p was destroyed",
                          (void *)g->handle);
    if (g->dynamic_shape || g->override_shape)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API, "dynamic or override shapes are not implemented");
    static const int32_t modes[3] = {CUDNN_OPERATIONGRAPH_MODE_CONV_FORWARD, CUDNN_OPERATIONGRAPH_MODE_CONV_BWD_DATA,
                                     CUDNN_OPERATIONGRAPH_MODE_CONV_BWD_FILTER};
    if (g->mode != CUDNN_OPERATIONGRAPH_MODE_AUTO && g->mode != modes[g->op.kind])
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API, "graph mode %d does not match its operation",
                          (int)g->mode);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t dnn_graph_supported(const struct dnn_graph *g, const char **why)
{
    const struct dnn_op *o = &g->op;
    const struct dnn_tensor *t[3] = {&o->x, &o->w, &o->y};
    if (o->x.dtype != o->w.dtype || o->x.dtype != o->y.dtype ||
        (o->x.dtype != CUDNN_DATA_FLOAT && o->x.dtype != CUDNN_DATA_DOUBLE)) {
        *why = "the emulator implements convolutions of FLOAT or DOUBLE tensors (all three of one type)";
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    }
    if (o->conv.comp_type != o->x.dtype) {
        *why = "the compute type must be the tensors' data type (FLOAT or DOUBLE)";
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    }
    if (o->conv.spatial > DNN_MAX_SPATIAL) {
        *why = "the emulator implements convolutions of 1 to 3 spatial dimensions";
        return CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
    }
    if (o->x.dims[1] != o->w.dims[1]) {
        *why = "grouped convolutions (X channels != W input channels) are not implemented";
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    for (int i = 0; i < 3; i++) {
        if (t[i]->is_virtual) {
            *why = "a single-operation graph cannot have virtual tensors";
            return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;
        }
        if (t[i]->is_by_value || t[i]->vector_count != 1 || t[i]->reordering != CUDNN_TENSOR_REORDERING_NONE) {
            *why = "by-value, vectorized or reordered tensors are not implemented";
            return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
        }
    }
    *why = NULL;
    return CUDNN_STATUS_SUCCESS;
}

int64_t dnn_graph_workspace(const struct dnn_graph *g)
{
    const struct dnn_op *o = &g->op;
    if (o->kind != CONV_BWD_FILTER)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < o->w.nd; i++)
        n *= o->w.dims[i];
    return n * (int64_t)dnn_type_size(o->x.dtype);
}

static cudnnStatus_t finalize_heur(struct dnn_desc *d)
{
    struct dnn_heur *h = &d->u.heur;
    if (!(h->set & H_GRAPH))
        return missing(d, "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH");
    if (!(h->set & H_MODE))
        return missing(d, "CUDNN_ATTR_ENGINEHEUR_MODE");
    struct dnn_desc *r;
    cudnnStatus_t s = resolve("CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH", h->ref_graph,
                              CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &r);
    if (s)
        return s;
    h->graph = r->u.graph;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_engine(struct dnn_desc *d)
{
    struct dnn_engine *e = &d->u.engine;
    if (!(e->set & E_GRAPH))
        return missing(d, "CUDNN_ATTR_ENGINE_OPERATION_GRAPH");
    if (!(e->set & E_INDEX))
        return missing(d, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX");
    struct dnn_desc *r;
    cudnnStatus_t s = resolve("CUDNN_ATTR_ENGINE_OPERATION_GRAPH", e->ref_graph,
                              CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &r);
    if (s)
        return s;
    if (e->index != 0)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API,
                          "engine %lld: the emulator has one engine (global index 0)", (long long)e->index);
    const char *why;
    if ((s = dnn_graph_supported(&r->u.graph, &why)))
        return dnn_report(s, FIN_API, "engine 0 cannot compute this graph: %s", why);
    e->graph = r->u.graph;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_cfg(struct dnn_desc *d)
{
    struct dnn_cfg *c = &d->u.cfg;
    if (!(c->set & F_ENGINE))
        return missing(d, "CUDNN_ATTR_ENGINECFG_ENGINE");
    struct dnn_desc *r;
    cudnnStatus_t s = resolve("CUDNN_ATTR_ENGINECFG_ENGINE", c->ref_engine, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &r);
    if (s)
        return s;
    if (c->nknobs > 0)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API,
                          "knob %d: the emulator's engine has no knobs", (int)c->knobs[0].type);
    c->engine = r->u.engine;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_plan(struct dnn_desc *d)
{
    struct dnn_plan *p = &d->u.plan;
    if (!(p->set & P_CFG))
        return missing(d, "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG");
    if ((p->set & P_HANDLE) && dnn_handle_state(p->handle, NULL) != CUDNN_STATUS_SUCCESS)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "the plan's handle %p was destroyed", (void *)p->handle);
    struct dnn_desc *r;
    cudnnStatus_t s = resolve("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", p->ref_cfg,
                              CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &r);
    if (s)
        return s;
    const char *why;
    if ((s = dnn_graph_supported(&r->u.cfg.engine.graph, &why)))
        return dnn_report(s, FIN_API, "%s", why);
    p->cfg = r->u.cfg;
    if (!(p->set & P_HANDLE))
        p->handle = p->cfg.engine.graph.handle;
    p->workspace = dnn_graph_workspace(&p->cfg.engine.graph);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_variant(struct dnn_desc *d)
{
    struct dnn_variant *v = &d->u.variant;
    if (!(v->set & V_UIDS))
        return missing(d, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS");
    if (!(v->set & V_PTRS))
        return missing(d, "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS");
    if (!(v->set & V_WORKSPACE))
        return missing(d, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE");
    if (v->n_uids != v->n_ptrs)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "%d unique ids but %d data pointers", v->n_uids,
                          v->n_ptrs);
    for (int i = 0; i < v->n_uids; i++)
        for (int j = 0; j < i; j++)
            if (v->uids[i] == v->uids[j])
                return dnn_report(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, FIN_API,
                                  "unique id %lld appears twice", (long long)v->uids[i]);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_knob(struct dnn_desc *d)
{
    if (!(d->u.knob.set & K_TYPE))
        return missing(d, "CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE");
    if (!(d->u.knob.set & K_VALUE))
        return missing(d, "CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
{
    struct dnn_desc *d = dnn_desc_lookup(descriptor);
    if (!d)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "descriptor %p is NULL, unknown or destroyed", descriptor);
    if (d->finalized)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, FIN_API, "the %s descriptor is already finalized",
                          type_name(d->type));
    cudnnStatus_t s;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: s = finalize_tensor(d); break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: s = finalize_conv(d); break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: s = finalize_op(d); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: s = finalize_graph(d); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: s = finalize_heur(d); break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: s = finalize_engine(d); break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: s = finalize_cfg(d); break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: s = finalize_plan(d); break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: s = finalize_variant(d); break;
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: s = finalize_knob(d); break;
    default:
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, FIN_API,
                          "a %s descriptor is read-only: cuDNN fills and finalizes it", type_name(d->type));
    }
    if (s == CUDNN_STATUS_SUCCESS)
        d->finalized = 1;
    return s;
}

/* ---- get ---------------------------------------------------------------------------------- */

struct get_args {
    int32_t attr;
    cudnnBackendAttributeType_t type;
    int64_t requested;
    int64_t *count;
    void *arr;
};

/* Writes min(requested, n) elements of `es` bytes from `src`, after the
 * type check; n is what *count reports. */
static cudnnStatus_t put(const struct get_args *g, cudnnBackendAttributeType_t expected, const void *src,
                         int64_t n, size_t es)
{
    if (g->type != expected)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, GET_API,
                          "attribute %d has attribute type %d, not %d", (int)g->attr, (int)expected, (int)g->type);
    if (g->count)
        *g->count = n;
    if (!g->arr)
        return CUDNN_STATUS_SUCCESS;
    int64_t m = g->requested < n ? g->requested : n;
    if (m > 0)
        memcpy(g->arr, src, (size_t)m * es);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t put_i64(const struct get_args *g, int64_t v)
{
    return put(g, CUDNN_TYPE_INT64, &v, 1, sizeof v);
}

static cudnnStatus_t put_i32(const struct get_args *g, cudnnBackendAttributeType_t type, int32_t v)
{
    return put(g, type, &v, 1, sizeof v);
}

static cudnnStatus_t put_bool(const struct get_args *g, int v)
{
    bool b = v != 0;
    return put(g, CUDNN_TYPE_BOOLEAN, &b, 1, sizeof b);
}

/* Descriptor-valued attributes: element i of the caller's array (a live
 * descriptor of type `dtype`) receives item i of `src` (items of `size`
 * bytes copied into its union) and is finalized. */
static cudnnStatus_t put_descs(const struct get_args *g, int32_t dtype, const void *src, int64_t n, size_t size)
{
    if (g->type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, GET_API,
                          "attribute %d has attribute type CUDNN_TYPE_BACKEND_DESCRIPTOR, not %d", (int)g->attr,
                          (int)g->type);
    if (g->count)
        *g->count = n;
    if (!g->arr)
        return CUDNN_STATUS_SUCCESS;
    int64_t m = g->requested < n ? g->requested : n;
    cudnnBackendDescriptor_t *out = g->arr;
    for (int64_t i = 0; i < m; i++) {
        struct dnn_desc *dst = dnn_desc_lookup(out[i]);
        if (!dst)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, GET_API,
                              "attribute %d: element %lld (%p) is not a descriptor made by "
                              "cudnnBackendCreateDescriptor", (int)g->attr, (long long)i, out[i]);
        if (dst->type != dtype)
            return dnn_report(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, GET_API,
                              "attribute %d: element %lld must be a %s descriptor, not %s", (int)g->attr,
                              (long long)i, type_name(dtype), type_name(dst->type));
    }
    for (int64_t i = 0; i < m; i++) {
        struct dnn_desc *dst = dnn_desc_lookup(out[i]);
        memcpy(&dst->u, (const char *)src + (size_t)i * size, size);
        dst->finalized = 1;
    }
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t get_tensor(const struct dnn_tensor *t, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_TENSOR_UNIQUE_ID: return put_i64(g, t->uid);
    case CUDNN_ATTR_TENSOR_DATA_TYPE: return put_i32(g, CUDNN_TYPE_DATA_TYPE, t->dtype);
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: return put_i64(g, t->alignment);
    case CUDNN_ATTR_TENSOR_DIMENSIONS: return put(g, CUDNN_TYPE_INT64, t->dims, t->nd, sizeof(int64_t));
    case CUDNN_ATTR_TENSOR_STRIDES: return put(g, CUDNN_TYPE_INT64, t->strides, t->nd, sizeof(int64_t));
    case CUDNN_ATTR_TENSOR_VECTOR_COUNT: return put_i64(g, t->vector_count);
    case CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION: return put_i64(g, t->vectorized_dim);
    case CUDNN_ATTR_TENSOR_IS_VIRTUAL: return put_bool(g, t->is_virtual);
    case CUDNN_ATTR_TENSOR_IS_BY_VALUE: return put_bool(g, t->is_by_value);
    case CUDNN_ATTR_TENSOR_REORDERING_MODE: return put_i32(g, CUDNN_TYPE_TENSOR_REORDERING_MODE, t->reordering);
    }
    return CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t get_conv(const struct dnn_conv *c, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_CONVOLUTION_COMP_TYPE: return put_i32(g, CUDNN_TYPE_DATA_TYPE, c->comp_type);
    case CUDNN_ATTR_CONVOLUTION_CONV_MODE: return put_i32(g, CUDNN_TYPE_CONVOLUTION_MODE, c->mode);
    case CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS: return put_i64(g, c->spatial);
    case CUDNN_ATTR_CONVOLUTION_DILATIONS: return put(g, CUDNN_TYPE_INT64, c->dil, c->n_dil, sizeof(int64_t));
    case CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES:
        return put(g, CUDNN_TYPE_INT64, c->stride, c->n_stride, sizeof(int64_t));
    case CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS: return put(g, CUDNN_TYPE_INT64, c->pre, c->n_pre, sizeof(int64_t));
    case CUDNN_ATTR_CONVOLUTION_POST_PADDINGS:
        return put(g, CUDNN_TYPE_INT64, c->post, c->n_post, sizeof(int64_t));
    }
    return CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t get_op(const struct dnn_op *o, const struct get_args *g)
{
    static const int32_t first[3] = {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA};
    /* The attribute order within each operation: ALPHA, BETA, CONV_DESC, then
     * (forward) W, X, Y / (backward data) W, DX, DY / (backward filter) DW, X, DY. */
    int role = g->attr - first[o->kind];
    if (role < 0 || role > 5)
        return CUDNN_STATUS_BAD_PARAM;
    if (role <= 1) {
        double v = role == 0 ? o->alpha : o->beta;
        if (g->type == CUDNN_TYPE_FLOAT) {
            float f = (float)v;
            return put(g, CUDNN_TYPE_FLOAT, &f, 1, sizeof f);
        }
        return put(g, CUDNN_TYPE_DOUBLE, &v, 1, sizeof v);
    }
    if (role == 2)
        return put_descs(g, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &o->conv, 1, sizeof o->conv);
    const struct dnn_tensor *by_role[3] = {&o->w, &o->x, &o->y};
    return put_descs(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, by_role[role - 3], 1, sizeof(struct dnn_tensor));
}

/* The layouts the engine prefers: NCHW-like for each tensor (any strides work). */
static cudnnStatus_t get_layouts(const struct dnn_graph *gr, const struct get_args *g)
{
    struct dnn_layout_info info[3] = {
        {gr->op.x.uid, CUDNN_LAYOUT_TYPE_PREFERRED_NCHW},
        {gr->op.w.uid, CUDNN_LAYOUT_TYPE_PREFERRED_NCHW},
        {gr->op.y.uid, CUDNN_LAYOUT_TYPE_PREFERRED_NCHW},
    };
    return put_descs(g, CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR, info, 3, sizeof info[0]);
}

static cudnnStatus_t get_engine(const struct dnn_engine *e, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
        return put_descs(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &e->graph, 1, sizeof e->graph);
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX: return put_i64(g, e->index);
    case CUDNN_ATTR_ENGINE_KNOB_INFO: return put_descs(g, CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, NULL, 0, 0);
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE: return put(g, CUDNN_TYPE_NUMERICAL_NOTE, NULL, 0, sizeof(int32_t));
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: return put(g, CUDNN_TYPE_BEHAVIOR_NOTE, NULL, 0, sizeof(int32_t));
    case CUDNN_ATTR_ENGINE_LAYOUT_INFO: return get_layouts(&e->graph, g);
    case CUDNN_ATTR_ENGINE_SM_COUNT_TARGET: return put_i32(g, CUDNN_TYPE_INT32, e->sm_count);
    case CUDNN_ATTR_ENGINE_SHARED_MEMORY_LIMIT: return put_i32(g, CUDNN_TYPE_INT32, e->shared_memory_limit);
    }
    return CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t get_cfg(const struct dnn_cfg *c, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_ENGINECFG_ENGINE:
        return put_descs(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &c->engine, 1, sizeof c->engine);
    case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES:
        return put_descs(g, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, c->knobs, c->nknobs, sizeof c->knobs[0]);
    case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE: return put_i64(g, dnn_graph_workspace(&c->engine.graph));
    case CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED: return put_i32(g, CUDNN_TYPE_INT32, 0);   /* no kernels */
    case CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO:
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, GET_API,
                          "CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO: the engine has no intermediates");
    }
    return CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t get_heur(const struct dnn_heur *h, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH:
        return put_descs(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &h->graph, 1, sizeof h->graph);
    case CUDNN_ATTR_ENGINEHEUR_MODE: return put_i32(g, CUDNN_TYPE_HEUR_MODE, h->mode);
    case CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET: return put_i32(g, CUDNN_TYPE_INT32, h->sm_count);
    case CUDNN_ATTR_ENGINEHEUR_SHARED_MEMORY_LIMIT: return put_i32(g, CUDNN_TYPE_INT32, h->shared_memory_limit);
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: {
        /* One configuration (engine 0, no knobs) when the engine computes the graph, else none. */
        const char *why;
        struct dnn_cfg cfg;
        memset(&cfg, 0, sizeof cfg);
        if (dnn_graph_supported(&h->graph, &why) != CUDNN_STATUS_SUCCESS) {
            if (g->arr)     /* report once, when the results are fetched */
                jitckpt_simdev_log("cuDNN heuristics: no engine for this graph: %s", why);
            return put_descs(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, NULL, 0, sizeof cfg);
        }
        cfg.engine.graph = h->graph;
        cfg.engine.index = 0;
        cfg.engine.sm_count = h->sm_count;
        cfg.engine.set = E_GRAPH | E_INDEX;
        cfg.set = F_ENGINE;
        return put_descs(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg, 1, sizeof cfg);
    }
    }
    return CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t get_plan(const struct dnn_plan *p, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_EXECUTION_PLAN_HANDLE: return put(g, CUDNN_TYPE_HANDLE, &p->handle, 1, sizeof p->handle);
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
        return put_descs(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &p->cfg, 1, sizeof p->cfg);
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: return put_i64(g, p->workspace);
    case CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS:
    case CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS:
        return put(g, CUDNN_TYPE_INT64, NULL, 0, sizeof(int64_t));
    case CUDNN_ATTR_EXECUTION_PLAN_CUDA_GRAPH_RETENTION:
        return put_i32(g, CUDNN_TYPE_CUDA_GRAPH_RETENTION, p->graph_retention);
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION:
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, GET_API,
                          "CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: plan serialization is not implemented");
    }
    return CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t get_graph(const struct dnn_graph *gr, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_OPERATIONGRAPH_HANDLE: return put(g, CUDNN_TYPE_HANDLE, &gr->handle, 1, sizeof gr->handle);
    case CUDNN_ATTR_OPERATIONGRAPH_OPS: {
        static const int32_t types[3] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                         CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                         CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
        return put_descs(g, types[gr->op.kind], &gr->op, 1, sizeof gr->op);
    }
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT: return put_i64(g, 1);
    case CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED: return put_bool(g, gr->dynamic_shape);
    case CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED: return put_bool(g, gr->override_shape);
    case CUDNN_ATTR_OPERATIONGRAPH_MODE: return put_i32(g, CUDNN_TYPE_OPERATIONGRAPH_MODE, gr->mode);
    }
    return CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t get_variant(const struct dnn_variant *v, const struct get_args *g)
{
    switch (g->attr) {
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: return put(g, CUDNN_TYPE_INT64, v->uids, v->n_uids, sizeof(int64_t));
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: return put(g, CUDNN_TYPE_VOID_PTR, v->ptrs, v->n_ptrs, sizeof(void *));
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE: return put(g, CUDNN_TYPE_VOID_PTR, &v->workspace, 1, sizeof(void *));
    case CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES: return put(g, CUDNN_TYPE_VOID_PTR, NULL, 0, sizeof(void *));
    }
    return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t CUDNNWINAPI cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                                   cudnnBackendAttributeName_t attributeName,
                                                   cudnnBackendAttributeType_t attributeType,
                                                   int64_t requestedElementCount, int64_t *elementCount,
                                                   void *arrayOfElements)
{
    struct dnn_desc *d = dnn_desc_lookup(descriptor);
    if (!d)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, GET_API, "descriptor %p is NULL, unknown or destroyed", descriptor);
    if (!d->finalized)
        return dnn_report(CUDNN_STATUS_NOT_INITIALIZED, GET_API, "the %s descriptor is not finalized",
                          type_name(d->type));
    if (requestedElementCount < 0)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, GET_API, "requestedElementCount %lld is negative",
                          (long long)requestedElementCount);
    if (!arrayOfElements && !elementCount)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, GET_API,
                          "arrayOfElements and elementCount are both NULL");
    struct get_args g = {attributeName, attributeType, requestedElementCount, elementCount, arrayOfElements};
    cudnnStatus_t s = CUDNN_STATUS_BAD_PARAM;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: s = get_tensor(&d->u.tensor, &g); break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: s = get_conv(&d->u.conv, &g); break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: s = get_op(&d->u.op, &g); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: s = get_graph(&d->u.graph, &g); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: s = get_heur(&d->u.heur, &g); break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: s = get_engine(&d->u.engine, &g); break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: s = get_cfg(&d->u.cfg, &g); break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: s = get_plan(&d->u.plan, &g); break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: s = get_variant(&d->u.variant, &g); break;
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR:
        if (g.attr == CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE)
            s = put_i32(&g, CUDNN_TYPE_KNOB_TYPE, d->u.knob.type);
        else if (g.attr == CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)
            s = put_i64(&g, d->u.knob.value);
        break;
    case CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR:
        if (g.attr == CUDNN_ATTR_LAYOUT_INFO_TENSOR_UID)
            s = put_i64(&g, d->u.layout.uid);
        else if (g.attr == CUDNN_ATTR_LAYOUT_INFO_TYPES)
            s = put_i32(&g, CUDNN_TYPE_LAYOUT_TYPE, d->u.layout.type);
        break;
    default:
        break;
    }
    if (s == CUDNN_STATUS_BAD_PARAM)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, GET_API, "attribute %d is not an attribute of a %s descriptor",
                          (int)attributeName, type_name(d->type));
    return s;
}
