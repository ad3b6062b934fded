/* execute.c -- cudnnBackendExecute: checks the plan, the variant pack and
 * the memory they name, then queues one convolution job (conv.c) on the
 * handle's stream (NULL: the legacy default stream, as in the runtime) and
 * returns.  The job copies everything it needs (geometry, pointers, alpha
 * and beta), so the descriptors may be destroyed while it is queued, and it
 * can be captured into a graph like any stream work.
 *
 * Statuses: an invalid handle, a plan or variant pack that is not a live
 * descriptor of its type -> BAD_PARAM (BAD_PARAM_DESCRIPTOR_TYPE for the
 * wrong type); not finalized -> BAD_PARAM_NOT_FINALIZED; a tensor of the
 * graph without a data pointer in the variant pack -> BAD_PARAM; a NULL data
 * pointer or (nonzero workspace size) workspace -> BAD_PARAM_NULL_POINTER; a
 * pointer not aligned to its tensor's BYTE_ALIGNMENT ->
 * BAD_PARAM_MISALIGNED_POINTER; memory that is not the emulated device's or
 * too small for the tensor or the workspace -> BAD_PARAM (a GPU would fault
 * instead); a failed device or a stream the job cannot be queued on ->
 * EXECUTION_FAILED. */

#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char api[] = "cudnnBackendExecute";

static cudnnStatus_t live(cudnnBackendDescriptor_t d, int32_t type, const char *what, struct dnn_desc **out)
{
    struct dnn_desc *r = dnn_desc_lookup(d);
    if (!r)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "%s %p is NULL, unknown or destroyed", what, d);
    if (r->type != type)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, api, "%s %p is a descriptor of another type",
                          what, d);
    if (!r->finalized)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, api, "%s %p is not finalized", what, d);
    *out = r;
    return CUDNN_STATUS_SUCCESS;
}

/* The data pointer the variant pack gives tensor `t`, checked. */
static cudnnStatus_t pointer_for(const struct dnn_variant *v, const struct dnn_tensor *t, const char *role,
                                 void **out)
{
    int i = 0;
    while (i < v->n_uids && v->uids[i] != t->uid)
        i++;
    if (i == v->n_uids)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "the variant pack has no data pointer for %s (unique id %lld)",
                          role, (long long)t->uid);
    void *p = v->ptrs[i];
    if (!p)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, api, "the data pointer of %s (unique id %lld) is NULL",
                          role, (long long)t->uid);
    if ((uintptr_t)p % (uintptr_t)t->alignment)
        return dnn_report(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, api,
                          "%s %p is not aligned to its tensor's byte alignment %lld", role, p,
                          (long long)t->alignment);
    cudnnStatus_t s = dnn_check_tensor(api, role, p, t->nd, t->dims, t->strides, dnn_type_size(t->dtype));
    if (s)
        return s;
    *out = p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                              cudnnBackendDescriptor_t variantPack)
{
    struct dnn_handle_state hs;
    if (dnn_handle_state(handle, &hs) != CUDNN_STATUS_SUCCESS)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "invalid handle %p", (void *)handle);
    struct dnn_desc *pd, *vd;
    cudnnStatus_t s;
    if ((s = live(executionPlan, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "executionPlan", &pd)) ||
        (s = live(variantPack, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variantPack", &vd)))
        return s;
    const struct dnn_plan *plan = &pd->u.plan;
    const struct dnn_variant *v = &vd->u.variant;
    const struct dnn_op *o = &plan->cfg.engine.graph.op;
    static const char *const roles[3][3] = {{"X", "W", "Y"}, {"DX", "W", "DY"}, {"X", "DW", "DY"}};
    void *x, *w, *y;
    if ((s = pointer_for(v, &o->x, roles[o->kind][0], &x)) || (s = pointer_for(v, &o->w, roles[o->kind][1], &w)) ||
        (s = pointer_for(v, &o->y, roles[o->kind][2], &y)))
        return s;
    if (plan->workspace > 0) {
        if (!v->workspace)
            return dnn_report(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, api,
                              "the plan needs %lld bytes of workspace but the variant pack's is NULL",
                              (long long)plan->workspace);
        if (jitckpt_simdev_check_range(v->workspace, (size_t)plan->workspace) != cudaSuccess)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, api,
                              "workspace %p: not %lld bytes of emulated device memory", v->workspace,
                              (long long)plan->workspace);
    }
    cudaError_t derr = jitckpt_simdev_device_error(hs.device);
    if (derr != cudaSuccess)
        return dnn_report(CUDNN_STATUS_EXECUTION_FAILED, api, "device %d failed (cuda error %d)", hs.device,
                          (int)derr);

    struct conv_job *j = calloc(1, sizeof *j);
    if (!j)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    j->kind = o->kind;
    j->type = o->x.dtype == CUDNN_DATA_FLOAT ? DNN_F32 : DNN_F64;
    j->flip = o->conv.mode == CUDNN_CONVOLUTION;
    j->N = o->x.dims[0];
    j->C = o->x.dims[1];
    j->K = o->w.dims[0];
    j->xs[0] = o->x.strides[0];
    j->xs[1] = o->x.strides[1];
    j->ws[0] = o->w.strides[0];
    j->ws[1] = o->w.strides[1];
    j->ys[0] = o->y.strides[0];
    j->ys[1] = o->y.strides[1];
    /* Spatial dimensions right-aligned into (d, h, w): a 2-D convolution has d = 1. */
    int sp = (int)o->conv.spatial, skip = DNN_MAX_SPATIAL - sp;
    for (int i = 0; i < DNN_MAX_SPATIAL; i++) {
        int src = i - skip;
        int have = src >= 0;
        j->in[i] = have ? o->x.dims[2 + src] : 1;
        j->out[i] = have ? o->y.dims[2 + src] : 1;
        j->filt[i] = have ? o->w.dims[2 + src] : 1;
        j->stride[i] = have ? o->conv.stride[src] : 1;
        j->pre[i] = have ? o->conv.pre[src] : 0;
        j->dil[i] = have ? o->conv.dil[src] : 1;
        j->xs[2 + i] = have ? o->x.strides[2 + src] : 0;
        j->ws[2 + i] = have ? o->w.strides[2 + src] : 0;
        j->ys[2 + i] = have ? o->y.strides[2 + src] : 0;
    }
    j->x = x;
    j->w = w;
    j->y = y;
    j->workspace = v->workspace;
    j->alpha = o->alpha;
    j->beta = o->beta;
    /* On failure the enqueue has released (freed) the job. */
    cudaError_t e = jitckpt_simdev_enqueue(hs.stream, api, conv_job_run, j, conv_job_release);
    if (e != cudaSuccess)
        return dnn_report(CUDNN_STATUS_EXECUTION_FAILED, api, "cannot queue the work on stream %p (cuda error %d)",
                          (void *)hs.stream, (int)e);
    return CUDNN_STATUS_SUCCESS;
}
