/* cudnn_conv.c -- exercises the emulated cuDNN (emulator/build/libcudnn.so.9)
 * for tests/test_emulator_cudnn.py.  Plain C against NVIDIA's cuDNN 9 headers,
 * linked with -lcudnn -lcudart and resolved at run time (LD_LIBRARY_PATH, no
 * rpath), so the same binary runs on NVIDIA's libraries or through a device
 * proxy.  Its device work is cudaMalloc/cudaMemcpy/cudaMemset and cuDNN calls
 * only (no kernels: it builds with gcc).
 *
 *   cudnn_conv [all|conv|bn|errors]   the checks below, then DONE
 *   cudnn_conv train                  a few steps of a tiny conv net, then DONE
 *
 * Output, one line per check:
 *   CASE <name> hash=<FNV-1a 64 of the results, in logical order> maxdiff=<largest
 *        |result - long double reference| / max(1, |reference|)> exact=<elements that
 *        differ from the host's fixed-order computation> pad=<elements outside the
 *        output tensor (gaps between strided elements, guard after it) that changed>
 *   STATUS <name> <cudnnStatus_t returned>
 *   INFO <name> <value>
 * train prints, per step, "step <i> loss <%.9g>", then "reference_checksum <16 hex
 * digits>" (the same loop computed on the host in the emulator's documented
 * order) and "checksum <16 hex digits>" (FNV-1a of every step's loss and the
 * final parameters and running statistics), then DONE.  Nothing it prints varies
 * from run to run on the emulator.  Exit status 0 unless a call that must
 * succeed failed.
 *
 * Two references per element.  "exact": the host repeats the emulator's
 * documented computation (emulator/README.md, "cuDNN") in the same order and
 * precision, so the bits must be equal (a GPU sums in another order).
 * "maxdiff": a straightforward long double computation.  Compile with
 * -ffp-contract=off so that the exact reference rounds like the emulator. */

#include <cudnn.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "library_common.h"

#define CHECK_DNN(expr) CHECK_STATUS(cudnnStatus_t, expr, #expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)

static void status(const char *name, cudnnStatus_t s)
{
    printf("STATUS %s %d\n", name, (int)s);
}

/* ---- data --------------------------------------------------------------------------- */

/* In [-2, 2), with a full 53-bit mantissa (rounded to float for single precision). */
static double next_value(void)
{
    return next_in(2.0);
}

/* A tensor of up to 5 dimensions: logical dims, and strides in elements. */
struct tensor {
    int nd;
    int64_t dims[5], strides[5];
};

static int64_t numel(const struct tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->nd; i++)
        n *= t->dims[i];
    return n;
}

/* Elements the buffer holds: the extent of the strides, plus a guard. */
enum { GUARD = 7 };

static int64_t buffer_elems(const struct tensor *t)
{
    int64_t hi = 0;
    for (int i = 0; i < t->nd; i++)
        hi += (t->dims[i] - 1) * t->strides[i];
    return hi + 1 + GUARD;
}

/* The memory offset of the i-th element in logical (row-major) order. */
static int64_t offset_of(const struct tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->nd - 1; d >= 0; d--) {
        off += (i % t->dims[d]) * t->strides[d];
        i /= t->dims[d];
    }
    return off;
}

enum layout { PACKED, CHANNELS_LAST, PADDED };

/* Strides of `layout` for dims [outer, channel, spatial...]. */
static void set_layout(struct tensor *t, enum layout layout)
{
    int nd = t->nd;
    if (layout == CHANNELS_LAST) {
        int64_t s = 1;
        t->strides[1] = s;
        s *= t->dims[1];
        for (int d = nd - 1; d >= 2; d--) {
            t->strides[d] = s;
            s *= t->dims[d];
        }
        t->strides[0] = s;
        return;
    }
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        t->strides[d] = s;
        s *= t->dims[d] + (layout == PADDED ? 1 : 0);
    }
}

/* A host buffer of `es`-byte elements for t: every element set to `fill`. */
static void *host_buffer(const struct tensor *t, size_t es, double fill)
{
    int64_t n = buffer_elems(t);
    void *p = malloc((size_t)n * es);
    for (int64_t i = 0; i < n; i++) {
        if (es == 4)
            ((float *)p)[i] = (float)fill;
        else
            ((double *)p)[i] = fill;
    }
    return p;
}

static double get(const void *p, size_t es, int64_t off)
{
    return es == 4 ? (double)((const float *)p)[off] : ((const double *)p)[off];
}

static void put(void *p, size_t es, int64_t off, double v)
{
    if (es == 4)
        ((float *)p)[off] = (float)v;
    else
        ((double *)p)[off] = v;
}

/* Fills the tensor's elements (logical order) with random values times `scale`. */
static void randomize(void *p, size_t es, const struct tensor *t, double scale)
{
    for (int64_t i = 0; i < numel(t); i++)
        put(p, es, offset_of(t, i), next_value() * scale);
}

static void *to_device(const void *host, size_t bytes)
{
    void *d;
    CHECK_CUDA(cudaMalloc(&d, bytes));
    CHECK_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Compares the device result `dev` with the exact reference `exact` and the
 * long double reference `ld` (logical order), counts changed gaps/guard
 * against `before`, and folds the results into the CASE line's numbers. */
struct verdict {
    uint64_t hash;
    double maxdiff;
    long long inexact, pad;
};

static void judge(struct verdict *v, const void *dev, const void *exact, const long double *ld, const void *before,
                  const struct tensor *t, size_t es)
{
    int64_t n = numel(t), total = buffer_elems(t);
    char *inside = calloc((size_t)total, 1);
    for (int64_t i = 0; i < n; i++) {
        int64_t off = offset_of(t, i);
        inside[off] = 1;
        v->hash = fnv1a(v->hash, (const char *)dev + off * es, es);
        if (memcmp((const char *)dev + off * es, (const char *)exact + off * es, es))
            v->inexact++;
        long double r = ld[i], d = (long double)get(dev, es, off);
        long double scale = fabsl(r) > 1.0L ? fabsl(r) : 1.0L;
        double diff = (double)(fabsl(d - r) / scale);
        if (isnan(diff) || diff > v->maxdiff)   /* a NaN sticks */
            v->maxdiff = diff;
    }
    for (int64_t off = 0; off < total; off++)
        if (!inside[off] && memcmp((const char *)dev + off * es, (const char *)before + off * es, es))
            v->pad++;
    free(inside);
}

static void print_case(const char *name, const struct verdict *v)
{
    printf("CASE %s hash=%016llx maxdiff=%.3e exact=%lld pad=%lld\n", name, (unsigned long long)v->hash, v->maxdiff,
           v->inexact, v->pad);
}

/* ---- the backend API, the way cudnn_frontend drives it ------------------------------- */

static cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type)
{
    cudnnBackendDescriptor_t d;
    CHECK_DNN(cudnnBackendCreateDescriptor(type, &d));
    return d;
}

static void set_i64(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, int64_t n, const int64_t *v)
{
    CHECK_DNN(cudnnBackendSetAttribute(d, a, CUDNN_TYPE_INT64, n, v));
}

static void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v)
{
    CHECK_DNN(cudnnBackendSetAttribute(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v));
}

/* TENSOR: unique id, data type, dims, strides, byte alignment; finalized if `finalize`. */
static cudnnBackendDescriptor_t tensor_desc(int64_t uid, cudnnDataType_t dt, const struct tensor *t, int64_t align,
                                            int finalize)
{
    cudnnBackendDescriptor_t d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    set_i64(d, CUDNN_ATTR_TENSOR_DIMENSIONS, t->nd, t->dims);
    set_i64(d, CUDNN_ATTR_TENSOR_STRIDES, t->nd, t->strides);
    set_i64(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 1, &uid);
    set_i64(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 1, &align);
    bool no = false;    /* what frontends set, harmlessly */
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &no));
    if (finalize)
        CHECK_DNN(cudnnBackendFinalize(d));
    return d;
}

/* A convolution problem: the geometry of the forward convolution. */
struct conv_problem {
    int dtype;                  /* 0: FLOAT, 1: DOUBLE */
    int kind;                   /* 0 forward, 1 backward data, 2 backward filter */
    int mode;                   /* cudnnConvolutionMode_t */
    int nsp;                    /* spatial dimensions, 1 to 3 */
    int64_t N, C, K;
    int64_t in[3], filt[3], pre[3], post[3], stride[3], dil[3];
    enum layout layout;
    double alpha, beta;
};

static int64_t out_size(const struct conv_problem *p, int i)
{
    return (p->in[i] + p->pre[i] + p->post[i] - ((p->filt[i] - 1) * p->dil[i] + 1)) / p->stride[i] + 1;
}

static void problem_tensors(const struct conv_problem *p, struct tensor *x, struct tensor *w, struct tensor *y)
{
    x->nd = w->nd = y->nd = p->nsp + 2;
    x->dims[0] = y->dims[0] = p->N;
    x->dims[1] = w->dims[1] = p->C;
    w->dims[0] = y->dims[1] = p->K;
    for (int i = 0; i < p->nsp; i++) {
        x->dims[2 + i] = p->in[i];
        w->dims[2 + i] = p->filt[i];
        y->dims[2 + i] = out_size(p, i);
    }
    set_layout(x, p->layout);
    set_layout(w, p->layout);
    set_layout(y, p->layout);
}

static cudnnBackendDescriptor_t conv_desc(const struct conv_problem *p, int finalize)
{
    cudnnBackendDescriptor_t d = create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    cudnnDataType_t comp = p->dtype ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = p->mode;
    int64_t nsp = p->nsp;
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    set_i64(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 1, &nsp);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, nsp, p->pre);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, nsp, p->post);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_DILATIONS, nsp, p->dil);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, nsp, p->stride);
    if (finalize)
        CHECK_DNN(cudnnBackendFinalize(d));
    return d;
}

static const cudnnBackendDescriptorType_t op_types[3] = {
    CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
};

/* Attribute numbers by kind: alpha, beta, conv, x, w, y (dx/dw/dy by role). */
static const cudnnBackendAttributeName_t op_attrs[3][6] = {
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

/* The operation, alpha and beta as FLOAT for FLOAT data and DOUBLE for DOUBLE
 * (what cudnn_frontend does); NULL tensors are left unset. */
static cudnnBackendDescriptor_t op_desc(int kind, int dtype, double alpha, double beta, cudnnBackendDescriptor_t conv,
                                        cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                                        cudnnBackendDescriptor_t y, int finalize)
{
    cudnnBackendDescriptor_t d = create(op_types[kind]);
    const cudnnBackendAttributeName_t *a = op_attrs[kind];
    if (dtype) {
        CHECK_DNN(cudnnBackendSetAttribute(d, a[0], CUDNN_TYPE_DOUBLE, 1, &alpha));
        CHECK_DNN(cudnnBackendSetAttribute(d, a[1], CUDNN_TYPE_DOUBLE, 1, &beta));
    } else {
        float fa = (float)alpha, fb = (float)beta;
        CHECK_DNN(cudnnBackendSetAttribute(d, a[0], CUDNN_TYPE_FLOAT, 1, &fa));
        CHECK_DNN(cudnnBackendSetAttribute(d, a[1], CUDNN_TYPE_FLOAT, 1, &fb));
    }
    set_desc(d, a[2], conv);
    if (x)
        set_desc(d, a[3], x);
    if (w)
        set_desc(d, a[4], w);
    if (y)
        set_desc(d, a[5], y);
    if (finalize)
        CHECK_DNN(cudnnBackendFinalize(d));
    return d;
}

static cudnnBackendDescriptor_t graph_desc(cudnnHandle_t handle, int nops, cudnnBackendDescriptor_t *ops)
{
    cudnnBackendDescriptor_t d = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops));
    CHECK_DNN(cudnnBackendFinalize(d));
    return d;
}

/* What the chain reports on the way, for INFO lines. */
struct chain_info {
    int64_t global_count, heur_count, engine_index, numerical_notes, behavior_notes, knobs, layouts;
    int64_t workspace, cfg_workspace;
};

/* Heuristics -> engine configurations -> engine -> plan, as cudnn_frontend
 * (and with it PyTorch) does: the results are fetched into descriptors this
 * program creates.  Returns the finalized plan. */
static cudnnBackendDescriptor_t build_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t graph, struct chain_info *ci)
{
    int64_t n;
    CHECK_DNN(cudnnBackendGetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &n,
                                       &ci->global_count));
    cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_INSTANT;
    CHECK_DNN(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    int32_t sm = 0;
    CHECK_DNN(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET, CUDNN_TYPE_INT32, 1, &sm));
    CHECK_DNN(cudnnBackendFinalize(heur));
    CHECK_DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &ci->heur_count, NULL));
    if (ci->heur_count < 1) {
        fprintf(stderr, "the heuristics returned no engine configuration\n");
        exit(1);
    }
    cudnnBackendDescriptor_t cfgs[4];
    int64_t want = ci->heur_count < 4 ? ci->heur_count : 4, got;
    for (int64_t i = 0; i < want; i++)
        cfgs[i] = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    CHECK_DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, want, &got,
                                       cfgs));
    /* The engine of the first configuration, its notes and knobs (PyTorch's filters). */
    cudnnBackendDescriptor_t engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    CHECK_DNN(cudnnBackendGetAttribute(cfgs[0], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                       &engine));
    CHECK_DNN(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                       &ci->engine_index));
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    CHECK_DNN(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &ci->numerical_notes, notes));
    cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    CHECK_DNN(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                       CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &ci->behavior_notes, behavior));
    cudnnBackendDescriptor_t knobs[CUDNN_KNOB_TYPE_COUNTS];
    for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; i++)
        knobs[i] = create(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR);
    CHECK_DNN(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       CUDNN_KNOB_TYPE_COUNTS, &ci->knobs, knobs));
    for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; i++)
        CHECK_DNN(cudnnBackendDestroyDescriptor(knobs[i]));
    CHECK_DNN(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_LAYOUT_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &ci->layouts, NULL));
    CHECK_DNN(cudnnBackendGetAttribute(cfgs[0], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                       &ci->cfg_workspace));
    cudnnBackendDescriptor_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    CHECK_DNN(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[0]);
    CHECK_DNN(cudnnBackendFinalize(plan));
    CHECK_DNN(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                       &ci->workspace));
    /* The plan keeps copies: everything that led to it can go. */
    CHECK_DNN(cudnnBackendDestroyDescriptor(engine));
    for (int64_t i = 0; i < want; i++)
        CHECK_DNN(cudnnBackendDestroyDescriptor(cfgs[i]));
    CHECK_DNN(cudnnBackendDestroyDescriptor(heur));
    return plan;
}

static cudnnBackendDescriptor_t variant_pack(int n, const int64_t *uids, void *const *ptrs, void *workspace)
{
    cudnnBackendDescriptor_t d = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set_i64(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, n, uids);
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs));
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    CHECK_DNN(cudnnBackendFinalize(d));
    return d;
}

enum { UID_X = 'x', UID_W = 'w', UID_Y = 'y' };

/* A whole convolution through the backend API: descriptors, graph, plan,
 * workspace, variant pack, execute.  x, w, y are device pointers (by forward
 * role).  The descriptors are destroyed before it returns (the queued work
 * does not need them). */
static void run_conv(cudnnHandle_t handle, const struct conv_problem *p, void *x, void *w, void *y,
                     struct chain_info *ci, int workspace_fill)
{
    struct tensor tx, tw, ty;
    problem_tensors(p, &tx, &tw, &ty);
    cudnnDataType_t dt = p->dtype ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    int64_t align = p->dtype ? 8 : 4;
    cudnnBackendDescriptor_t dx = tensor_desc(UID_X, dt, &tx, align, 1), dw = tensor_desc(UID_W, dt, &tw, align, 1),
                             dy = tensor_desc(UID_Y, dt, &ty, align, 1), dc = conv_desc(p, 1);
    cudnnBackendDescriptor_t op = op_desc(p->kind, p->dtype, p->alpha, p->beta, dc, dx, dw, dy, 1);
    cudnnBackendDescriptor_t graph = graph_desc(handle, 1, &op);
    struct chain_info local;
    if (!ci)
        ci = &local;
    cudnnBackendDescriptor_t plan = build_plan(handle, graph, ci);
    void *ws = NULL;
    if (ci->workspace > 0) {
        CHECK_CUDA(cudaMalloc(&ws, (size_t)ci->workspace));
        CHECK_CUDA(cudaMemset(ws, workspace_fill, (size_t)ci->workspace));
    }
    int64_t uids[3] = {UID_X, UID_Y, UID_W};
    void *ptrs[3] = {x, y, w};
    cudnnBackendDescriptor_t pack = variant_pack(3, uids, ptrs, ws);
    CHECK_DNN(cudnnBackendExecute(handle, plan, pack));
    cudnnBackendDescriptor_t all[8] = {pack, plan, graph, op, dc, dx, dw, dy};
    for (int i = 0; i < 8; i++)
        CHECK_DNN(cudnnBackendDestroyDescriptor(all[i]));
    if (ws) {
        if (workspace_fill) {   /* the workspace really is scratch: the job wrote into it */
            unsigned char *h = malloc((size_t)ci->workspace);
            CHECK_CUDA(cudaMemcpy(h, ws, (size_t)ci->workspace, cudaMemcpyDeviceToHost));
            int64_t changed = 0;
            for (int64_t i = 0; i < ci->workspace; i++)
                changed += h[i] != (unsigned char)workspace_fill;
            printf("INFO workspace_bytes_written %s\n", changed > 0 ? "yes" : "no");
            free(h);
        }
        CHECK_CUDA(cudaFree(ws));
    }
}

/* ---- host references for the convolutions --------------------------------------------------- */

/* The problem in the emulator's normalised form: 3 spatial dimensions,
 * missing ones (on the left) of size 1, strides in elements. */
struct geom {
    int kind, flip;
    int64_t N, C, K, in[3], out[3], filt[3], stride[3], pre[3], dil[3];
    int64_t xs[5], ws[5], ys[5];
};

static void make_geom(const struct conv_problem *p, struct geom *g)
{
    struct tensor tx, tw, ty;
    problem_tensors(p, &tx, &tw, &ty);
    memset(g, 0, sizeof *g);
    g->kind = p->kind;
    g->flip = p->mode == CUDNN_CONVOLUTION;
    g->N = p->N;
    g->C = p->C;
    g->K = p->K;
    for (int i = 0; i < 2; i++) {
        g->xs[i] = tx.strides[i];
        g->ws[i] = tw.strides[i];
        g->ys[i] = ty.strides[i];
    }
    int skip = 3 - p->nsp;
    for (int i = 0; i < 3; i++) {
        int s = i - skip, have = s >= 0;
        g->in[i] = have ? p->in[s] : 1;
        g->out[i] = have ? out_size(p, s) : 1;
        g->filt[i] = have ? p->filt[s] : 1;
        g->stride[i] = have ? p->stride[s] : 1;
        g->pre[i] = have ? p->pre[s] : 0;
        g->dil[i] = have ? p->dil[s] : 1;
        g->xs[2 + i] = have ? tx.strides[2 + s] : 0;
        g->ws[2 + i] = have ? tw.strides[2 + s] : 0;
        g->ys[2 + i] = have ? ty.strides[2 + s] : 0;
    }
}

static int64_t xoff(const struct geom *g, int64_t n, int64_t c, const int64_t *i)
{
    return n * g->xs[0] + c * g->xs[1] + i[0] * g->xs[2] + i[1] * g->xs[3] + i[2] * g->xs[4];
}

static int64_t yoff(const struct geom *g, int64_t n, int64_t k, const int64_t *o)
{
    return n * g->ys[0] + k * g->ys[1] + o[0] * g->ys[2] + o[1] * g->ys[3] + o[2] * g->ys[4];
}

/* The filter element used at position f (mirrored for CUDNN_CONVOLUTION). */
static int64_t woff(const struct geom *g, int64_t k, int64_t c, const int64_t *f)
{
    int64_t m[3];
    for (int d = 0; d < 3; d++)
        m[d] = g->flip ? g->filt[d] - 1 - f[d] : f[d];
    return k * g->ws[0] + c * g->ws[1] + m[0] * g->ws[2] + m[1] * g->ws[3] + m[2] * g->ws[4];
}

/* Next index of a row-major odometer over `ext`; 0 when it wraps. */
static int step3(int64_t *i, const int64_t *ext)
{
    for (int d = 2; d >= 0; d--) {
        if (++i[d] < ext[d])
            return 1;
        i[d] = 0;
    }
    return 0;
}

/* Input position for output o and filter position f, or 0 if in the padding. */
static int input_at(const struct geom *g, const int64_t *o, const int64_t *f, int64_t *i)
{
    for (int d = 0; d < 3; d++) {
        i[d] = o[d] * g->stride[d] - g->pre[d] + f[d] * g->dil[d];
        if (i[d] < 0 || i[d] >= g->in[d])
            return 0;
    }
    return 1;
}

/* Output position that input i meets through filter position f, or 0. */
static int output_at(const struct geom *g, const int64_t *i, const int64_t *f, int64_t *o)
{
    for (int d = 0; d < 3; d++) {
        int64_t q = i[d] + g->pre[d] - f[d] * g->dil[d];
        if (q < 0 || q % g->stride[d] || q / g->stride[d] >= g->out[d])
            return 0;
        o[d] = q / g->stride[d];
    }
    return 1;
}

/* The exact reference: the documented order in T, one rounding per operation.
 * x, w, y are host buffers laid out like the device's (y: the output by role). */
#define DEFINE_HOST_CONV(SUFFIX, T)                                                                          \
    /* The output from the sum: alpha * acc (+ beta * old); alpha 0 reads no input, beta 0 not the output. */ \
    static T blend_##SUFFIX(T alpha, T beta, T acc, T old)                                                   \
    {                                                                                                        \
        if (alpha == 0)                                                                                      \
            return beta == 0 ? 0 : beta * old;                                                               \
        T t = alpha * acc;                                                                                   \
        return beta != 0 ? t + beta * old : t;                                                               \
    }                                                                                                        \
                                                                                                             \
    static void host_conv_##SUFFIX(const struct geom *g, T *X, T *W, T *Y, double alpha_d, double beta_d)   \
    {                                                                                                        \
        const T alpha = (T)alpha_d, beta = (T)beta_d;                                                        \
        int64_t a[3], b[3], c3[3];                                                                           \
        if (g->kind == 0) {                                                                                  \
            for (int64_t n = 0; n < g->N; n++)                                                               \
                for (int64_t k = 0; k < g->K; k++) {                                                         \
                    memset(a, 0, sizeof a);                                                                  \
                    do {                                                                                     \
                        T *out = &Y[yoff(g, n, k, a)];                                                       \
                        T acc = 0;                                                                           \
                        for (int64_t c = 0; c < g->C && alpha != 0; c++) {                                   \
                            memset(b, 0, sizeof b);                                                          \
                            do                                                                               \
                                if (input_at(g, a, b, c3))                                                   \
                                    acc += X[xoff(g, n, c, c3)] * W[woff(g, k, c, b)];                       \
                            while (step3(b, g->filt));                                                       \
                        }                                                                                    \
                        *out = blend_##SUFFIX(alpha, beta, acc, *out);                                       \
                    } while (step3(a, g->out));                                                              \
                }                                                                                            \
        } else if (g->kind == 1) {                                                                           \
            for (int64_t n = 0; n < g->N; n++)                                                               \
                for (int64_t c = 0; c < g->C; c++) {                                                         \
                    memset(a, 0, sizeof a);                                                                  \
                    do {                                                                                     \
                        T *out = &X[xoff(g, n, c, a)];                                                       \
                        T acc = 0;                                                                           \
                        for (int64_t k = 0; k < g->K && alpha != 0; k++) {                                   \
                            memset(b, 0, sizeof b);                                                          \
                            do                                                                               \
                                if (output_at(g, a, b, c3))                                                  \
                                    acc += Y[yoff(g, n, k, c3)] * W[woff(g, k, c, b)];                       \
                            while (step3(b, g->filt));                                                       \
                        }                                                                                    \
                        *out = blend_##SUFFIX(alpha, beta, acc, *out);                                       \
                    } while (step3(a, g->in));                                                               \
                }                                                                                            \
        } else {                                                                                             \
            for (int64_t k = 0; k < g->K; k++)                                                               \
                for (int64_t c = 0; c < g->C; c++) {                                                         \
                    memset(b, 0, sizeof b);                                                                  \
                    do {                                                                                     \
                        T *out = &W[woff(g, k, c, b)];                                                       \
                        T acc = 0;                                                                           \
                        for (int64_t n = 0; n < g->N && alpha != 0; n++) {                                   \
                            memset(a, 0, sizeof a);                                                          \
                            do                                                                               \
                                if (input_at(g, a, b, c3))                                                   \
                                    acc += X[xoff(g, n, c, c3)] * Y[yoff(g, n, k, a)];                       \
                            while (step3(a, g->out));                                                        \
                        }                                                                                    \
                        *out = blend_##SUFFIX(alpha, beta, acc, *out);                                       \
                    } while (step3(b, g->filt));                                                             \
                }                                                                                            \
        }                                                                                                    \
    }

DEFINE_HOST_CONV(f32, float)
DEFINE_HOST_CONV(f64, double)

static void host_conv(const struct geom *g, int dtype, void *x, void *w, void *y, double alpha, double beta)
{
    if (dtype)
        host_conv_f64(g, x, w, y, alpha, beta);
    else
        host_conv_f32(g, x, w, y, alpha, beta);
}

/* The long double reference of the output (by role), in logical order: a sum
 * over every (channel, filter position) pair whose input lies inside,
 * computed from the definition out[o] = sum x[o*stride - pre + f*dil] * w[f]. */
static long double *ld_conv(const struct geom *g, size_t es, const void *x, const void *w, const void *y,
                            double alpha, double beta)
{
    int64_t total = g->kind == 0   ? g->N * g->K * g->out[0] * g->out[1] * g->out[2]
                    : g->kind == 1 ? g->N * g->C * g->in[0] * g->in[1] * g->in[2]
                                   : g->K * g->C * g->filt[0] * g->filt[1] * g->filt[2];
    long double *r = calloc((size_t)total, sizeof *r);
    int64_t o[3], f[3], i[3];
    /* Every (n, k, c, o, f) term, added to the element it belongs to. */
    for (int64_t n = 0; n < g->N; n++)
        for (int64_t k = 0; k < g->K; k++)
            for (int64_t c = 0; c < g->C; c++) {
                memset(o, 0, sizeof o);
                do {
                    memset(f, 0, sizeof f);
                    do {
                        if (!input_at(g, o, f, i))
                            continue;
                        long double term = (long double)get(x, es, xoff(g, n, c, i)) *
                                           (long double)get(y, es, yoff(g, n, k, o));
                        long double prod = (long double)get(x, es, xoff(g, n, c, i)) *
                                           (long double)get(w, es, woff(g, k, c, f));
                        long double dterm = (long double)get(y, es, yoff(g, n, k, o)) *
                                            (long double)get(w, es, woff(g, k, c, f));
                        int64_t m[3];   /* the filter element's own index (mirrored) */
                        for (int d = 0; d < 3; d++)
                            m[d] = g->flip ? g->filt[d] - 1 - f[d] : f[d];
                        if (g->kind == 0)
                            r[(((n * g->K + k) * g->out[0] + o[0]) * g->out[1] + o[1]) * g->out[2] + o[2]] += prod;
                        else if (g->kind == 1)
                            r[(((n * g->C + c) * g->in[0] + i[0]) * g->in[1] + i[1]) * g->in[2] + i[2]] += dterm;
                        else
                            r[(((k * g->C + c) * g->filt[0] + m[0]) * g->filt[1] + m[1]) * g->filt[2] + m[2]] += term;
                    } while (step3(f, g->filt));
                } while (step3(o, g->out));
            }
    /* alpha * sum + beta * old (old from the output's initial buffer `y`-role). */
    (void)alpha;
    (void)beta;
    return r;
}

/* ---- convolution cases ------------------------------------------------------------------ */

struct conv_case {
    const char *name;
    uint64_t seed;
    int default_stream;         /* run on the handle's default (NULL) stream */
    int twice;                  /* execute the same problem twice (the output is reset between) */
    struct conv_problem p;
};

#define SP2(a, b) {a, b, 0}
#define SP1(a) {a, 0, 0}
#define SP3(a, b, c) {a, b, c}

static const struct conv_case conv_cases[] = {
    /* name, seed, default stream, twice, {dtype, kind, mode, nsp, N, C, K, in, filt, pre, post, stride, dil, layout, alpha, beta} */
    {"f32_fwd", 1, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 1.0, 0.0}},
    {"f32_fwd_default_stream", 1, 1, 0, {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 1.0, 0.0}},
    {"f32_fwd_channels_last", 1, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), CHANNELS_LAST, 1.0, 0.0}},
    {"f32_fwd_padded_strides", 1, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PADDED, 1.0, 0.0}},
    {"f32_fwd_twice", 1, 0, 1, {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 1.0, 0.0}},
    {"f32_fwd_stride_dilation", 2, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 2, 3, 2, 3, SP2(11, 9), SP2(3, 2), SP2(2, 0), SP2(1, 1), SP2(2, 3), SP2(2, 1), PACKED, 1.0, 0.0}},
    {"f32_fwd_alpha_beta", 3, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 3, 2, SP2(6, 6), SP2(3, 3), SP2(0, 2), SP2(1, 0), SP2(1, 2), SP2(1, 1), PADDED, 0.5, -1.25}},
    {"f32_fwd_convolution_mode", 4, 0, 0, {0, 0, CUDNN_CONVOLUTION, 2, 2, 3, 2, SP2(6, 5), SP2(3, 2), SP2(1, 0), SP2(1, 1), SP2(1, 1), SP2(1, 2), CHANNELS_LAST, 1.0, 0.0}},
    {"f32_fwd_1d", 5, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 1, 3, 4, 5, SP1(17), SP1(5), SP1(2), SP1(2), SP1(3), SP1(1), PACKED, 1.0, 0.0}},
    {"f32_fwd_3d", 6, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 3, 2, 2, 3, SP3(5, 6, 4), SP3(2, 3, 2), SP3(1, 1, 0), SP3(0, 1, 1), SP3(1, 2, 1), SP3(2, 1, 1), PACKED, 1.0, 0.0}},
    {"f32_fwd_alpha_zero", 7, 0, 0, {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 2, 2, SP2(5, 5), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 0.0, 0.75}},
    {"f32_bwd_data", 8, 0, 0, {0, 1, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 1.0, 0.0}},
    {"f32_bwd_data_channels_last", 8, 0, 0, {0, 1, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), CHANNELS_LAST, 1.0, 0.0}},
    {"f32_bwd_data_stride_dilation", 9, 0, 0, {0, 1, CUDNN_CROSS_CORRELATION, 2, 3, 2, 3, SP2(11, 9), SP2(3, 2), SP2(2, 0), SP2(1, 1), SP2(2, 3), SP2(2, 1), PADDED, 1.0, 0.0}},
    {"f32_bwd_data_alpha_beta", 10, 0, 0, {0, 1, CUDNN_CONVOLUTION, 2, 2, 2, 3, SP2(6, 7), SP2(2, 3), SP2(1, 1), SP2(0, 1), SP2(2, 1), SP2(1, 2), PACKED, 1.5, 0.25}},
    {"f32_bwd_filter", 11, 0, 0, {0, 2, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 1.0, 0.0}},
    {"f32_bwd_filter_padded_strides", 11, 0, 0, {0, 2, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PADDED, 1.0, 0.0}},
    {"f32_bwd_filter_stride_dilation", 12, 0, 0, {0, 2, CUDNN_CROSS_CORRELATION, 2, 3, 2, 3, SP2(11, 9), SP2(3, 2), SP2(2, 0), SP2(1, 1), SP2(2, 3), SP2(2, 1), CHANNELS_LAST, 1.0, 0.0}},
    {"f32_bwd_filter_alpha_beta", 13, 0, 0, {0, 2, CUDNN_CONVOLUTION, 2, 2, 2, 3, SP2(6, 7), SP2(2, 3), SP2(1, 1), SP2(0, 1), SP2(2, 1), SP2(1, 2), PACKED, -0.5, 2.0}},
    {"f64_fwd_stride_dilation", 14, 0, 0, {1, 0, CUDNN_CROSS_CORRELATION, 2, 3, 2, 3, SP2(11, 9), SP2(3, 2), SP2(2, 0), SP2(1, 1), SP2(2, 3), SP2(2, 1), CHANNELS_LAST, 1.0, 0.0}},
    {"f64_fwd_3d_convolution_mode", 15, 0, 0, {1, 0, CUDNN_CONVOLUTION, 3, 2, 2, 2, SP3(4, 5, 4), SP3(2, 2, 3), SP3(1, 0, 1), SP3(0, 1, 1), SP3(1, 1, 2), SP3(1, 2, 1), PADDED, 0.75, 0.5}},
    {"f64_bwd_data", 16, 0, 0, {1, 1, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(2, 1), SP2(1, 1), PACKED, 1.0, 0.0}},
    {"f64_bwd_filter", 17, 0, 0, {1, 2, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(7, 6), SP2(3, 3), SP2(1, 1), SP2(1, 1), SP2(1, 2), SP2(2, 1), PADDED, 1.0, 0.5}},
};

static void run_conv_case(cudnnHandle_t handle, cudaStream_t stream, const struct conv_case *cc)
{
    const struct conv_problem *p = &cc->p;
    size_t es = p->dtype ? 8 : 4;
    struct tensor t[3];     /* x, w, y */
    problem_tensors(p, &t[0], &t[1], &t[2]);
    /* The output by role: y (forward), x (backward data), w (backward filter). */
    int out = p->kind == 0 ? 2 : p->kind == 1 ? 0 : 1;
    void *h[3], *d[3], *before;
    seed(cc->seed);
    for (int r = 0; r < 3; r++) {
        h[r] = host_buffer(&t[r], es, 777.0);   /* gaps and guard: 777 */
        if (r != out)
            randomize(h[r], es, &t[r], 1.0);
        else if (p->beta != 0.0)
            randomize(h[r], es, &t[r], 1.0);
        else
            for (int64_t i = 0; i < numel(&t[r]); i++)   /* beta == 0 never reads the output */
                put(h[r], es, offset_of(&t[r], i), NAN);
    }
    before = malloc((size_t)buffer_elems(&t[out]) * es);
    memcpy(before, h[out], (size_t)buffer_elems(&t[out]) * es);
    for (int r = 0; r < 3; r++)
        d[r] = to_device(h[r], (size_t)buffer_elems(&t[r]) * es);

    CHECK_DNN(cudnnSetStream(handle, cc->default_stream ? NULL : stream));
    struct chain_info ci;
    for (int rep = 0; rep < (cc->twice ? 2 : 1); rep++) {
        if (rep)
            CHECK_CUDA(cudaMemcpy(d[out], before, (size_t)buffer_elems(&t[out]) * es, cudaMemcpyHostToDevice));
        run_conv(handle, p, d[0], d[1], d[2], &ci, p->kind == 2 ? 0xa5 : 0);
    }
    void *res = malloc((size_t)buffer_elems(&t[out]) * es);
    CHECK_CUDA(cudaMemcpy(res, d[out], (size_t)buffer_elems(&t[out]) * es, cudaMemcpyDeviceToHost));

    struct geom g;
    make_geom(p, &g);
    long double *ld = ld_conv(&g, es, h[0], h[1], h[2], p->alpha, p->beta);
    for (int64_t i = 0; i < numel(&t[out]); i++) {
        long double old = p->beta != 0.0 ? (long double)get(before, es, offset_of(&t[out], i)) : 0.0L;
        long double alpha = p->dtype ? (long double)p->alpha : (long double)(float)p->alpha;
        long double beta = p->dtype ? (long double)p->beta : (long double)(float)p->beta;
        ld[i] = alpha * ld[i] + (p->beta != 0.0 ? beta * old : 0.0L);
    }
    host_conv(&g, p->dtype, h[0], h[1], h[2], p->alpha, p->beta);  /* h[out] becomes the exact reference */

    struct verdict v = {FNV_START, 0.0, 0, 0};
    judge(&v, res, h[out], ld, before, &t[out], es);
    print_case(cc->name, &v);
    if (!strcmp(cc->name, "f32_fwd") || !strcmp(cc->name, "f32_bwd_filter")) {
        const char *k = p->kind == 0 ? "fwd" : "bwd_filter";
        printf("INFO %s_chain %lld %lld %lld %lld %lld %lld %lld\n", k, (long long)ci.global_count,
               (long long)ci.heur_count, (long long)ci.engine_index, (long long)ci.numerical_notes,
               (long long)ci.behavior_notes, (long long)ci.knobs, (long long)ci.layouts);
        printf("INFO %s_workspace %lld %lld\n", k, (long long)ci.workspace, (long long)ci.cfg_workspace);
    }
    for (int r = 0; r < 3; r++) {
        CHECK_CUDA(cudaFree(d[r]));
        free(h[r]);
    }
    free(ld);
    free(res);
    free(before);
}

/* ---- batch normalization ------------------------------------------------------------------ */

enum bn_fn { BN_TRAIN, BN_TRAIN_EX, BN_INFER, BN_BACKWARD, BN_BACKWARD_EX };

struct bn_case {
    const char *name;
    uint64_t seed;
    enum bn_fn fn;
    int dtype;
    cudnnBatchNormMode_t mode;
    int nd;
    int64_t dims[5];
    enum layout layout;
    double alpha, beta, alpha_p, beta_p;
    double eps, factor;
    int no_running, no_save;    /* training: NULL running statistics / saved statistics */
    int saved;                  /* backward: pass the saved mean and inverse variance */
};

#define BN_DEFAULTS 1.0, 0.0, 1.0, 0.0, 1e-5, 0.1

static const struct bn_case bn_cases[] = {
    /* name, seed, fn, dtype, mode, nd, dims, layout, alpha, beta, alpha_p, beta_p, eps, factor, no_running, no_save, saved */
    {"bn_f32_train_spatial", 21, BN_TRAIN, 0, CUDNN_BATCHNORM_SPATIAL, 4, {4, 3, 5, 6}, PACKED, BN_DEFAULTS, 0, 0, 0},
    {"bn_f32_train_spatial_persistent", 21, BN_TRAIN, 0, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, 4, {4, 3, 5, 6}, PACKED, BN_DEFAULTS, 0, 0, 0},
    {"bn_f32_train_ex", 21, BN_TRAIN_EX, 0, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, 4, {4, 3, 5, 6}, PACKED, BN_DEFAULTS, 0, 0, 0},
    {"bn_f32_train_channels_last", 21, BN_TRAIN_EX, 0, CUDNN_BATCHNORM_SPATIAL, 4, {4, 3, 5, 6}, CHANNELS_LAST, BN_DEFAULTS, 0, 0, 0},
    {"bn_f32_train_alpha_beta_padded", 22, BN_TRAIN, 0, CUDNN_BATCHNORM_SPATIAL, 4, {3, 4, 3, 5}, PADDED, 0.75, 0.5, 1.0, 0.0, 1e-3, 0.25, 0, 0, 0},
    {"bn_f32_train_per_activation", 23, BN_TRAIN_EX, 0, CUDNN_BATCHNORM_PER_ACTIVATION, 4, {6, 5, 1, 1}, PACKED, BN_DEFAULTS, 0, 0, 0},
    {"bn_f32_train_no_running_no_save", 24, BN_TRAIN, 0, CUDNN_BATCHNORM_SPATIAL, 4, {2, 3, 4, 4}, PACKED, BN_DEFAULTS, 1, 1, 0},
    {"bn_f64_train_5d", 25, BN_TRAIN_EX, 1, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, 5, {2, 3, 3, 4, 2}, CHANNELS_LAST, BN_DEFAULTS, 0, 0, 0},
    {"bn_f64_train_per_activation", 26, BN_TRAIN, 1, CUDNN_BATCHNORM_PER_ACTIVATION, 4, {5, 2, 3, 2}, PADDED, 1.0, 0.0, 1.0, 0.0, 1e-5, 1.0, 0, 0, 0},
    {"bn_f32_infer_spatial", 27, BN_INFER, 0, CUDNN_BATCHNORM_SPATIAL, 4, {4, 3, 5, 6}, PACKED, BN_DEFAULTS, 0, 0, 0},
    {"bn_f64_infer_per_activation_alpha_beta", 28, BN_INFER, 1, CUDNN_BATCHNORM_PER_ACTIVATION, 5, {3, 2, 2, 3, 2}, PADDED, 2.0, -0.5, 1.0, 0.0, 1e-4, 0.0, 0, 0, 0},
    {"bn_f32_backward_saved", 29, BN_BACKWARD, 0, CUDNN_BATCHNORM_SPATIAL, 4, {4, 3, 5, 6}, PACKED, BN_DEFAULTS, 0, 0, 1},
    {"bn_f32_backward_ex_saved", 29, BN_BACKWARD_EX, 0, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, 4, {4, 3, 5, 6}, PACKED, BN_DEFAULTS, 0, 0, 1},
    {"bn_f32_backward_recomputed", 29, BN_BACKWARD, 0, CUDNN_BATCHNORM_SPATIAL, 4, {4, 3, 5, 6}, PACKED, BN_DEFAULTS, 0, 0, 0},
    {"bn_f32_backward_alpha_beta_channels_last", 30, BN_BACKWARD_EX, 0, CUDNN_BATCHNORM_SPATIAL, 4, {3, 4, 3, 3}, CHANNELS_LAST, 0.5, 2.0, 1.5, -1.0, 1e-5, 0.0, 0, 0, 1},
    {"bn_f64_backward_saved", 31, BN_BACKWARD, 1, CUDNN_BATCHNORM_SPATIAL, 5, {2, 3, 3, 2, 4}, PACKED, BN_DEFAULTS, 0, 0, 1},
    {"bn_f64_backward_recomputed", 31, BN_BACKWARD, 1, CUDNN_BATCHNORM_SPATIAL, 5, {2, 3, 3, 2, 4}, PACKED, BN_DEFAULTS, 0, 0, 0},
    {"bn_f64_backward_per_activation", 32, BN_BACKWARD_EX, 1, CUDNN_BATCHNORM_PER_ACTIVATION, 4, {7, 2, 2, 2}, PADDED, BN_DEFAULTS, 0, 0, 1},
};

/* The parameter tensor of x for `mode`: 1 x C x (1 or x's spatial dims), packed. */
static void param_shape(const struct tensor *x, cudnnBatchNormMode_t mode, struct tensor *p)
{
    p->nd = x->nd;
    p->dims[0] = 1;
    p->dims[1] = x->dims[1];
    for (int i = 2; i < x->nd; i++)
        p->dims[i] = mode == CUDNN_BATCHNORM_PER_ACTIVATION ? x->dims[i] : 1;
    set_layout(p, PACKED);
}

static cudnnTensorDescriptor_t legacy_desc(int dtype, const struct tensor *t)
{
    cudnnTensorDescriptor_t d;
    int dims[5], strides[5];
    for (int i = 0; i < t->nd; i++) {
        dims[i] = (int)t->dims[i];
        strides[i] = (int)t->strides[i];
    }
    CHECK_DNN(cudnnCreateTensorDescriptor(&d));
    CHECK_DNN(cudnnSetTensorNdDescriptor(d, dtype ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT, t->nd, dims, strides));
    return d;
}

/* A feature's members: (n, spatial) pairs in order n, then spatial row-major;
 * per activation, the spatial position is the feature's own.  Fills `xo`
 * with the members' logical indices into an x-shaped tensor; returns M. */
static int64_t members(const struct tensor *x, int per_act, int64_t c, int64_t sp, int64_t *idx)
{
    int64_t S = 1, m = 0;
    for (int i = 2; i < x->nd; i++)
        S *= x->dims[i];
    for (int64_t n = 0; n < x->dims[0]; n++)
        for (int64_t s = 0; s < S; s++)
            if (!per_act || s == sp)
                idx[m++] = (n * x->dims[1] + c) * S + s;
    return m;
}

/* The host's repetition of the documented batch normalization (double math,
 * each result rounded to T when stored), over host buffers laid out like the
 * device's.  v[]: x, y (dy for backward), dx, scale, bias, run_mean,
 * run_var, save_mean, save_inv, dscale, dbias (NULL where unused). */
enum { V_X, V_Y, V_DX, V_SCALE, V_BIAS, V_RMEAN, V_RVAR, V_SMEAN, V_SINV, V_DSCALE, V_DBIAS, V_COUNT };

static void host_bn(const struct bn_case *bc, const struct tensor *x, const struct tensor *y, const struct tensor *dx,
                    const struct tensor *p, void **v)
{
    size_t es = bc->dtype ? 8 : 4;
    int pa = bc->mode == CUDNN_BATCHNORM_PER_ACTIVATION;
    int64_t S = numel(p) / p->dims[1];      /* per-feature positions: S (per activation) or 1 */
    int64_t *idx = malloc((size_t)numel(x) * sizeof *idx);
    double alpha = bc->dtype ? bc->alpha : (double)(float)bc->alpha, beta = bc->dtype ? bc->beta : (double)(float)bc->beta;
    double alpha_p = bc->dtype ? bc->alpha_p : (double)(float)bc->alpha_p;
    double beta_p = bc->dtype ? bc->beta_p : (double)(float)bc->beta_p;
    int backward = bc->fn == BN_BACKWARD || bc->fn == BN_BACKWARD_EX;
    for (int64_t c = 0; c < x->dims[1]; c++)
        for (int64_t sp = 0; sp < S; sp++) {
            int64_t M = members(x, pa, c, sp, idx);
            int64_t po = offset_of(p, c * S + sp);
            double Md = (double)M, mean, invstd, sq = 0.0;
            double sc = get(v[V_SCALE], es, po);
            if (bc->fn == BN_INFER) {
                mean = get(v[V_RMEAN], es, po);
                invstd = 1.0 / sqrt(get(v[V_RVAR], es, po) + bc->eps);
            } else if (backward && bc->saved) {
                mean = get(v[V_SMEAN], es, po);
                invstd = get(v[V_SINV], es, po);
            } else {
                double sum = 0.0;
                for (int64_t m = 0; m < M; m++)
                    sum += get(v[V_X], es, offset_of(x, idx[m]));
                mean = sum / Md;
                for (int64_t m = 0; m < M; m++) {
                    double d = get(v[V_X], es, offset_of(x, idx[m])) - mean;
                    sq += d * d;
                }
                invstd = 1.0 / sqrt(sq / Md + bc->eps);
            }
            if (!backward) {
                double bi = get(v[V_BIAS], es, po);
                for (int64_t m = 0; m < M; m++) {
                    int64_t yo = offset_of(y, idx[m]);
                    double t = sc * ((get(v[V_X], es, offset_of(x, idx[m])) - mean) * invstd) + bi;
                    double out = alpha * t;
                    if (beta != 0.0)
                        out = out + beta * get(v[V_Y], es, yo);
                    put(v[V_Y], es, yo, out);
                }
                if (bc->fn != BN_INFER && v[V_RMEAN]) {
                    double uvar = Md > 1.0 ? sq / (Md - 1.0) : sq / Md;
                    put(v[V_RMEAN], es, po, (1.0 - bc->factor) * get(v[V_RMEAN], es, po) + bc->factor * mean);
                    put(v[V_RVAR], es, po, (1.0 - bc->factor) * get(v[V_RVAR], es, po) + bc->factor * uvar);
                }
                if (bc->fn != BN_INFER && v[V_SMEAN]) {
                    put(v[V_SMEAN], es, po, mean);
                    put(v[V_SINV], es, po, invstd);
                }
                continue;
            }
            double sdy = 0.0, sdyx = 0.0;
            for (int64_t m = 0; m < M; m++) {
                double xh = (get(v[V_X], es, offset_of(x, idx[m])) - mean) * invstd;
                double dyv = get(v[V_Y], es, offset_of(y, idx[m]));
                sdy += dyv;
                sdyx += dyv * xh;
            }
            double mdy = sdy / Md, mdyx = sdyx / Md, k = sc * invstd;
            for (int64_t m = 0; m < M; m++) {
                int64_t o = offset_of(dx, idx[m]);
                double xh = (get(v[V_X], es, offset_of(x, idx[m])) - mean) * invstd;
                double d = k * ((get(v[V_Y], es, offset_of(y, idx[m])) - mdy) - xh * mdyx);
                double out = alpha * d;
                if (beta != 0.0)
                    out = out + beta * get(v[V_DX], es, o);
                put(v[V_DX], es, o, out);
            }
            double vs = alpha_p * sdyx, vb = alpha_p * sdy;
            if (beta_p != 0.0) {
                vs = vs + beta_p * get(v[V_DSCALE], es, po);
                vb = vb + beta_p * get(v[V_DBIAS], es, po);
            }
            put(v[V_DSCALE], es, po, vs);
            put(v[V_DBIAS], es, po, vb);
        }
    free(idx);
}

/* The long double reference, from the textbook formulas (statistics from x,
 * or the saved/estimated ones as given, in long double).  Fills r[] (one
 * logical-order array per output of v[]). */
static void ld_bn(const struct bn_case *bc, const struct tensor *x, const struct tensor *y, const struct tensor *dx,
                  const struct tensor *p, void *const *v, long double **r)
{
    size_t es = bc->dtype ? 8 : 4;
    int pa = bc->mode == CUDNN_BATCHNORM_PER_ACTIVATION;
    int64_t S = numel(p) / p->dims[1];
    int64_t *idx = malloc((size_t)numel(x) * sizeof *idx);
    long double alpha = bc->dtype ? bc->alpha : (float)bc->alpha, beta = bc->dtype ? bc->beta : (float)bc->beta;
    long double alpha_p = bc->dtype ? bc->alpha_p : (float)bc->alpha_p;
    long double beta_p = bc->dtype ? bc->beta_p : (float)bc->beta_p;
    int backward = bc->fn == BN_BACKWARD || bc->fn == BN_BACKWARD_EX;
    for (int64_t c = 0; c < x->dims[1]; c++)
        for (int64_t sp = 0; sp < S; sp++) {
            int64_t M = members(x, pa, c, sp, idx), f = c * S + sp;
            int64_t po = offset_of(p, f);
            long double sum = 0, sq = 0, mean, var, invstd;
            for (int64_t m = 0; m < M; m++)
                sum += get(v[V_X], es, offset_of(x, idx[m]));
            mean = sum / M;
            for (int64_t m = 0; m < M; m++) {
                long double d = get(v[V_X], es, offset_of(x, idx[m])) - mean;
                sq += d * d;
            }
            var = sq / M;
            invstd = 1.0L / sqrtl(var + bc->eps);
            if (bc->fn == BN_INFER) {
                mean = get(v[V_RMEAN], es, po);
                invstd = 1.0L / sqrtl((long double)get(v[V_RVAR], es, po) + bc->eps);
            } else if (backward && bc->saved) {
                mean = get(v[V_SMEAN], es, po);
                invstd = get(v[V_SINV], es, po);
            }
            long double sc = get(v[V_SCALE], es, po);
            if (!backward) {
                for (int64_t m = 0; m < M; m++) {
                    long double t = sc * (get(v[V_X], es, offset_of(x, idx[m])) - mean) * invstd +
                                    get(v[V_BIAS], es, po);
                    r[V_Y][idx[m]] = alpha * t + (beta != 0 ? beta * get(v[V_Y], es, offset_of(y, idx[m])) : 0);
                }
                if (bc->fn != BN_INFER && v[V_RMEAN]) {
                    r[V_RMEAN][f] = (1 - (long double)bc->factor) * get(v[V_RMEAN], es, po) + bc->factor * mean;
                    r[V_RVAR][f] = (1 - (long double)bc->factor) * get(v[V_RVAR], es, po) +
                                   bc->factor * (M > 1 ? sq / (M - 1) : var);
                }
                if (bc->fn != BN_INFER && v[V_SMEAN]) {
                    r[V_SMEAN][f] = mean;
                    r[V_SINV][f] = invstd;
                }
                continue;
            }
            long double sdy = 0, sdyx = 0;
            for (int64_t m = 0; m < M; m++) {
                long double xh = (get(v[V_X], es, offset_of(x, idx[m])) - mean) * invstd;
                long double dyv = get(v[V_Y], es, offset_of(y, idx[m]));
                sdy += dyv;
                sdyx += dyv * xh;
            }
            for (int64_t m = 0; m < M; m++) {
                long double xh = (get(v[V_X], es, offset_of(x, idx[m])) - mean) * invstd;
                long double d = sc * invstd / M * (M * (long double)get(v[V_Y], es, offset_of(y, idx[m])) - sdy - xh * sdyx);
                r[V_DX][idx[m]] = alpha * d + (beta != 0 ? beta * get(v[V_DX], es, offset_of(dx, idx[m])) : 0);
            }
            r[V_DSCALE][f] = alpha_p * sdyx + (beta_p != 0 ? beta_p * get(v[V_DSCALE], es, po) : 0);
            r[V_DBIAS][f] = alpha_p * sdy + (beta_p != 0 ? beta_p * get(v[V_DBIAS], es, po) : 0);
        }
    free(idx);
}

static void run_bn_case(cudnnHandle_t handle, cudaStream_t stream, const struct bn_case *bc)
{
    size_t es = bc->dtype ? 8 : 4;
    int backward = bc->fn == BN_BACKWARD || bc->fn == BN_BACKWARD_EX;
    int train = bc->fn == BN_TRAIN || bc->fn == BN_TRAIN_EX;
    struct tensor x = {bc->nd, {0}, {0}}, p;
    memcpy(x.dims, bc->dims, sizeof x.dims);
    set_layout(&x, bc->layout);
    struct tensor y = x, dx = x;
    param_shape(&x, bc->mode, &p);
    const struct tensor *shape[V_COUNT] = {&x, &y, &dx, &p, &p, &p, &p, &p, &p, &p, &p};

    /* Which buffers this function uses, and which it writes. */
    int used[V_COUNT] = {0}, written[V_COUNT] = {0};
    used[V_X] = used[V_Y] = used[V_SCALE] = 1;
    if (!backward)
        used[V_BIAS] = written[V_Y] = 1;
    if (bc->fn == BN_INFER)
        used[V_RMEAN] = used[V_RVAR] = 1;
    if (train) {
        used[V_RMEAN] = used[V_RVAR] = written[V_RMEAN] = written[V_RVAR] = !bc->no_running;
        used[V_SMEAN] = used[V_SINV] = written[V_SMEAN] = written[V_SINV] = !bc->no_save;
    }
    if (backward) {
        used[V_DX] = used[V_DSCALE] = used[V_DBIAS] = written[V_DX] = written[V_DSCALE] = written[V_DBIAS] = 1;
        used[V_SMEAN] = used[V_SINV] = bc->saved;
    }
    void *h[V_COUNT] = {0}, *d[V_COUNT] = {0}, *before[V_COUNT] = {0};
    seed(bc->seed);
    for (int i = 0; i < V_COUNT; i++) {
        if (!used[i])
            continue;
        h[i] = host_buffer(shape[i], es, 777.0);
        double out_beta = i == V_DSCALE || i == V_DBIAS ? bc->beta_p : bc->beta;
        int blended = written[i] && (i == V_Y || i == V_DX || i == V_DSCALE || i == V_DBIAS);
        if ((blended && out_beta == 0.0) || (written[i] && (i == V_SMEAN || i == V_SINV)))
            for (int64_t k = 0; k < numel(shape[i]); k++)     /* never read: NaN */
                put(h[i], es, offset_of(shape[i], k), NAN);
        else if (i == V_RVAR)
            for (int64_t k = 0; k < numel(shape[i]); k++)
                put(h[i], es, offset_of(shape[i], k), 1.5 + next_value() * 0.5);
        else if (i != V_SMEAN && i != V_SINV)
            randomize(h[i], es, shape[i], 1.0);
    }
    if (backward && bc->saved) {
        /* The saved statistics of a forward pass over x, as the emulator's training would save them. */
        struct bn_case fwd = *bc;
        fwd.fn = BN_TRAIN;
        fwd.alpha = 1.0;
        fwd.beta = 0.0;
        void *v[V_COUNT] = {0};
        v[V_X] = h[V_X];
        v[V_Y] = host_buffer(&y, es, 0.0);
        v[V_SCALE] = h[V_SCALE];
        v[V_BIAS] = host_buffer(&p, es, 0.0);
        v[V_SMEAN] = h[V_SMEAN];
        v[V_SINV] = h[V_SINV];
        host_bn(&fwd, &x, &y, &dx, &p, v);
        free(v[V_Y]);
        free(v[V_BIAS]);
    }
    for (int i = 0; i < V_COUNT; i++)
        if (used[i]) {
            size_t bytes = (size_t)buffer_elems(shape[i]) * es;
            before[i] = malloc(bytes);
            memcpy(before[i], h[i], bytes);
            d[i] = to_device(h[i], bytes);
        }

    cudnnTensorDescriptor_t xd = legacy_desc(bc->dtype, &x), pd = legacy_desc(bc->dtype, &p);
    float fa = (float)bc->alpha, fb = (float)bc->beta, fap = (float)bc->alpha_p, fbp = (float)bc->beta_p;
    const void *alpha = bc->dtype ? (const void *)&bc->alpha : &fa, *beta = bc->dtype ? (const void *)&bc->beta : &fb;
    const void *alpha_p = bc->dtype ? (const void *)&bc->alpha_p : &fap;
    const void *beta_p = bc->dtype ? (const void *)&bc->beta_p : &fbp;
    CHECK_DNN(cudnnSetStream(handle, stream));
    size_t ws_size = 0, reserve_size = 0;
    void *ws = NULL, *reserve = NULL;
    switch (bc->fn) {
    case BN_TRAIN:
        CHECK_DNN(cudnnBatchNormalizationForwardTraining(handle, bc->mode, alpha, beta, xd, d[V_X], xd, d[V_Y], pd,
                                                         d[V_SCALE], d[V_BIAS], bc->factor, d[V_RMEAN], d[V_RVAR],
                                                         bc->eps, d[V_SMEAN], d[V_SINV]));
        break;
    case BN_TRAIN_EX:
        /* PyTorch's sequence: workspace and reserve sizes, then the Ex call. */
        CHECK_DNN(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, bc->mode, CUDNN_BATCHNORM_OPS_BN,
                                                                           xd, xd, xd, pd, NULL, &ws_size));
        CHECK_DNN(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, bc->mode, CUDNN_BATCHNORM_OPS_BN, NULL,
                                                                       xd, &reserve_size));
        if (ws_size)
            CHECK_CUDA(cudaMalloc(&ws, ws_size));
        if (reserve_size)
            CHECK_CUDA(cudaMalloc(&reserve, reserve_size));
        CHECK_DNN(cudnnBatchNormalizationForwardTrainingEx(
            handle, bc->mode, CUDNN_BATCHNORM_OPS_BN, alpha, beta, xd, d[V_X], NULL, NULL, xd, d[V_Y], pd, d[V_SCALE],
            d[V_BIAS], bc->factor, d[V_RMEAN], d[V_RVAR], bc->eps, d[V_SMEAN], d[V_SINV], NULL, ws, ws_size, reserve,
            reserve_size));
        printf("INFO bn_train_ex_sizes %zu %zu\n", ws_size, reserve_size);
        break;
    case BN_INFER:
        CHECK_DNN(cudnnBatchNormalizationForwardInference(handle, bc->mode, alpha, beta, xd, d[V_X], xd, d[V_Y], pd,
                                                          d[V_SCALE], d[V_BIAS], d[V_RMEAN], d[V_RVAR], bc->eps));
        break;
    case BN_BACKWARD:
        CHECK_DNN(cudnnBatchNormalizationBackward(handle, bc->mode, alpha, beta, alpha_p, beta_p, xd, d[V_X], xd,
                                                  d[V_Y], xd, d[V_DX], pd, d[V_SCALE], d[V_DSCALE], d[V_DBIAS],
                                                  bc->eps, d[V_SMEAN], d[V_SINV]));
        break;
    case BN_BACKWARD_EX:
        CHECK_DNN(cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, bc->mode, CUDNN_BATCHNORM_OPS_BN, xd, xd,
                                                                    xd, NULL, xd, pd, NULL, &ws_size));
        if (ws_size)
            CHECK_CUDA(cudaMalloc(&ws, ws_size));
        CHECK_DNN(cudnnBatchNormalizationBackwardEx(handle, bc->mode, CUDNN_BATCHNORM_OPS_BN, alpha, beta, alpha_p,
                                                    beta_p, xd, d[V_X], NULL, NULL, xd, d[V_Y], NULL, NULL, xd,
                                                    d[V_DX], pd, d[V_SCALE], NULL, d[V_DSCALE], d[V_DBIAS], bc->eps,
                                                    d[V_SMEAN], d[V_SINV], NULL, ws, ws_size, NULL, 0));
        printf("INFO bn_backward_ex_workspace %zu\n", ws_size);
        break;
    }
    CHECK_DNN(cudnnDestroyTensorDescriptor(xd));
    CHECK_DNN(cudnnDestroyTensorDescriptor(pd));

    /* References: long double from the inputs as they were, then the exact one in place. */
    long double *ld[V_COUNT] = {0};
    for (int i = 0; i < V_COUNT; i++)
        if (written[i])
            ld[i] = calloc((size_t)numel(shape[i]), sizeof(long double));
    ld_bn(bc, &x, &y, &dx, &p, h, ld);
    host_bn(bc, &x, &y, &dx, &p, h);

    struct verdict v = {FNV_START, 0.0, 0, 0};
    for (int i = 0; i < V_COUNT; i++)
        if (written[i]) {
            size_t bytes = (size_t)buffer_elems(shape[i]) * es;
            void *res = malloc(bytes);
            CHECK_CUDA(cudaMemcpy(res, d[i], bytes, cudaMemcpyDeviceToHost));
            judge(&v, res, h[i], ld[i], before[i], shape[i], es);
            free(res);
        }
    print_case(bc->name, &v);
    for (int i = 0; i < V_COUNT; i++) {
        if (used[i])
            CHECK_CUDA(cudaFree(d[i]));
        free(h[i]);
        free(before[i]);
        free(ld[i]);
    }
    if (ws)
        CHECK_CUDA(cudaFree(ws));
    if (reserve)
        CHECK_CUDA(cudaFree(reserve));
}

/* ---- argument errors ------------------------------------------------------------------------- */

/* A valid f32 forward problem for the error checks. */
static const struct conv_problem err_problem = {0, 0, CUDNN_CROSS_CORRELATION, 2, 2, 3, 4, SP2(6, 6), SP2(3, 3),
                                                SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 1.0, 0.0};

static void backend_errors(cudnnHandle_t handle)
{
    struct tensor tx, tw, ty;
    problem_tensors(&err_problem, &tx, &tw, &ty);
    cudnnBackendDescriptor_t d, x, w, y, conv, op;
    int64_t one = 1, two[2] = {1, 2}, n;

    status("create_null_out", cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, NULL));
    d = NULL;
    status("create_pointwise", cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &d));
    printf("INFO create_pointwise_out %s\n", d ? "set" : "NULL");
    status("create_matmul_op", cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &d));
    status("initialize", cudnnBackendInitialize(NULL));

    d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int32_t i32 = 1;
    status("set_wrong_attribute_type", cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT32, 1, &i32));
    status("set_wrong_count", cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 2, two));
    status("set_negative_count", cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, -1, two));
    status("set_null_array", cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, NULL));
    status("set_too_many_dims", cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 9, two));
    status("set_foreign_attribute", cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &one));
    status("set_null_descriptor", cudnnBackendSetAttribute(NULL, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &one));
    status("get_before_finalize", cudnnBackendGetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &one));
    cudnnDataType_t ft = CUDNN_DATA_FLOAT;
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ft));
    set_i64(d, CUDNN_ATTR_TENSOR_DIMENSIONS, tx.nd, tx.dims);
    set_i64(d, CUDNN_ATTR_TENSOR_STRIDES, tx.nd, tx.strides);
    set_i64(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 1, &one);
    status("finalize_tensor_without_alignment", cudnnBackendFinalize(d));
    int64_t align = 2;
    set_i64(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 1, &align);
    status("finalize_tensor_alignment_2_for_float", cudnnBackendFinalize(d));
    align = 16;
    set_i64(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 1, &align);
    status("finalize_tensor", cudnnBackendFinalize(d));
    status("finalize_twice", cudnnBackendFinalize(d));
    status("set_after_finalize", cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &one));
    int64_t dims[8] = {0};
    status("get_dims", cudnnBackendGetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 8, &n, dims));
    printf("INFO tensor_dims %lld %lld %lld %lld %lld\n", (long long)n, (long long)dims[0], (long long)dims[1],
           (long long)dims[2], (long long)dims[3]);
    status("get_dims_count_only", cudnnBackendGetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 0, &n, NULL));
    printf("INFO tensor_dims_count %lld\n", (long long)n);
    n = -1;
    dims[1] = -7;
    status("get_dims_requested_1", cudnnBackendGetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 1, &n, dims));
    printf("INFO tensor_dims_requested_1 %lld %lld\n", (long long)n, (long long)dims[1]);
    bool virt = true;
    status("get_is_virtual", cudnnBackendGetAttribute(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, NULL, &virt));
    printf("INFO tensor_is_virtual %d\n", (int)virt);
    status("get_wrong_attribute_type", cudnnBackendGetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT32, 1, &n, &i32));
    status("get_null_outputs", cudnnBackendGetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, NULL, NULL));
    status("get_foreign_attribute", cudnnBackendGetAttribute(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &n, &one));
    status("destroy", cudnnBackendDestroyDescriptor(d));
    status("destroy_twice", cudnnBackendDestroyDescriptor(d));
    status("destroy_null", cudnnBackendDestroyDescriptor(NULL));

    struct tensor zero = tx;
    zero.dims[2] = 0;
    d = tensor_desc(9, CUDNN_DATA_FLOAT, &zero, 4, 0);
    status("finalize_tensor_zero_dim", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));

    /* The convolution descriptor. */
    d = create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    cudnnConvolutionMode_t bad_mode = 7;
    status("conv_set_bad_mode", cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &bad_mode));
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    int64_t sp = 2;
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    set_i64(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 1, &sp);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, 2, err_problem.pre);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, 2, err_problem.post);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, 2, err_problem.stride);
    status("conv_finalize_without_dilations", cudnnBackendFinalize(d));
    set_i64(d, CUDNN_ATTR_CONVOLUTION_DILATIONS, 1, err_problem.dil);
    status("conv_finalize_dilations_count_1", cudnnBackendFinalize(d));
    int64_t zero_stride[2] = {1, 0};
    set_i64(d, CUDNN_ATTR_CONVOLUTION_DILATIONS, 2, err_problem.dil);
    set_i64(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, 2, zero_stride);
    status("conv_finalize_zero_stride", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));

    /* The operation. */
    x = tensor_desc(UID_X, CUDNN_DATA_FLOAT, &tx, 16, 1);
    w = tensor_desc(UID_W, CUDNN_DATA_FLOAT, &tw, 16, 1);
    y = tensor_desc(UID_Y, CUDNN_DATA_FLOAT, &ty, 16, 1);
    conv = conv_desc(&err_problem, 1);
    op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    status("op_set_x_to_conv_desc", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
    status("op_set_alpha_int64", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_INT64, 1, &one));
    status("op_set_bwd_attribute", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w));
    float fone = 1.0f;
    CHECK_DNN(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &fone));
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
    set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
    status("op_finalize_without_beta", cudnnBackendFinalize(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(op));
    /* Y of the wrong size. */
    struct tensor bad_y = ty;
    bad_y.dims[3] += 1;
    set_layout(&bad_y, PACKED);
    cudnnBackendDescriptor_t yb = tensor_desc(UID_Y, CUDNN_DATA_FLOAT, &bad_y, 16, 1);
    op = op_desc(0, 0, 1.0, 0.0, conv, x, w, yb, 0);
    status("op_finalize_wrong_output_size", cudnnBackendFinalize(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(yb));
    /* An unfinalized tensor. */
    cudnnBackendDescriptor_t yu = tensor_desc(UID_Y, CUDNN_DATA_FLOAT, &ty, 16, 0);
    op = op_desc(0, 0, 1.0, 0.0, conv, x, w, yu, 0);
    status("op_finalize_unfinalized_tensor", cudnnBackendFinalize(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(yu));
    /* A tensor destroyed between set and finalize. */
    cudnnBackendDescriptor_t yd = tensor_desc(UID_Y, CUDNN_DATA_FLOAT, &ty, 16, 1);
    op = op_desc(0, 0, 1.0, 0.0, conv, x, w, yd, 0);
    CHECK_DNN(cudnnBackendDestroyDescriptor(yd));
    status("op_finalize_destroyed_tensor", cudnnBackendFinalize(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(op));
    /* Two tensors with one unique id. */
    cudnnBackendDescriptor_t ysame = tensor_desc(UID_X, CUDNN_DATA_FLOAT, &ty, 16, 1);
    op = op_desc(0, 0, 1.0, 0.0, conv, x, w, ysame, 0);
    status("op_finalize_duplicate_uid", cudnnBackendFinalize(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(ysame));

    /* The graph and what follows. */
    op = op_desc(0, 0, 1.0, 0.0, conv, x, w, y, 1);
    double alpha_back = 0;
    status("op_get_alpha_double", cudnnBackendGetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_DOUBLE, 1, &n, &alpha_back));
    printf("INFO op_alpha %g\n", alpha_back);
    cudnnBackendDescriptor_t xcopy = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    status("op_get_x", cudnnBackendGetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &xcopy));
    int64_t uid = 0;
    CHECK_DNN(cudnnBackendGetAttribute(xcopy, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &uid));
    printf("INFO op_x_uid %lld\n", (long long)uid);
    CHECK_DNN(cudnnBackendDestroyDescriptor(xcopy));

    cudnnBackendDescriptor_t two_ops[2] = {op, op};
    d = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 2, two_ops));
    status("graph_finalize_two_ops", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    d = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    status("graph_set_ops_tensor", cudnnBackendSetAttribute(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    cudnnHandle_t bogus = (cudnnHandle_t)&one;
    status("graph_set_bad_handle", cudnnBackendSetAttribute(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &bogus));
    status("graph_finalize_without_ops", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));

    cudnnBackendDescriptor_t graph = graph_desc(handle, 1, &op);
    status("graph_get_global_count_int32", cudnnBackendGetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT32, 1, &n, &i32));
    /* Engines: index 1 does not exist (cudnn_frontend's fallback list probes it). */
    d = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    set_desc(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
    set_i64(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 1, &one);
    status("engine_finalize_index_1", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    d = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    set_desc(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
    int64_t zero_index = 0;
    set_i64(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 1, &zero_index);
    status("engine_finalize_index_0", cudnnBackendFinalize(d));
    /* A config built by hand from it (the fallback path), and a knob the engine does not have. */
    cudnnBackendDescriptor_t cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    set_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, d);
    status("cfg_set_zero_knobs", cudnnBackendSetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, NULL));
    status("cfg_finalize", cudnnBackendFinalize(cfg));
    status("cfg_get_intermediate_info", cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &d));
    cudnnBackendDescriptor_t knob = create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    cudnnBackendKnobType_t kt = CUDNN_KNOB_TYPE_TILE_SIZE;
    CHECK_DNN(cudnnBackendSetAttribute(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &kt));
    set_i64(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, 1, &one);
    CHECK_DNN(cudnnBackendFinalize(knob));
    cudnnBackendDescriptor_t cfg2 = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    set_desc(cfg2, CUDNN_ATTR_ENGINECFG_ENGINE, d);
    CHECK_DNN(cudnnBackendSetAttribute(cfg2, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &knob));
    status("cfg_finalize_unknown_knob", cudnnBackendFinalize(cfg2));
    cudnnBackendDescriptor_t ro = create(CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR);
    status("layout_info_finalize", cudnnBackendFinalize(ro));
    status("layout_info_set", cudnnBackendSetAttribute(ro, CUDNN_ATTR_LAYOUT_INFO_TENSOR_UID, CUDNN_TYPE_INT64, 1, &one));
    cudnnBackendDescriptor_t destroy_later[5] = {ro, cfg2, knob, d, NULL};

    /* Heuristics: the results must go into ENGINECFG descriptors. */
    cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    status("heur_finalize_without_mode", cudnnBackendFinalize(heur));
    cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_FALLBACK;
    CHECK_DNN(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm));
    status("heur_finalize", cudnnBackendFinalize(heur));
    cudnnBackendDescriptor_t not_cfg = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    status("heur_results_into_engine", cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &not_cfg));
    CHECK_DNN(cudnnBackendDestroyDescriptor(not_cfg));
    CHECK_DNN(cudnnBackendDestroyDescriptor(heur));

    /* Plan: workspace size type, JSON, what it reports. */
    cudnnBackendDescriptor_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    status("plan_finalize_without_cfg", cudnnBackendFinalize(plan));
    set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    status("plan_finalize_without_handle", cudnnBackendFinalize(plan));
    int32_t ws32;
    status("plan_get_workspace_int32", cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT32, 1, &n, &ws32));
    char json[64];
    status("plan_get_json", cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, sizeof json, &n, json));
    status("plan_get_run_only_uids", cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS, CUDNN_TYPE_INT64, 0, &n, NULL));
    printf("INFO plan_run_only_uids %lld\n", (long long)n);
    cudnnBackendDescriptor_t cfg_back = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    status("plan_get_engine_config", cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &cfg_back));
    status("plan_set_after_finalize", cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg));
    CHECK_DNN(cudnnBackendDestroyDescriptor(cfg_back));

    /* Variant packs and execution. */
    struct tensor tbuf[3] = {tx, tw, ty};
    void *mem[3];
    for (int i = 0; i < 3; i++) {
        CHECK_CUDA(cudaMalloc(&mem[i], (size_t)buffer_elems(&tbuf[i]) * 4));
        CHECK_CUDA(cudaMemset(mem[i], 0, (size_t)buffer_elems(&tbuf[i]) * 4));
    }
    int64_t uids[3] = {UID_X, UID_W, UID_Y}, dup_uids[3] = {UID_X, UID_X, UID_Y};
    d = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set_i64(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, 3, uids);
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 2, mem));
    void *no_ws = NULL;
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &no_ws));
    status("execute_unfinalized_pack", cudnnBackendExecute(handle, plan, d));
    status("pack_finalize_count_mismatch", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    d = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set_i64(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, 3, dup_uids);
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, mem));
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &no_ws));
    status("pack_finalize_duplicate_uids", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    d = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set_i64(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, 3, uids);
    CHECK_DNN(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, mem));
    status("pack_finalize_without_workspace", cudnnBackendFinalize(d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));

    cudnnBackendDescriptor_t pack = variant_pack(3, uids, mem, NULL);
    status("execute_null_handle", cudnnBackendExecute(NULL, plan, pack));
    status("execute_pack_as_plan", cudnnBackendExecute(handle, pack, pack));
    status("execute_ok", cudnnBackendExecute(handle, plan, pack));
    int64_t uids_missing[3] = {UID_X, UID_W, 'z'};
    d = variant_pack(3, uids_missing, mem, NULL);
    status("execute_missing_uid", cudnnBackendExecute(handle, plan, d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    float *host_mem = calloc((size_t)buffer_elems(&ty), sizeof(float));
    void *with_host[3] = {mem[0], mem[1], host_mem};
    d = variant_pack(3, uids, with_host, NULL);
    status("execute_host_memory", cudnnBackendExecute(handle, plan, d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    void *misaligned[3] = {mem[0], (char *)mem[1] + 4, mem[2]};
    d = variant_pack(3, uids, misaligned, NULL);
    status("execute_misaligned", cudnnBackendExecute(handle, plan, d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    void *short_y;
    CHECK_CUDA(cudaMalloc(&short_y, (size_t)(numel(&ty) - 1) * 4));
    void *too_small[3] = {mem[0], mem[1], short_y};
    d = variant_pack(3, uids, too_small, NULL);
    status("execute_output_too_small", cudnnBackendExecute(handle, plan, d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    void *null_y[3] = {mem[0], mem[1], NULL};
    d = variant_pack(3, uids, null_y, NULL);
    status("execute_null_data_pointer", cudnnBackendExecute(handle, plan, d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));

    /* Backward filter needs its workspace. */
    cudnnBackendDescriptor_t bop = op_desc(2, 0, 1.0, 0.0, conv, x, w, y, 1);
    cudnnBackendDescriptor_t bgraph = graph_desc(handle, 1, &bop);
    struct chain_info ci;
    cudnnBackendDescriptor_t bplan = build_plan(handle, bgraph, &ci);
    printf("INFO bwd_filter_plan_workspace %lld\n", (long long)ci.workspace);
    status("execute_null_workspace", cudnnBackendExecute(handle, bplan, pack));
    void *small_ws;
    CHECK_CUDA(cudaMalloc(&small_ws, (size_t)ci.workspace / 2));
    d = variant_pack(3, uids, mem, small_ws);
    status("execute_workspace_too_small", cudnnBackendExecute(handle, bplan, d));
    CHECK_DNN(cudnnBackendDestroyDescriptor(d));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(small_ws));
    CHECK_CUDA(cudaFree(short_y));

    /* Unsupported problems: the heuristics return no configuration, engine 0 refuses. */
    struct {
        const char *name;
        cudnnDataType_t dt;
        int64_t xc, wc;     /* x's channels and the filter's input channels (xc / groups) */
    } unsupported[2] = {{"half", CUDNN_DATA_HALF, 3, 3}, {"grouped", CUDNN_DATA_FLOAT, 4, 2}};
    for (int u = 0; u < 2; u++) {
        struct tensor gx = tx, gw = tw;
        gx.dims[1] = unsupported[u].xc;
        gw.dims[1] = unsupported[u].wc;
        set_layout(&gx, PACKED);
        set_layout(&gw, PACKED);
        cudnnBackendDescriptor_t ux = tensor_desc(UID_X, unsupported[u].dt, &gx, 16, 1);
        cudnnBackendDescriptor_t uw = tensor_desc(UID_W, unsupported[u].dt, &gw, 16, 1);
        cudnnBackendDescriptor_t uy = tensor_desc(UID_Y, unsupported[u].dt, &ty, 16, 1);
        cudnnBackendDescriptor_t uop = op_desc(0, 0, 1.0, 0.0, conv, ux, uw, uy, 0);
        char name[64];
        snprintf(name, sizeof name, "%s_op_finalize", unsupported[u].name);
        status(name, cudnnBackendFinalize(uop));
        cudnnBackendDescriptor_t ug = graph_desc(handle, 1, &uop);
        cudnnBackendDescriptor_t uh = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        set_desc(uh, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, ug);
        cudnnBackendHeurMode_t im = CUDNN_HEUR_MODE_INSTANT;
        CHECK_DNN(cudnnBackendSetAttribute(uh, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &im));
        CHECK_DNN(cudnnBackendFinalize(uh));
        n = -1;
        CHECK_DNN(cudnnBackendGetAttribute(uh, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL));
        printf("INFO %s_heuristic_results %lld\n", unsupported[u].name, (long long)n);
        cudnnBackendDescriptor_t ue = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        set_desc(ue, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, ug);
        set_i64(ue, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 1, &zero_index);
        snprintf(name, sizeof name, "%s_engine_finalize", unsupported[u].name);
        status(name, cudnnBackendFinalize(ue));
        cudnnBackendDescriptor_t all[7] = {ue, uh, ug, uop, uy, uw, ux};
        for (int i = 0; i < 7; i++)
            CHECK_DNN(cudnnBackendDestroyDescriptor(all[i]));
    }

    CHECK_CUDA(cudaDeviceSynchronize());
    cudnnBackendDescriptor_t all[12] = {bplan, bgraph, bop, pack, plan, cfg, graph, op, conv, x, w, y};
    for (int i = 0; i < 12; i++)
        CHECK_DNN(cudnnBackendDestroyDescriptor(all[i]));
    for (int i = 0; destroy_later[i]; i++)
        CHECK_DNN(cudnnBackendDestroyDescriptor(destroy_later[i]));
    for (int i = 0; i < 3; i++)
        CHECK_CUDA(cudaFree(mem[i]));
    free(host_mem);
}

static void legacy_errors(cudnnHandle_t handle)
{
    cudnnTensorDescriptor_t t, p;
    CHECK_DNN(cudnnCreateTensorDescriptor(&t));
    CHECK_DNN(cudnnCreateTensorDescriptor(&p));
    int dims3[3] = {2, 3, 4}, strides3[3] = {12, 4, 1};
    int dims4[4] = {2, 3, 4, 5}, strides4[4] = {60, 20, 5, 1};
    int zero4[4] = {2, 0, 4, 5};
    status("tensor_set_nd_3_dims", cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 3, dims3, strides3));
    status("tensor_set_nd_zero_dim", cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 4, zero4, strides4));
    status("tensor_set_nd_bad_type", cudnnSetTensorNdDescriptor(t, (cudnnDataType_t)99, 4, dims4, strides4));
    status("tensor_set_4d_vect_c", cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW_VECT_C, CUDNN_DATA_FLOAT, 2, 3, 4, 5));
    status("tensor_set_4d_negative", cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, -3, 4, 5));
    status("tensor_set_null", cudnnSetTensor4dDescriptor(NULL, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 3, 4, 5));
    status("tensor_set_4d_nhwc", cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 2, 3, 4, 5));
    cudnnDataType_t dt;
    int nd, dims[8], strides[8];
    status("tensor_get_nd", cudnnGetTensorNdDescriptor(t, 8, &dt, &nd, dims, strides));
    printf("INFO tensor_nhwc %d %d %d %d %d %d %d %d %d %d\n", (int)dt, nd, dims[0], dims[1], dims[2], dims[3],
           strides[0], strides[1], strides[2], strides[3]);
    status("tensor_set_4d_ex", cudnnSetTensor4dDescriptorEx(t, CUDNN_DATA_DOUBLE, 2, 3, 4, 5, 100, 30, 6, 1));
    status("tensor_get_nd_2", cudnnGetTensorNdDescriptor(t, 2, &dt, &nd, dims, strides));
    printf("INFO tensor_ex %d %d %d %d %d %d\n", (int)dt, nd, dims[0], dims[1], strides[0], strides[1]);
    status("derive_spatial", cudnnDeriveBNTensorDescriptor(p, t, CUDNN_BATCHNORM_SPATIAL));
    CHECK_DNN(cudnnGetTensorNdDescriptor(p, 8, &dt, &nd, dims, strides));
    printf("INFO derived_spatial %d %d %d %d %d %d %d %d %d %d\n", (int)dt, nd, dims[0], dims[1], dims[2], dims[3],
           strides[0], strides[1], strides[2], strides[3]);
    status("derive_per_activation", cudnnDeriveBNTensorDescriptor(p, t, CUDNN_BATCHNORM_PER_ACTIVATION));
    CHECK_DNN(cudnnGetTensorNdDescriptor(p, 8, &dt, &nd, dims, strides));
    printf("INFO derived_per_activation %d %d %d %d %d %d %d %d %d %d\n", (int)dt, nd, dims[0], dims[1], dims[2],
           dims[3], strides[0], strides[1], strides[2], strides[3]);
    status("derive_bad_mode", cudnnDeriveBNTensorDescriptor(p, t, (cudnnBatchNormMode_t)9));

    /* Batch normalization: a valid float setup, then one thing wrong at a time. */
    CHECK_DNN(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 4, dims4, strides4));
    CHECK_DNN(cudnnDeriveBNTensorDescriptor(p, t, CUDNN_BATCHNORM_SPATIAL));
    void *x, *y, *prm[6];
    CHECK_CUDA(cudaMalloc(&x, 120 * 4));
    CHECK_CUDA(cudaMalloc(&y, 120 * 4));
    CHECK_CUDA(cudaMemset(x, 0, 120 * 4));
    for (int i = 0; i < 6; i++) {
        CHECK_CUDA(cudaMalloc(&prm[i], 3 * 4));
        CHECK_CUDA(cudaMemset(prm[i], 0, 3 * 4));
    }
    const float one = 1.0f, zero = 0.0f;
    const cudnnBatchNormMode_t sp = CUDNN_BATCHNORM_SPATIAL;
#define TRAIN(h, mode, a, xd, xp, pd, rm, rv, eps, sm, si)                                                  \
    cudnnBatchNormalizationForwardTraining(h, mode, a, &zero, xd, xp, xd, y, pd, prm[0], prm[1], 0.1, rm, rv, \
                                           eps, sm, si)
    status("bn_train_ok", TRAIN(handle, sp, &one, t, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    status("bn_train_bad_handle", TRAIN(NULL, sp, &one, t, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    status("bn_train_bad_mode", TRAIN(handle, (cudnnBatchNormMode_t)5, &one, t, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    status("bn_train_null_alpha", TRAIN(handle, sp, NULL, t, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    status("bn_train_null_x", TRAIN(handle, sp, &one, t, NULL, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    status("bn_train_one_running_null", TRAIN(handle, sp, &one, t, x, p, prm[2], NULL, 1e-5, prm[4], prm[5]));
    status("bn_train_one_save_null", TRAIN(handle, sp, &one, t, x, p, prm[2], prm[3], 1e-5, NULL, prm[5]));
    status("bn_train_negative_epsilon", TRAIN(handle, sp, &one, t, x, p, prm[2], prm[3], -1e-5, prm[4], prm[5]));
    status("bn_train_per_activation_with_spatial_params",
           TRAIN(handle, CUDNN_BATCHNORM_PER_ACTIVATION, &one, t, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    float host_x[120];
    status("bn_train_host_memory_x", TRAIN(handle, sp, &one, t, host_x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    cudnnTensorDescriptor_t other;
    CHECK_DNN(cudnnCreateTensorDescriptor(&other));
    CHECK_DNN(cudnnSetTensor4dDescriptor(other, CUDNN_TENSOR_NCHW, CUDNN_DATA_DOUBLE, 1, 3, 1, 1));
    status("bn_train_double_params_for_float_x", TRAIN(handle, sp, &one, t, x, other, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    int dims6[6] = {2, 3, 2, 2, 1, 5}, strides6[6] = {60, 20, 10, 5, 5, 1};
    CHECK_DNN(cudnnSetTensorNdDescriptor(other, CUDNN_DATA_FLOAT, 6, dims6, strides6));
    status("bn_train_6d_x", TRAIN(handle, sp, &one, other, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    CHECK_DNN(cudnnSetTensorNdDescriptor(other, CUDNN_DATA_HALF, 4, dims4, strides4));
    status("bn_train_half_x", TRAIN(handle, sp, &one, other, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    CHECK_DNN(cudnnDestroyTensorDescriptor(other));
    cudnnTensorDescriptor_t unset;
    CHECK_DNN(cudnnCreateTensorDescriptor(&unset));
    status("bn_train_unset_descriptor", TRAIN(handle, sp, &one, unset, x, p, prm[2], prm[3], 1e-5, prm[4], prm[5]));
    CHECK_DNN(cudnnDestroyTensorDescriptor(unset));
#undef TRAIN
    status("bn_train_ex_activation",
           cudnnBatchNormalizationForwardTrainingEx(handle, sp, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &zero, t, x,
                                                    NULL, NULL, t, y, p, prm[0], prm[1], 0.1, prm[2], prm[3], 1e-5,
                                                    prm[4], prm[5], NULL, NULL, 0, NULL, 0));
    status("bn_infer_null_mean",
           cudnnBatchNormalizationForwardInference(handle, sp, &one, &zero, t, x, t, y, p, prm[0], prm[1], NULL,
                                                   prm[3], 1e-5));
    status("bn_backward_one_saved_null",
           cudnnBatchNormalizationBackward(handle, sp, &one, &zero, &one, &zero, t, x, t, y, t, y, p, prm[0], prm[2],
                                           prm[3], 1e-5, prm[4], NULL));
    status("bn_backward_null_dscale",
           cudnnBatchNormalizationBackward(handle, sp, &one, &zero, &one, &zero, t, x, t, y, t, y, p, prm[0], NULL,
                                           prm[3], 1e-5, prm[4], prm[5]));
    status("bn_backward_ex_add_activation",
           cudnnBatchNormalizationBackwardEx(handle, sp, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, &one, &zero, &one,
                                             &zero, t, x, NULL, NULL, t, y, NULL, NULL, t, y, p, prm[0], NULL, prm[2],
                                             prm[3], 1e-5, prm[4], prm[5], NULL, NULL, 0, NULL, 0));
    size_t size = 99;
    status("bn_workspace_size", cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                                    handle, sp, CUDNN_BATCHNORM_OPS_BN, t, t, t, p, NULL, &size));
    printf("INFO bn_workspace_size %zu\n", size);
    status("bn_workspace_size_null_out", cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                                             handle, sp, CUDNN_BATCHNORM_OPS_BN, t, t, t, p, NULL, NULL));
    size = 99;
    status("bn_backward_workspace_size", cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                                             handle, sp, CUDNN_BATCHNORM_OPS_BN, t, t, t, NULL, t, p, NULL, &size));
    printf("INFO bn_backward_workspace_size %zu\n", size);
    size = 99;
    status("bn_reserve_size", cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, sp, CUDNN_BATCHNORM_OPS_BN,
                                                                                  NULL, t, &size));
    printf("INFO bn_reserve_size %zu\n", size);
    status("bn_reserve_size_activation", cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
                                             handle, sp, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, NULL, t, &size));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    for (int i = 0; i < 6; i++)
        CHECK_CUDA(cudaFree(prm[i]));
    status("tensor_destroy", cudnnDestroyTensorDescriptor(t));
    status("tensor_destroy_twice", cudnnDestroyTensorDescriptor(t));
    status("tensor_destroy_null", cudnnDestroyTensorDescriptor(NULL));
    CHECK_DNN(cudnnDestroyTensorDescriptor(p));
}

static void handle_errors(cudnnHandle_t handle, cudaStream_t stream)
{
    status("create_null", cudnnCreate(NULL));
    cudnnHandle_t h2;
    status("create_second", cudnnCreate(&h2));
    cudaStream_t s = (cudaStream_t)1;
    status("get_stream_default", cudnnGetStream(h2, &s));
    printf("INFO default_stream_is_null %d\n", s == NULL);
    status("set_stream", cudnnSetStream(h2, stream));
    status("get_stream", cudnnGetStream(h2, &s));
    printf("INFO stream_round_trip %d\n", s == stream);
    status("get_stream_null_out", cudnnGetStream(h2, NULL));
    status("destroy_second", cudnnDestroy(h2));
    status("destroy_second_again", cudnnDestroy(h2));
    status("set_stream_destroyed_handle", cudnnSetStream(h2, stream));
    status("destroy_null", cudnnDestroy(NULL));
    int v = -1;
    status("get_property_major", cudnnGetProperty(MAJOR_VERSION, &v));
    printf("INFO property_major %d\n", v);
    status("get_property_minor", cudnnGetProperty(MINOR_VERSION, &v));
    printf("INFO property_minor %d\n", v);
    status("get_property_patch", cudnnGetProperty(PATCH_LEVEL, &v));
    printf("INFO property_patch %d\n", v);
    status("get_property_bad_type", cudnnGetProperty((libraryPropertyType)7, &v));
    status("get_property_null", cudnnGetProperty(MAJOR_VERSION, NULL));
    printf("INFO version %zu\n", cudnnGetVersion());
    printf("INFO header_version %d\n", CUDNN_VERSION);
    printf("INFO cudart_version %zu\n", cudnnGetCudartVersion());
    const int codes[] = {0, 1001, 2000, 2001, 2002, 2010, 3000, 3003, 4003, 5000, 12345};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        printf("INFO error_string_%d %s\n", codes[i], cudnnGetErrorString((cudnnStatus_t)codes[i]));
    (void)cudnnSetStream(NULL, stream);     /* fails: leaves a message */
    char msg[256] = "unchanged";
    cudnnGetLastErrorString(msg, sizeof msg);
    printf("INFO last_error_mentions_cudnnSetStream %d\n", strstr(msg, "cudnnSetStream") != NULL);
    cudnnGetLastErrorString(msg, 4);
    printf("INFO last_error_truncated_length %zu\n", strlen(msg));
    (void)handle;
}

/* ---- train: a tiny conv net ------------------------------------------------------------------ */

/* x [4,2,6,6] -> conv1 (3 filters 3x3, padding 1) -> BatchNorm (training,
 * SPATIAL_PERSISTENT, as PyTorch) -> conv2 (2 filters 3x3, padding 1, stride 2)
 * -> z [4,2,3,3]; loss = mean((z - target)^2), dz on the host.  Backward:
 * conv2 backward data and filter, BatchNorm backward (saved statistics),
 * conv1 backward filter; SGD on the host (parameters and gradients move with
 * cudaMemcpy).  The same loop runs on the host with the exact references.
 * Device work: cudaMalloc/cudaMemcpy/cudaMemset and cuDNN only, on the
 * legacy default stream. */
enum { TN = 4, TC0 = 2, TC1 = 3, TC2 = 2, TH = 6, TO = 3, STEPS = 6 };
#define T_X (TN * TC0 * TH * TH)
#define T_H (TN * TC1 * TH * TH)
#define T_Z (TN * TC2 * TO * TO)
#define T_W1 (TC1 * TC0 * 9)
#define T_W2 (TC2 * TC1 * 9)

static const struct conv_problem conv1 = {0, 0, CUDNN_CROSS_CORRELATION, 2, TN, TC0, TC1, SP2(TH, TH), SP2(3, 3),
                                          SP2(1, 1), SP2(1, 1), SP2(1, 1), SP2(1, 1), PACKED, 1.0, 0.0};
static const struct conv_problem conv2 = {0, 0, CUDNN_CROSS_CORRELATION, 2, TN, TC1, TC2, SP2(TH, TH), SP2(3, 3),
                                          SP2(1, 1), SP2(1, 1), SP2(2, 2), SP2(1, 1), PACKED, 1.0, 0.0};

struct net {
    float w1[T_W1], gamma[TC1], beta[TC1], w2[T_W2], rmean[TC1], rvar[TC1];
};

static float loss_and_grad(const float *z, const float *target, float *dz)
{
    float loss = 0.0f;
    for (int i = 0; i < T_Z; i++) {
        float e = z[i] - target[i];
        loss += e * e;
        dz[i] = 2.0f * e / (float)T_Z;
    }
    return loss / (float)T_Z;
}

static void sgd(struct net *m, const float *dw1, const float *dgamma, const float *dbeta, const float *dw2)
{
    const float lr = 0.05f;
    for (int i = 0; i < T_W1; i++)
        m->w1[i] -= lr * dw1[i];
    for (int i = 0; i < TC1; i++) {
        m->gamma[i] -= lr * dgamma[i];
        m->beta[i] -= lr * dbeta[i];
    }
    for (int i = 0; i < T_W2; i++)
        m->w2[i] -= lr * dw2[i];
}

static const struct bn_case train_bn = {"train_bn", 0, BN_TRAIN_EX, 0, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, 4,
                                        {TN, TC1, TH, TH}, PACKED, 1.0, 0.0, 1.0, 0.0, 1e-5, 0.1, 0, 0, 1};

/* One step on the host, in the emulator's documented order. */
static float host_step(struct net *m, float *x, const float *target)
{
    static float h1[T_H], b[T_H], z[T_Z], dz[T_Z], db[T_H], dh1[T_H], dw1[T_W1], dw2[T_W2];
    float smean[TC1], sinv[TC1], dgamma[TC1], dbeta[TC1];
    struct geom g1, g2;
    make_geom(&conv1, &g1);
    make_geom(&conv2, &g2);
    host_conv(&g1, 0, x, m->w1, h1, 1.0, 0.0);
    struct tensor tx = {4, {TN, TC1, TH, TH}, {0}}, tp;
    set_layout(&tx, PACKED);
    param_shape(&tx, train_bn.mode, &tp);
    void *v[V_COUNT] = {0};
    v[V_X] = h1;
    v[V_Y] = b;
    v[V_SCALE] = m->gamma;
    v[V_BIAS] = m->beta;
    v[V_RMEAN] = m->rmean;
    v[V_RVAR] = m->rvar;
    v[V_SMEAN] = smean;
    v[V_SINV] = sinv;
    host_bn(&train_bn, &tx, &tx, &tx, &tp, v);
    host_conv(&g2, 0, b, m->w2, z, 1.0, 0.0);
    float loss = loss_and_grad(z, target, dz);
    g2.kind = 1;
    host_conv(&g2, 0, db, m->w2, dz, 1.0, 0.0);
    g2.kind = 2;
    host_conv(&g2, 0, b, dw2, dz, 1.0, 0.0);
    struct bn_case back = train_bn;
    back.fn = BN_BACKWARD_EX;
    memset(v, 0, sizeof v);
    v[V_X] = h1;
    v[V_Y] = db;
    v[V_DX] = dh1;
    v[V_SCALE] = m->gamma;
    v[V_SMEAN] = smean;
    v[V_SINV] = sinv;
    v[V_DSCALE] = dgamma;
    v[V_DBIAS] = dbeta;
    host_bn(&back, &tx, &tx, &tx, &tp, v);
    g1.kind = 2;
    host_conv(&g1, 0, x, dw1, dh1, 1.0, 0.0);
    sgd(m, dw1, dgamma, dbeta, dw2);
    return loss;
}

static void train(cudnnHandle_t handle)
{
    static float x[T_X], target[T_Z], z[T_Z], dz[T_Z], dw1[T_W1], dw2[T_W2];
    float dgamma[TC1], dbeta[TC1];
    struct net dev, host;
    seed(99);
    for (int i = 0; i < T_X; i++)
        x[i] = (float)next_value();
    for (int i = 0; i < T_Z; i++)
        target[i] = (float)next_value() * 0.5f;
    for (int i = 0; i < T_W1; i++)
        dev.w1[i] = (float)next_value() * 0.2f;
    for (int i = 0; i < T_W2; i++)
        dev.w2[i] = (float)next_value() * 0.2f;
    for (int i = 0; i < TC1; i++) {
        dev.gamma[i] = 1.0f;
        dev.beta[i] = 0.0f;
        dev.rmean[i] = 0.0f;
        dev.rvar[i] = 1.0f;
    }
    host = dev;

    float *d_x, *d_w1, *d_h1, *d_b, *d_w2, *d_z, *d_dz, *d_db, *d_dh1, *d_dw1, *d_dw2;
    float *d_gamma, *d_beta, *d_rmean, *d_rvar, *d_smean, *d_sinv, *d_dgamma, *d_dbeta;
    float **bufs[] = {&d_x, &d_w1, &d_h1, &d_b, &d_w2, &d_z, &d_dz, &d_db, &d_dh1, &d_dw1, &d_dw2,
                      &d_gamma, &d_beta, &d_rmean, &d_rvar, &d_smean, &d_sinv, &d_dgamma, &d_dbeta};
    const int sizes[] = {T_X, T_W1, T_H, T_H, T_W2, T_Z, T_Z, T_H, T_H, T_W1, T_W2,
                         TC1, TC1, TC1, TC1, TC1, TC1, TC1, TC1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        CHECK_CUDA(cudaMalloc((void **)bufs[i], (size_t)sizes[i] * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(d_x, x, sizeof x, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d_rmean, 0, TC1 * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(d_rvar, dev.rvar, sizeof dev.rvar, cudaMemcpyHostToDevice));

    struct tensor tx = {4, {TN, TC1, TH, TH}, {0}}, tp;
    set_layout(&tx, PACKED);
    param_shape(&tx, train_bn.mode, &tp);
    cudnnTensorDescriptor_t hd = legacy_desc(0, &tx), pd = legacy_desc(0, &tp);
    const float one = 1.0f, zero = 0.0f;
    CHECK_DNN(cudnnSetStream(handle, NULL));
    struct conv_problem c2_data = conv2, c2_filter = conv2, c1_filter = conv1;
    c2_data.kind = 1;
    c2_filter.kind = 2;
    c1_filter.kind = 2;

    uint64_t hd_sum = FNV_START, hh_sum = FNV_START;
    for (int step = 0; step < STEPS; step++) {
        CHECK_CUDA(cudaMemcpy(d_w1, dev.w1, sizeof dev.w1, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_w2, dev.w2, sizeof dev.w2, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_gamma, dev.gamma, sizeof dev.gamma, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_beta, dev.beta, sizeof dev.beta, cudaMemcpyHostToDevice));
        run_conv(handle, &conv1, d_x, d_w1, d_h1, NULL, 0);
        size_t ws_size, reserve_size;
        CHECK_DNN(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
            handle, train_bn.mode, CUDNN_BATCHNORM_OPS_BN, hd, hd, hd, pd, NULL, &ws_size));
        CHECK_DNN(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, train_bn.mode, CUDNN_BATCHNORM_OPS_BN,
                                                                       NULL, hd, &reserve_size));
        void *ws = NULL, *reserve = NULL;
        if (ws_size)
            CHECK_CUDA(cudaMalloc(&ws, ws_size));
        if (reserve_size)
            CHECK_CUDA(cudaMalloc(&reserve, reserve_size));
        CHECK_DNN(cudnnBatchNormalizationForwardTrainingEx(
            handle, train_bn.mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, hd, d_h1, NULL, NULL, hd, d_b, pd, d_gamma,
            d_beta, train_bn.factor, d_rmean, d_rvar, train_bn.eps, d_smean, d_sinv, NULL, ws, ws_size, reserve,
            reserve_size));
        run_conv(handle, &conv2, d_b, d_w2, d_z, NULL, 0);
        CHECK_CUDA(cudaMemcpy(z, d_z, sizeof z, cudaMemcpyDeviceToHost));
        float loss = loss_and_grad(z, target, dz);
        printf("step %d loss %.9g\n", step, (double)loss);
        hd_sum = fnv1a(hd_sum, &loss, sizeof loss);
        CHECK_CUDA(cudaMemcpy(d_dz, dz, sizeof dz, cudaMemcpyHostToDevice));
        run_conv(handle, &c2_data, d_db, d_w2, d_dz, NULL, 0);
        run_conv(handle, &c2_filter, d_b, d_dw2, d_dz, NULL, 0);
        size_t bws_size;
        CHECK_DNN(cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, train_bn.mode, CUDNN_BATCHNORM_OPS_BN, hd,
                                                                    hd, hd, NULL, hd, pd, NULL, &bws_size));
        void *bws = NULL;
        if (bws_size)
            CHECK_CUDA(cudaMalloc(&bws, bws_size));
        CHECK_DNN(cudnnBatchNormalizationBackwardEx(handle, train_bn.mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one,
                                                    &zero, hd, d_h1, NULL, NULL, hd, d_db, NULL, NULL, hd, d_dh1, pd,
                                                    d_gamma, NULL, d_dgamma, d_dbeta, train_bn.eps, d_smean, d_sinv,
                                                    NULL, bws, bws_size, reserve, reserve_size));
        run_conv(handle, &c1_filter, d_x, d_dw1, d_dh1, NULL, 0);
        CHECK_CUDA(cudaMemcpy(dw1, d_dw1, sizeof dw1, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(dw2, d_dw2, sizeof dw2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(dgamma, d_dgamma, sizeof dgamma, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(dbeta, d_dbeta, sizeof dbeta, cudaMemcpyDeviceToHost));
        sgd(&dev, dw1, dgamma, dbeta, dw2);
        if (ws)
            CHECK_CUDA(cudaFree(ws));
        if (reserve)
            CHECK_CUDA(cudaFree(reserve));
        if (bws)
            CHECK_CUDA(cudaFree(bws));

        float hloss = host_step(&host, x, target);
        hh_sum = fnv1a(hh_sum, &hloss, sizeof hloss);
    }
    CHECK_CUDA(cudaMemcpy(dev.rmean, d_rmean, sizeof dev.rmean, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(dev.rvar, d_rvar, sizeof dev.rvar, cudaMemcpyDeviceToHost));
    hd_sum = fnv1a(hd_sum, &dev, sizeof dev);
    hh_sum = fnv1a(hh_sum, &host, sizeof host);
    printf("reference_checksum %016llx\n", (unsigned long long)hh_sum);
    printf("checksum %016llx\n", (unsigned long long)hd_sum);
    CHECK_DNN(cudnnDestroyTensorDescriptor(hd));
    CHECK_DNN(cudnnDestroyTensorDescriptor(pd));
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        CHECK_CUDA(cudaFree(*bufs[i]));
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "all";
    int all = !strcmp(what, "all");
    if (!all && strcmp(what, "conv") && strcmp(what, "bn") && strcmp(what, "errors") && strcmp(what, "train")) {
        fprintf(stderr, "usage: %s [all|conv|bn|errors|train]\n", argv[0]);
        return 2;
    }
    cudnnHandle_t handle;
    CHECK_DNN(cudnnCreate(&handle));
    if (!strcmp(what, "train")) {
        train(handle);
    } else {
        cudaStream_t stream;
        CHECK_CUDA(cudaStreamCreate(&stream));
        if (all || !strcmp(what, "conv"))
            for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
                run_conv_case(handle, stream, &conv_cases[i]);
        if (all || !strcmp(what, "bn"))
            for (size_t i = 0; i < sizeof bn_cases / sizeof bn_cases[0]; i++)
                run_bn_case(handle, stream, &bn_cases[i]);
        if (all || !strcmp(what, "errors")) {
            backend_errors(handle);
            legacy_errors(handle);
            handle_errors(handle, stream);
        }
        CHECK_CUDA(cudaStreamDestroy(stream));
    }
    CHECK_DNN(cudnnDestroy(handle));
    printf("DONE\n");
    return 0;
}
