/* cublaslt_gemm.c -- exercises the emulated cuBLASLt
 * (emulator/build/libcublasLt.so.13) for tests/test_emulator_cublaslt.py.
 * Plain C against the real cublasLt.h (and cublas_v2.h, for a cuBLAS handle
 * used as the Lt handle); it would build and run unchanged against NVIDIA's
 * libraries (except that a GPU's results are not bit-identical to the
 * emulator's fixed-order sum).
 *
 *   cublaslt_gemm [all|matmul|errors]   the checks below, then DONE
 *   cublaslt_gemm train                 a short training loop, then
 *                                       "checksum <16 hex digits>", DONE
 *
 * Output, one line per check, for the test to assert on:
 *   CASE <name> hash=<FNV-1a 64 of the m x n results> maxdiff=<vs a host
 *        reference in long double> exact=<elements that differ from the
 *        host's fixed-order computation> pad=<elements outside the m x n
 *        matrices that changed>
 *   STATUS <name> <cublasStatus_t returned>
 *   INFO <name> <value>
 * Exit status 0 unless a CUDA call or a matmul that must succeed failed.
 *
 * Two references per element.  "exact": the host repeats the emulator's
 * documented computation (emulator/README.md, "cuBLASLt") in the same order
 * -- acc += a*b over l in order in the compute type, t = alpha*acc
 * (+ beta*C), + bias, then ReLU or GELU with the same libm tanh -- so the
 * bits must be equal.  "maxdiff": a straightforward long double computation
 * (tanhl for GELU), which differs by rounding only: the test allows a tight
 * tolerance for it.  Compile with -ffp-contract=off: the exact reference
 * must round like the emulator (one multiply, one add per term). */

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "library_common.h"

#define CHECK_BLAS(expr) CHECK_STATUS(cublasStatus_t, expr, #expr, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusName)

/* ---- data ------------------------------------------------------------------------ */

/* In [-4, 4), rounded to float for the single precision cases. */
static double next_value(void)
{
    return next_in(4.0);
}

static double get(const void *buf, int dbl, long long i)
{
    return dbl ? ((const double *)buf)[i] : (double)((const float *)buf)[i];
}

static void put(void *buf, int dbl, long long i, double v)
{
    if (dbl)
        ((double *)buf)[i] = v;
    else
        ((float *)buf)[i] = (float)v;
}

/* A column-major layout with optional strided batches. */
static cublasLtMatrixLayout_t make_layout(cudaDataType t, long long rows, long long cols, long long ld,
                                          int batch, long long stride)
{
    cublasLtMatrixLayout_t l;
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&l, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch != 1) {
        int32_t b = batch;
        int64_t s = stride;
        CHECK_BLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
        CHECK_BLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s,
                                                    sizeof s));
    }
    return l;
}

static void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, int32_t v)
{
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v));
}

/* ---- cases -------------------------------------------------------------------------- */

/* HOST_CHANGED: the stream is stalled while the matmul is queued and the host
 * alpha is overwritten right after the call (the result must use the old
 * value).  DEVICE_WRITTEN: the device alpha is written by a stream-ordered
 * copy queued before the matmul (the result must use the new value). */
enum timing { NORMAL, HOST_CHANGED, DEVICE_WRITTEN };

enum handle_kind { LT_HANDLE, CUBLAS_HANDLE };
enum api { LT, CUBLAS_GEMM };   /* CUBLAS_GEMM: the same product through cublasGemmEx */

struct lt_case {
    const char *name;
    int dbl;
    cublasOperation_t ta, tb;
    int m, n, k, batch;
    double alpha, beta;
    uint32_t epilogue;
    int device_scalars;
    int in_place;               /* C == D */
    int nan_c;                  /* C starts as NaNs (with beta = 0) */
    int legacy_stream;
    int null_algo;              /* pass algo = NULL instead of the heuristic's */
    enum handle_kind handle;
    cublasComputeType_t compute;    /* 0: the default for the type */
    unsigned seed;
    enum timing timing;
    enum api api;
};

#define N CUBLAS_OP_N
#define T CUBLAS_OP_T
#define C CUBLAS_OP_C
#define E_DEF CUBLASLT_EPILOGUE_DEFAULT
#define E_RELU CUBLASLT_EPILOGUE_RELU
#define E_BIAS CUBLASLT_EPILOGUE_BIAS
#define E_RELU_BIAS CUBLASLT_EPILOGUE_RELU_BIAS
#define E_GELU CUBLASLT_EPILOGUE_GELU
#define E_GELU_BIAS CUBLASLT_EPILOGUE_GELU_BIAS

static const struct lt_case cases[] = {
    /* name                        dbl ta tb  m   n   k  b  alpha beta  epilogue  dev inp nan leg nal handle compute seed timing api */
    {"f32_NN",                     0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, 0, 1, NORMAL, LT},
    {"f32_NT",                     0, N, T, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, 0, 2, NORMAL, LT},
    {"f32_TN",                     0, T, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, 0, 3, NORMAL, LT},
    {"f32_TT",                     0, T, T, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, 0, 4, NORMAL, LT},
    {"f32_CN",                     0, C, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, 0, 3, NORMAL, LT},
    {"f32_NN_algo_null",           0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 1, LT_HANDLE, 0, 1, NORMAL, LT},
    {"f32_NN_cublas_handle",       0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, CUBLAS_HANDLE, 0, 1, NORMAL, LT},
    {"f32_NN_legacy_stream",       0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 1, 0, LT_HANDLE, 0, 1, NORMAL, LT},
    {"f32_NN_device_scalars",      0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      1, 0, 0, 0, 0, LT_HANDLE, 0, 1, NORMAL, LT},
    {"f32_NN_host_scalars_copied", 0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, 0, 1, HOST_CHANGED, LT},
    {"f32_NN_device_scalars_read_late", 0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF, 1, 0, 0, 0, 0, LT_HANDLE, 0, 1, DEVICE_WRITTEN, LT},
    {"cublas_gemmex_f32_NN",       0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, CUBLAS_HANDLE, 0, 1, NORMAL, CUBLAS_GEMM},
    {"f32_TT_fast_tf32",           0, T, T, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, CUBLAS_COMPUTE_32F_FAST_TF32, 4, NORMAL, LT},
    {"f32_NN_bias",                0, N, N, 37, 29, 53, 1, 1.0, 0.0, E_BIAS,      0, 0, 0, 0, 0, LT_HANDLE, 0, 5, NORMAL, LT},
    {"f32_TN_relu",                0, T, N, 37, 29, 53, 1, 1.0, 0.5, E_RELU,      0, 0, 0, 0, 0, LT_HANDLE, 0, 6, NORMAL, LT},
    {"f32_NT_relu_bias",           0, N, T, 37, 29, 53, 1, 0.5, 0.25, E_RELU_BIAS, 0, 0, 0, 0, 0, LT_HANDLE, 0, 7, NORMAL, LT},
    {"f32_NN_gelu",                0, N, N, 37, 29, 53, 1, 0.125, 0.0, E_GELU,    0, 0, 0, 0, 0, LT_HANDLE, 0, 8, NORMAL, LT},
    {"f32_TT_gelu_bias",           0, T, T, 37, 29, 53, 1, 0.125, -0.25, E_GELU_BIAS, 0, 0, 0, 0, 0, LT_HANDLE, 0, 9, NORMAL, LT},
    {"f32_NN_beta0_nan_c",         0, N, N, 37, 29, 53, 1, 0.75, 0.0, E_DEF,      0, 0, 1, 0, 0, LT_HANDLE, 0, 10, NORMAL, LT},
    {"f32_NN_in_place_bias",       0, N, N, 37, 29, 53, 1, 1.5, -0.5, E_BIAS,     0, 1, 0, 0, 0, LT_HANDLE, 0, 11, NORMAL, LT},
    {"f32_batched_TN_bias",        0, T, N, 23, 19, 31, 3, 1.0, 0.25, E_BIAS,     0, 0, 0, 0, 0, LT_HANDLE, 0, 21, NORMAL, LT},
    {"f32_batched_NT_relu_device_scalars", 0, N, T, 23, 19, 31, 3, 2.0, -1.0, E_RELU, 1, 0, 0, 0, 0, LT_HANDLE, 0, 22, NORMAL, LT},
    {"f32_batched_NN_in_place",    0, N, N, 23, 19, 31, 2, 1.0, 1.0, E_DEF,      0, 1, 0, 0, 0, CUBLAS_HANDLE, 0, 23, NORMAL, LT},
    {"f64_NN",                     1, N, N, 37, 29, 53, 1, 1.5, -0.5, E_DEF,      0, 0, 0, 0, 0, LT_HANDLE, 0, 31, NORMAL, LT},
    {"f64_TN_gelu_bias",           1, T, N, 37, 29, 53, 1, 0.125, 0.5, E_GELU_BIAS, 0, 0, 0, 0, 0, LT_HANDLE, 0, 32, NORMAL, LT},
    {"f64_batched_NT_relu_bias_device_scalars", 1, N, T, 23, 19, 31, 3, 0.5, 1.0, E_RELU_BIAS, 1, 0, 0, 0, 0, LT_HANDLE, 0, 33, NORMAL, LT},
    {"f64_TT_in_place_cublas_handle", 1, T, T, 37, 29, 53, 1, 1.5, -0.5, E_DEF,   0, 1, 0, 0, 0, CUBLAS_HANDLE, 0, 34, NORMAL, LT},
};

/* A matrix of `batch` rows x cols blocks, leading dimension rows + pad, `stride`
 * elements apart (with a gap between blocks). */
struct shape {
    long long rows, cols, ld, stride, total;
};

static struct shape shape(long long rows, long long cols, int pad, int batch, int gap)
{
    struct shape s = {rows, cols, rows + pad, 0, 0};
    s.stride = s.ld * cols + gap;
    s.total = s.stride * (batch - 1) + s.ld * cols;
    return s;
}

/* op(X)(r, c) of the matrix at offset `base`. */
static double op_at(const void *buf, int dbl, const struct shape *s, long long base, int trans, long long r,
                    long long c)
{
    return trans ? get(buf, dbl, base + c + r * s->ld) : get(buf, dbl, base + r + c * s->ld);
}

static int has_bias(uint32_t e)
{
    return e == E_BIAS || e == E_RELU_BIAS || e == E_GELU_BIAS;
}

static int has_relu(uint32_t e)
{
    return e == E_RELU || e == E_RELU_BIAS;
}

static int has_gelu(uint32_t e)
{
    return e == E_GELU || e == E_GELU_BIAS;
}

/* The emulator's documented per-element computation, in the same order. */
static float exact_f32(const struct lt_case *v, float alpha, float beta, const float *a, long long astep,
                       const float *b, long long bstep, float c, const float *bias)
{
    float t;
    if (alpha == 0.0f) {
        t = beta == 0.0f ? 0.0f : beta * c;
    } else {
        float s = 0.0f;
        for (int l = 0; l < v->k; l++)
            s += a[l * astep] * b[l * bstep];
        t = alpha * s;
        if (beta != 0.0f)
            t = t + beta * c;
    }
    if (bias)
        t = t + *bias;
    if (has_relu(v->epilogue))
        t = t > 0.0f ? t : 0.0f;
    else if (has_gelu(v->epilogue))
        t = (0.5f * t) * (1.0f + tanhf(0.7978845608028654f * (t + 0.044715f * ((t * t) * t))));
    return t;
}

static double exact_f64(const struct lt_case *v, double alpha, double beta, const double *a,
                        long long astep, const double *b, long long bstep, double c, const double *bias)
{
    double t;
    if (alpha == 0.0) {
        t = beta == 0.0 ? 0.0 : beta * c;
    } else {
        double s = 0.0;
        for (int l = 0; l < v->k; l++)
            s += a[l * astep] * b[l * bstep];
        t = alpha * s;
        if (beta != 0.0)
            t = t + beta * c;
    }
    if (bias)
        t = t + *bias;
    if (has_relu(v->epilogue))
        t = t > 0.0 ? t : 0.0;
    else if (has_gelu(v->epilogue))
        t = (0.5 * t) * (1.0 + tanh(0.7978845608028654 * (t + 0.044715 * ((t * t) * t))));
    return t;
}

static long double activation_ld(uint32_t e, long double t)
{
    if (has_relu(e))
        return t > 0 ? t : 0;
    if (has_gelu(e))
        return 0.5L * t * (1.0L + tanhl(0.7978845608028654L * (t + 0.044715L * t * t * t)));
    return t;
}

static void run_case(cublasLtHandle_t lt, cublasHandle_t blas, cudaStream_t stream, const struct lt_case *v)
{
    const int dbl = v->dbl;
    const size_t es = dbl ? sizeof(double) : sizeof(float);
    const cudaDataType type = dbl ? CUDA_R_64F : CUDA_R_32F;
    const int ta = v->ta != N, tb = v->tb != N;
    struct shape sa = shape(ta ? v->k : v->m, ta ? v->m : v->k, 3, v->batch, 5);
    struct shape sb = shape(tb ? v->n : v->k, tb ? v->k : v->n, 2, v->batch, 7);
    struct shape sc = shape(v->m, v->n, 4, v->batch, 9);
    /* cuBLAS's GEMM has no separate D: it writes C, like an in-place matmul */
    const int c_is_d = v->in_place || v->api == CUBLAS_GEMM;
    struct shape sd = c_is_d ? sc : shape(v->m, v->n, 1, v->batch, 3);
    const long long bias_stride = v->m + 2;     /* BIAS_BATCH_STRIDE, with a gap */
    const long long bias_total = bias_stride * v->batch;

    seed(v->seed);
    void *hA = malloc(sa.total * es), *hB = malloc(sb.total * es), *hC = malloc(sc.total * es);
    void *hD0 = malloc(sd.total * es), *hD = malloc(sd.total * es), *hBias = malloc(bias_total * es);
    for (long long i = 0; i < sa.total; i++)
        put(hA, dbl, i, next_value());
    for (long long i = 0; i < sb.total; i++)
        put(hB, dbl, i, next_value());
    for (long long i = 0; i < sc.total; i++)
        put(hC, dbl, i, v->nan_c ? NAN : next_value());
    for (long long i = 0; i < bias_total; i++)
        put(hBias, dbl, i, next_value());
    if (c_is_d)
        memcpy(hD0, hC, sd.total * es);
    else
        for (long long i = 0; i < sd.total; i++)
            put(hD0, dbl, i, 1234.5);   /* every element, padding included: pad checks what changed */

    void *dA, *dB, *dC, *dD, *dBias;
    CHECK_CUDA(cudaMalloc(&dA, sa.total * es));
    CHECK_CUDA(cudaMalloc(&dB, sb.total * es));
    CHECK_CUDA(cudaMalloc(&dC, sc.total * es));
    CHECK_CUDA(cudaMalloc(&dBias, bias_total * es));
    CHECK_CUDA(cudaMemcpy(dA, hA, sa.total * es, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dB, hB, sb.total * es, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dC, hC, sc.total * es, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dBias, hBias, bias_total * es, cudaMemcpyHostToDevice));
    if (c_is_d) {
        dD = dC;
    } else {
        CHECK_CUDA(cudaMalloc(&dD, sd.total * es));
        CHECK_CUDA(cudaMemcpy(dD, hD0, sd.total * es, cudaMemcpyHostToDevice));
    }

    cudaStream_t s = v->legacy_stream ? (cudaStream_t)0 : stream;
    cublasLtHandle_t h = v->handle == CUBLAS_HANDLE ? (cublasLtHandle_t)blas : lt;
    union { float f; double d; } alpha, beta, wrong;
    if (dbl) {
        alpha.d = v->alpha;
        beta.d = v->beta;
        wrong.d = 100.0;
    } else {
        alpha.f = (float)v->alpha;
        beta.f = (float)v->beta;
        wrong.f = 100.0f;
    }
    const void *pa = &alpha, *pb = &beta;
    void *dScalars = NULL, *pinned = NULL;
    if (v->device_scalars) {
        CHECK_CUDA(cudaMalloc(&dScalars, 2 * es));
        CHECK_CUDA(cudaMemcpy(dScalars, v->timing == DEVICE_WRITTEN ? (void *)&wrong : (void *)&alpha, es,
                              cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy((char *)dScalars + es, &beta, es, cudaMemcpyHostToDevice));
        pa = dScalars;
        pb = (char *)dScalars + es;
    }

    cublasComputeType_t compute = v->compute ? v->compute : dbl ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t desc;
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc, compute, type));
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, v->ta);
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, v->tb);
    if (v->device_scalars)
        set_desc(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE);
    uint32_t epi = v->epilogue;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (has_bias(v->epilogue)) {
        int64_t bs = bias_stride;
        CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dBias,
                                                  sizeof dBias));
        set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
        CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bs, sizeof bs));
    }
    cublasLtMatrixLayout_t la = make_layout(type, sa.rows, sa.cols, sa.ld, v->batch, sa.stride);
    cublasLtMatrixLayout_t lb = make_layout(type, sb.rows, sb.cols, sb.ld, v->batch, sb.stride);
    cublasLtMatrixLayout_t lc = make_layout(type, sc.rows, sc.cols, sc.ld, v->batch, sc.stride);
    cublasLtMatrixLayout_t ld = make_layout(type, sd.rows, sd.cols, sd.ld, v->batch, sd.stride);

    /* The algorithm, as PyTorch picks it: a preference with a workspace limit, one result. */
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = 1 << 20;
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                    sizeof ws));
    cublasLtMatmulHeuristicResult_t heur;
    int count = 0;
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 1, &heur, &count));
    if (count != 1 || heur.state != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "%s: heuristic returned %d algorithm(s)\n", v->name, count);
        exit(1);
    }

    if (v->timing != NORMAL)    /* keep the stream busy while the matmul is queued */
        CHECK_CUDA(cudaLaunchHostFunc(s, host_fn_sleep, (void *)(intptr_t)150));
    if (v->timing == DEVICE_WRITTEN) {
        CHECK_CUDA(cudaMallocHost(&pinned, es));
        memcpy(pinned, &alpha, es);
        CHECK_CUDA(cudaMemcpyAsync(dScalars, pinned, es, cudaMemcpyHostToDevice, s));
    }
    if (v->api == CUBLAS_GEMM) {
        CHECK_BLAS(cublasSetStream(blas, s));
        CHECK_BLAS(cublasGemmEx(blas, v->ta, v->tb, v->m, v->n, v->k, pa, dA, type, (int)sa.ld, dB, type,
                                (int)sb.ld, pb, dD, type, (int)sd.ld, compute, CUBLAS_GEMM_DEFAULT));
    } else {
        CHECK_BLAS(cublasLtMatmul(h, desc, pa, dA, la, dB, lb, pb, dC, lc, dD, ld,
                                  v->null_algo ? NULL : &heur.algo, NULL, 0, s));
    }
    if (v->timing == HOST_CHANGED)
        alpha = wrong;          /* the queued matmul must have copied the old value */
    CHECK_CUDA(cudaStreamSynchronize(s));
    if (v->timing == HOST_CHANGED) {
        if (dbl)
            alpha.d = v->alpha;
        else
            alpha.f = (float)v->alpha;
    }
    CHECK_CUDA(cudaMemcpy(hD, dD, sd.total * es, cudaMemcpyDeviceToHost));

    const void *cref = hC;
    const struct shape *scr = &sc;
    uint64_t hash = FNV_START;      /* of the m x n results, batch by batch, column by column */
    double maxdiff = 0;
    long long inexact = 0, pad = 0;
    char *touched = calloc(sd.total, 1);
    for (int b = 0; b < v->batch; b++)
        for (int j = 0; j < v->n; j++)
            for (int i = 0; i < v->m; i++) {
                long long di = b * sd.stride + i + (long long)j * sd.ld;
                long long ci = b * scr->stride + i + (long long)j * scr->ld;
                long long bi = b * bias_stride + i;
                touched[di] = 1;
                hash = fnv1a(hash, (const char *)hD + di * es, es);
                double c0 = get(cref, dbl, ci), got = get(hD, dbl, di);
                const int bias = has_bias(v->epilogue);
                /* long double reference */
                long double sum = 0;
                for (int l = 0; l < v->k; l++)
                    sum += (long double)op_at(hA, dbl, &sa, b * sa.stride, ta, i, l) *
                           op_at(hB, dbl, &sb, b * sb.stride, tb, l, j);
                long double ref = (long double)v->alpha * sum + (v->beta == 0 ? 0 : (long double)v->beta * c0);
                if (bias)
                    ref += get(hBias, dbl, bi);
                ref = activation_ld(v->epilogue, ref);
                double diff = (double)fabsl(got - ref);
                if (!isnan(maxdiff) && !(diff <= maxdiff))
                    maxdiff = diff;     /* a NaN sticks */
                /* the fixed-order computation: op(A)(i, l) and op(B)(l, j) with their steps */
                long long astep = ta ? 1 : sa.ld, bstep = tb ? sb.ld : 1;
                long long aoff = b * sa.stride + (ta ? i * sa.ld : i);
                long long boff = b * sb.stride + (tb ? j : j * sb.ld);
                int same;
                if (dbl) {
                    double want = exact_f64(v, alpha.d, beta.d, (const double *)hA + aoff, astep,
                                            (const double *)hB + boff, bstep, get(cref, 1, ci),
                                            bias ? (const double *)hBias + bi : NULL);
                    same = memcmp(&want, (const double *)hD + di, sizeof want) == 0;
                } else {
                    float want = exact_f32(v, alpha.f, beta.f, (const float *)hA + aoff, astep,
                                           (const float *)hB + boff, bstep, ((const float *)cref)[ci],
                                           bias ? (const float *)hBias + bi : NULL);
                    same = memcmp(&want, (const float *)hD + di, sizeof want) == 0;
                }
                inexact += !same;
            }
    for (long long i = 0; i < sd.total; i++)
        if (!touched[i] && memcmp((char *)hD + i * es, (char *)hD0 + i * es, es) != 0)
            pad++;
    printf("CASE %s hash=%016llx maxdiff=%.3e exact=%lld pad=%lld\n", v->name,
           (unsigned long long)hash, maxdiff, inexact, pad);

    CHECK_BLAS(cublasLtMatmulPreferenceDestroy(pref));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(la));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(lb));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(lc));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(ld));
    CHECK_BLAS(cublasLtMatmulDescDestroy(desc));
    free(touched);
    free(hA);
    free(hB);
    free(hC);
    free(hD0);
    free(hD);
    free(hBias);
    CHECK_CUDA(cudaFree(dA));
    CHECK_CUDA(cudaFree(dB));
    CHECK_CUDA(cudaFree(dC));
    if (!c_is_d)
        CHECK_CUDA(cudaFree(dD));
    CHECK_CUDA(cudaFree(dBias));
    if (dScalars)
        CHECK_CUDA(cudaFree(dScalars));
    if (pinned)
        CHECK_CUDA(cudaFreeHost(pinned));
}

/* ---- argument errors, attributes, handles ---------------------------------------------- */

static void status(const char *name, cublasStatus_t s)
{
    printf("STATUS %s %d\n", name, (int)s);
}

/* cublasLtMatmul and the heuristic on an 8 x 8 x 8 FP32 problem whose descriptors
 * `tweak` has changed; reports both statuses and the heuristic's count. */
static void both(cublasLtHandle_t h, const char *name, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t la,
                 cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                 cublasLtMatmulPreference_t pref, const void *dA, const void *dB, void *dC)
{
    float alpha = 1, beta = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "matmul_%s", name);
    status(buf, cublasLtMatmul(h, d, &alpha, dA, la, dB, lb, &beta, dC, lc, dC, ld, NULL, NULL, 0, 0));
    cublasLtMatmulHeuristicResult_t r;
    int count = -1;
    snprintf(buf, sizeof buf, "heuristic_%s", name);
    status(buf, cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, ld, pref, 1, &r, &count));
    printf("INFO %s_count %d\n", buf, count);
}

static void errors(cublasLtHandle_t lt, cublasHandle_t blas)
{
    float *dA, *dB, *dC, *dBias, alpha = 1, beta = 0, *hostA = malloc(64 * 64 * sizeof(float));
    CHECK_CUDA(cudaMalloc((void **)&dA, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&dB, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&dC, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&dBias, 64 * sizeof(float)));
    CHECK_CUDA(cudaMemset(dA, 0, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMemset(dB, 0, 64 * 64 * sizeof(float)));

    cublasLtMatmulDesc_t d;
    CHECK_BLAS(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t l8 = make_layout(CUDA_R_32F, 8, 8, 8, 1, 0);
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));

    /* ---- matmul descriptor attributes */
    int32_t i32 = CUBLAS_OP_T;
    int64_t i64 = 0;
    size_t written = 0;
    status("desc_set_transa", cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32));
    status("desc_set_transa_wrong_size", cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i64,
                                                                        sizeof i64));
    status("desc_set_unknown_attribute", cublasLtMatmulDescSetAttribute(d, (cublasLtMatmulDescAttributes_t)9999,
                                                                        &i32, sizeof i32));
    status("desc_set_null_buf", cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 4));
    status("desc_set_null_desc", cublasLtMatmulDescSetAttribute(NULL, CUBLASLT_MATMUL_DESC_TRANSA, &i32, 4));
    i32 = -1;
    status("desc_get_transa", cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32,
                                                             &written));
    printf("INFO desc_transa %d %zu\n", (int)i32, written);
    written = 0;
    status("desc_get_size_query_bias_pointer",
           cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, NULL, 0, &written));
    printf("INFO desc_bias_pointer_size %zu\n", written);
    written = 0;
    status("desc_get_size_query_epilogue",
           cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, NULL, 0, &written));
    printf("INFO desc_epilogue_size %zu\n", written);
    status("desc_get_size_query_null_written",
           cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, NULL, 0, NULL));
    status("desc_get_wrong_size", cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &i64,
                                                                 sizeof i64, &written));
    status("desc_get_unknown_attribute",
           cublasLtMatmulDescGetAttribute(d, (cublasLtMatmulDescAttributes_t)9999, &i32, sizeof i32, &written));
    uint32_t epi = 0;
    status("desc_get_default_epilogue",
           cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, NULL));
    printf("INFO desc_default_epilogue %u\n", epi);
    int32_t scale = -1;
    CHECK_BLAS(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &scale, sizeof scale, NULL));
    printf("INFO desc_scale_type %d\n", (int)scale);
    int8_t fast = 1;
    status("desc_set_fast_accum", cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                                 sizeof fast));
    i32 = 0;
    status("desc_set_sm_count_target",
           cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &i32, sizeof i32));
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N);

    /* ---- layout attributes */
    uint64_t u64 = 0;
    status("layout_get_rows", cublasLtMatrixLayoutGetAttribute(l8, CUBLASLT_MATRIX_LAYOUT_ROWS, &u64,
                                                               sizeof u64, &written));
    printf("INFO layout_rows %llu %zu\n", (unsigned long long)u64, written);
    status("layout_set_rows_wrong_size",
           cublasLtMatrixLayoutSetAttribute(l8, CUBLASLT_MATRIX_LAYOUT_ROWS, &i32, sizeof i32));
    status("layout_set_unknown_attribute",
           cublasLtMatrixLayoutSetAttribute(l8, (cublasLtMatrixLayoutAttribute_t)9999, &i32, sizeof i32));
    written = 0;
    status("layout_get_size_query_batch_count",
           cublasLtMatrixLayoutGetAttribute(l8, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, NULL, 0, &written));
    printf("INFO layout_batch_count_size %zu\n", written);
    i32 = 0;
    CHECK_BLAS(cublasLtMatrixLayoutGetAttribute(l8, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &i32, sizeof i32, NULL));
    printf("INFO layout_default_batch_count %d\n", (int)i32);

    /* ---- preference attributes */
    u64 = 4 << 20;
    status("pref_set_max_workspace", cublasLtMatmulPreferenceSetAttribute(
                                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u64, sizeof u64));
    status("pref_set_max_workspace_wrong_size", cublasLtMatmulPreferenceSetAttribute(
                                                    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &i32, 4));
    status("pref_set_unknown_attribute", cublasLtMatmulPreferenceSetAttribute(
                                             pref, (cublasLtMatmulPreferenceAttributes_t)9999, &u64, sizeof u64));
    uint32_t align = 16;
    status("pref_set_min_alignment_a", cublasLtMatmulPreferenceSetAttribute(
                                           pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align));
    u64 = 0;
    status("pref_get_max_workspace", cublasLtMatmulPreferenceGetAttribute(
                                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u64, sizeof u64, &written));
    printf("INFO pref_max_workspace %llu %zu\n", (unsigned long long)u64, written);

    /* ---- the heuristic's one result */
    cublasLtMatmulHeuristicResult_t r[4];
    memset(r, 0x5a, sizeof r);
    int count = -1;
    status("heuristic_valid", cublasLtMatmulAlgoGetHeuristic(lt, d, l8, l8, l8, l8, pref, 4, r, &count));
    printf("INFO heuristic_result %d %zu %d %g\n", count, r[0].workspaceSize, (int)r[0].state,
           (double)r[0].wavesCount);
    status("heuristic_cublas_handle",
           cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)blas, d, l8, l8, l8, l8, pref, 1, r, &count));
    status("heuristic_null_handle", cublasLtMatmulAlgoGetHeuristic(NULL, d, l8, l8, l8, l8, pref, 1, r, &count));
    status("heuristic_requested_zero", cublasLtMatmulAlgoGetHeuristic(lt, d, l8, l8, l8, l8, pref, 0, r, &count));
    uint64_t mask = CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA;     /* tensor cores only: excludes the emulator's */
    cublasLtMatmulPreference_t hmma;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&hmma));
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(hmma, CUBLASLT_MATMUL_PREF_IMPL_MASK, &mask, sizeof mask));
    count = -1;
    status("heuristic_impl_mask_hmma_only",
           cublasLtMatmulAlgoGetHeuristic(lt, d, l8, l8, l8, l8, hmma, 1, r, &count));
    printf("INFO heuristic_impl_mask_hmma_only_count %d\n", count);
    CHECK_BLAS(cublasLtMatmulPreferenceDestroy(hmma));

    /* ---- matmul statuses */
    cublasLtMatmulAlgo_t algo;
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, d, l8, l8, l8, l8, pref, 1, r, &count));
    algo = r[0].algo;
    status("matmul_valid", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC, l8, &algo, NULL, 0, 0));
    status("matmul_null_handle", cublasLtMatmul(NULL, d, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC, l8, NULL,
                                                NULL, 0, 0));
    status("matmul_null_desc", cublasLtMatmul(lt, NULL, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC, l8, NULL,
                                              NULL, 0, 0));
    status("matmul_null_Bdesc", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, NULL, &beta, dC, l8, dC, l8, NULL,
                                               NULL, 0, 0));
    status("matmul_null_alpha", cublasLtMatmul(lt, d, NULL, dA, l8, dB, l8, &beta, dC, l8, dC, l8, NULL, NULL,
                                               0, 0));
    cublasLtMatmulAlgo_t bad = algo;
    bad.data[0] ^= 1;
    status("matmul_bad_algo", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC, l8, &bad, NULL,
                                             0, 0));
    status("matmul_host_memory_A", cublasLtMatmul(lt, d, &alpha, hostA, l8, dB, l8, &beta, dC, l8, dC, l8,
                                                  NULL, NULL, 0, 0));
    cublasLtMatrixLayout_t big = make_layout(CUDA_R_32F, 64, 65, 64, 1, 0);
    cublasLtMatrixLayout_t k65 = make_layout(CUDA_R_32F, 65, 64, 65, 1, 0);
    status("matmul_D_past_end", cublasLtMatmul(lt, d, &alpha, dA, big, dB, k65, &beta, dC, big, dC, big,
                                               NULL, NULL, 0, 0));
    cublasLtMatrixLayout_t l8_ld9 = make_layout(CUDA_R_32F, 8, 8, 9, 1, 0);
    status("matmul_in_place_ld_mismatch", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, l8, &beta, dC, l8_ld9, dC,
                                                         l8, NULL, NULL, 0, 0));
    status("matmul_cublas_handle", cublasLtMatmul((cublasLtHandle_t)blas, d, &alpha, dA, l8, dB, l8, &beta, dC,
                                                  l8, dC, l8, NULL, NULL, 0, 0));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_POINTER_MODE,
                                              &(int32_t){CUBLASLT_POINTER_MODE_DEVICE}, 4));
    status("matmul_device_mode_host_alpha", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC,
                                                           l8, NULL, NULL, 0, 0));
    set_desc(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);

    /* descriptor problems: each seen by both the matmul and the heuristic */
    cublasLtMatrixLayout_t row = make_layout(CUDA_R_32F, 8, 8, 8, 1, 0);
    int32_t order = CUBLASLT_ORDER_ROW;
    CHECK_BLAS(cublasLtMatrixLayoutSetAttribute(row, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order));
    both(lt, "row_order", d, row, l8, l8, l8, pref, dA, dB, dC);
    cublasLtMatrixLayout_t l8x7 = make_layout(CUDA_R_32F, 8, 7, 8, 1, 0);
    both(lt, "dims_mismatch", d, l8, l8x7, l8, l8, pref, dA, dB, dC);
    cublasLtMatrixLayout_t ld_small = make_layout(CUDA_R_32F, 8, 8, 7, 1, 0);
    both(lt, "lda_below_rows", d, ld_small, l8, l8, l8, pref, dA, dB, dC);
    cublasLtMatrixLayout_t b2 = make_layout(CUDA_R_32F, 8, 8, 8, 2, 64);
    both(lt, "batch_mismatch", d, l8, l8, l8, b2, pref, dA, dB, dC);
    cublasLtMatrixLayout_t h16 = make_layout(CUDA_R_16F, 8, 8, 8, 1, 0);
    both(lt, "f16_A", d, h16, l8, l8, l8, pref, dA, dB, dC);
    cublasLtMatrixLayout_t d64 = make_layout(CUDA_R_64F, 8, 8, 8, 1, 0);
    both(lt, "mixed_32f_64f", d, l8, l8, d64, d64, pref, dA, dB, dC);
    cublasLtMatmulDesc_t d64c;
    CHECK_BLAS(cublasLtMatmulDescCreate(&d64c, CUBLAS_COMPUTE_64F, CUDA_R_64F));
    both(lt, "compute_64f_data_32f", d64c, l8, l8, l8, l8, pref, dA, dB, dC);
    CHECK_BLAS(cublasLtMatmulDescDestroy(d64c));
    set_desc(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE_VECTOR);
    both(lt, "pointer_mode_device_vector", d, l8, l8, l8, l8, pref, dA, dB, dC);
    set_desc(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_T);
    both(lt, "transc_T", d, l8, l8, l8, l8, pref, dA, dB, dC);
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_N);
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSA, 7);
    both(lt, "bad_transa", d, l8, l8, l8, l8, pref, dA, dB, dC);
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N);
    epi = CUBLASLT_EPILOGUE_RELU_AUX;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    both(lt, "epilogue_relu_aux", d, l8, l8, l8, l8, pref, dA, dB, dC);
    epi = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    both(lt, "epilogue_dgelu_bgrad", d, l8, l8, l8, l8, pref, dA, dB, dC);
    epi = CUBLASLT_EPILOGUE_BIAS;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    status("matmul_bias_null_pointer", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC, l8,
                                                      NULL, NULL, 0, 0));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dBias, sizeof dBias));
    status("matmul_bias", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC, l8, NULL, NULL, 0, 0));
    set_desc(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16F);
    both(lt, "bias_type_16f", d, l8, l8, l8, l8, pref, dA, dB, dC);
    set_desc(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, -1);
    epi = CUBLASLT_EPILOGUE_DEFAULT;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dBias, sizeof dBias));
    both(lt, "a_scale_pointer", d, l8, l8, l8, l8, pref, dA, dB, dC);
    void *nul = NULL;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &nul, sizeof nul));
    status("matmul_valid_again", cublasLtMatmul(lt, d, &alpha, dA, l8, dB, l8, &beta, dC, l8, dC, l8, NULL,
                                                NULL, 0, 0));

    /* ---- handles, versions, names */
    cublasLtHandle_t gone;
    status("lt_create", cublasLtCreate(&gone));
    status("lt_destroy", cublasLtDestroy(gone));
    status("lt_destroy_twice", cublasLtDestroy(gone));
    status("lt_destroy_null", cublasLtDestroy(NULL));
    status("lt_destroy_cublas_handle", cublasLtDestroy((cublasLtHandle_t)blas));
    status("lt_create_null", cublasLtCreate(NULL));
    status("desc_create_null", cublasLtMatmulDescCreate(NULL, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    status("layout_create_null", cublasLtMatrixLayoutCreate(NULL, CUDA_R_32F, 8, 8, 8));
    status("pref_create_null", cublasLtMatmulPreferenceCreate(NULL));
    /* the cuBLAS handle is still usable after the refused Lt destroy */
    status("cublas_handle_still_live", cublasSetStream(blas, 0));
    printf("INFO version %zu\n", cublasLtGetVersion());
    printf("INFO cudart_version %zu\n", cublasLtGetCudartVersion());
    printf("INFO status_name_7 %s\n", cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE));
    printf("INFO status_name_15 %s\n", cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED));
    printf("INFO status_string_1 %s\n", cublasLtGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED));

    CHECK_CUDA(cudaDeviceSynchronize());
    cublasLtMatrixLayout_t ls[] = {l8, big, k65, l8_ld9, row, l8x7, ld_small, b2, h16, d64};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        CHECK_BLAS(cublasLtMatrixLayoutDestroy(ls[i]));
    CHECK_BLAS(cublasLtMatmulDescDestroy(d));
    CHECK_BLAS(cublasLtMatmulPreferenceDestroy(pref));
    free(hostA);
    CHECK_CUDA(cudaFree(dA));
    CHECK_CUDA(cudaFree(dB));
    CHECK_CUDA(cudaFree(dC));
    CHECK_CUDA(cudaFree(dBias));
}

/* ---- train: a deterministic training-like loop ------------------------------------------ */

/* A linear layer Y = W X + b (W: OUT x IN, X: IN x BATCH, b: OUT), fitted to
 * targets T by SGD on the mean squared error, STEPS times:
 *   forward   Y = W X + b             cublasLtMatmul, BIAS epilogue
 *   gradient  G = (Y - T) / BATCH     host (Y copied back), G copied to the device
 *   backward  dW = G X^T              cublasLtMatmul (transb = T)
 *   update    W -= lr dW, b -= lr rowsum(G)   host, W copied back and forth
 * The same loop runs on the host with the same operation order; the device
 * checksum (FNV-1a of the final W, b and every step's loss) is printed as
 * "checksum", the host's as "reference_checksum": they must be equal, and
 * identical from run to run. */
enum { IN = 24, OUT = 12, BATCH = 40, STEPS = 25 };

struct model {
    float W[OUT * IN], b[OUT];
};

/* Y = W X + b in the emulator's order: sum over l in order, then + bias. */
static void host_forward(const struct model *md, const float *X, float *Y)
{
    for (int j = 0; j < BATCH; j++)
        for (int i = 0; i < OUT; i++) {
            float s = 0.0f;
            for (int l = 0; l < IN; l++)
                s += md->W[i + l * OUT] * X[l + j * IN];
            Y[i + j * OUT] = 1.0f * s + md->b[i];
        }
}

static void host_backward(const float *G, const float *X, float *dW)
{
    for (int l = 0; l < IN; l++)
        for (int i = 0; i < OUT; i++) {
            float s = 0.0f;
            for (int j = 0; j < BATCH; j++)
                s += G[i + j * OUT] * X[l + j * IN];
            dW[i + l * OUT] = 1.0f * s;
        }
}

/* Loss and gradient from Y; SGD update from dW.  Shared by both loops. */
static float gradient(const float *Y, const float *Tg, float *G)
{
    float loss = 0.0f;
    for (int i = 0; i < OUT * BATCH; i++) {
        float e = Y[i] - Tg[i];
        loss += e * e;
        G[i] = e / (float)BATCH;
    }
    return loss / (float)(OUT * BATCH);
}

static void sgd(struct model *md, const float *dW, const float *G, float lr)
{
    for (int i = 0; i < OUT * IN; i++)
        md->W[i] -= lr * dW[i];
    for (int i = 0; i < OUT; i++) {
        float s = 0.0f;
        for (int j = 0; j < BATCH; j++)
            s += G[i + j * OUT];
        md->b[i] -= lr * s;
    }
}

static void train(cublasLtHandle_t lt, cudaStream_t stream)
{
    static float X[IN * BATCH], Tg[OUT * BATCH], Y[OUT * BATCH], G[OUT * BATCH], dW[OUT * IN];
    struct model dev, host;
    const float lr = 0.05f;
    seed(77);
    for (int i = 0; i < IN * BATCH; i++)
        X[i] = (float)next_value() * 0.25f;
    for (int i = 0; i < OUT * BATCH; i++)
        Tg[i] = (float)next_value();
    for (int i = 0; i < OUT * IN; i++)
        dev.W[i] = (float)next_value() * 0.1f;
    for (int i = 0; i < OUT; i++)
        dev.b[i] = 0.0f;
    host = dev;

    float *dX, *dW_, *db, *dY, *dG, *ddW;
    CHECK_CUDA(cudaMalloc((void **)&dX, sizeof X));
    CHECK_CUDA(cudaMalloc((void **)&dW_, sizeof dev.W));
    CHECK_CUDA(cudaMalloc((void **)&db, sizeof dev.b));
    CHECK_CUDA(cudaMalloc((void **)&dY, sizeof Y));
    CHECK_CUDA(cudaMalloc((void **)&dG, sizeof G));
    CHECK_CUDA(cudaMalloc((void **)&ddW, sizeof dW));
    CHECK_CUDA(cudaMemcpy(dX, X, sizeof X, cudaMemcpyHostToDevice));

    cublasLtMatmulDesc_t fwd, bwd;
    CHECK_BLAS(cublasLtMatmulDescCreate(&fwd, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(fwd, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(fwd, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &db, sizeof db));
    CHECK_BLAS(cublasLtMatmulDescCreate(&bwd, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_desc(bwd, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_T);
    cublasLtMatrixLayout_t lW = make_layout(CUDA_R_32F, OUT, IN, OUT, 1, 0);
    cublasLtMatrixLayout_t lX = make_layout(CUDA_R_32F, IN, BATCH, IN, 1, 0);
    cublasLtMatrixLayout_t lY = make_layout(CUDA_R_32F, OUT, BATCH, OUT, 1, 0);
    const float one = 1.0f, zero = 0.0f;

    uint64_t hd = FNV_START, hh = FNV_START;
    float first = 0, last = 0;
    for (int step = 0; step < STEPS; step++) {
        /* device */
        CHECK_CUDA(cudaMemcpyAsync(dW_, dev.W, sizeof dev.W, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(db, dev.b, sizeof dev.b, cudaMemcpyHostToDevice, stream));
        CHECK_BLAS(cublasLtMatmul(lt, fwd, &one, dW_, lW, dX, lX, &zero, dY, lY, dY, lY, NULL, NULL, 0, stream));
        CHECK_CUDA(cudaMemcpyAsync(Y, dY, sizeof Y, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        float loss = gradient(Y, Tg, G);
        hd = fnv1a(hd, &loss, sizeof loss);
        if (step == 0)
            first = loss;
        last = loss;
        CHECK_CUDA(cudaMemcpyAsync(dG, G, sizeof G, cudaMemcpyHostToDevice, stream));
        CHECK_BLAS(cublasLtMatmul(lt, bwd, &one, dG, lY, dX, lX, &zero, ddW, lW, ddW, lW, NULL, NULL, 0, stream));
        CHECK_CUDA(cudaMemcpyAsync(dW, ddW, sizeof dW, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        sgd(&dev, dW, G, lr);

        /* host */
        host_forward(&host, X, Y);
        float hloss = gradient(Y, Tg, G);
        hh = fnv1a(hh, &hloss, sizeof hloss);
        host_backward(G, X, dW);
        sgd(&host, dW, G, lr);
    }
    hd = fnv1a(fnv1a(hd, dev.W, sizeof dev.W), dev.b, sizeof dev.b);
    hh = fnv1a(fnv1a(hh, host.W, sizeof host.W), host.b, sizeof host.b);
    printf("INFO loss_first %.9g\n", (double)first);
    printf("INFO loss_last %.9g\n", (double)last);
    printf("reference_checksum %016llx\n", (unsigned long long)hh);
    printf("checksum %016llx\n", (unsigned long long)hd);

    CHECK_BLAS(cublasLtMatrixLayoutDestroy(lW));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(lX));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(lY));
    CHECK_BLAS(cublasLtMatmulDescDestroy(fwd));
    CHECK_BLAS(cublasLtMatmulDescDestroy(bwd));
    CHECK_CUDA(cudaFree(dX));
    CHECK_CUDA(cudaFree(dW_));
    CHECK_CUDA(cudaFree(db));
    CHECK_CUDA(cudaFree(dY));
    CHECK_CUDA(cudaFree(dG));
    CHECK_CUDA(cudaFree(ddW));
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "all";
    cublasLtHandle_t lt;
    CHECK_BLAS(cublasLtCreate(&lt));
    cublasHandle_t blas;
    CHECK_BLAS(cublasCreate(&blas));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    if (!strcmp(what, "train")) {
        train(lt, stream);
    } else {
        if (!strcmp(what, "all") || !strcmp(what, "matmul"))
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                run_case(lt, blas, stream, &cases[i]);
        if (!strcmp(what, "all") || !strcmp(what, "errors"))
            errors(lt, blas);
    }
    CHECK_CUDA(cudaStreamDestroy(stream));
    CHECK_BLAS(cublasDestroy(blas));
    CHECK_BLAS(cublasLtDestroy(lt));
    printf("DONE\n");
    return 0;
}
