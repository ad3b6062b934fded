/* cublas_gemm.c -- exercises the emulated cuBLAS (emulator/build/libcublas.so.13)
 * for tests/test_emulator_cublas.py.  Plain C against the real cublas_v2.h;
 * it would build and run unchanged against NVIDIA's libraries (except that
 * a GPU's results are not bit-identical to the emulator's fixed-order sum).
 *
 * Output, one line per check, for the test to assert on:
 *   VARIANT <name> hash=<FNV-1a 64 of the whole C buffer> maxdiff=<vs a host
 *           reference in long double> exact=<elements that differ from the
 *           documented fixed-order sum> pad=<padding elements that changed>
 *   STATUS <name> <cublasStatus_t returned>
 *   INFO <name> <value>
 * Exit status 0 unless a CUDA call or a GEMM that must succeed failed.
 *
 * Compile with -ffp-contract=off: the fixed-order reference here must round
 * like the emulator (one multiply, one add per term). */

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "library_common.h"

#define CHECK_BLAS(expr) CHECK_STATUS(cublasStatus_t, expr, #expr, CUBLAS_STATUS_SUCCESS, cublasGetStatusName)

/* ---- data ------------------------------------------------------------------------ */

/* In [-4, 4), rounded to float for the single precision variants. */
static double next_value(void)
{
    return next_in(4.0);
}

/* ---- variants ---------------------------------------------------------------------- */

enum api { SGEMM, DGEMM, SBATCHED, DBATCHED, EX, EX_BATCHED };

/* How the scalars' timing is checked: the stream is stalled by a host function
 * while the GEMM is queued, then (HOST_CHANGED) the host alpha is overwritten
 * right after the call -- the result must use the old value -- or
 * (DEVICE_WRITTEN) the device alpha is written by a stream-ordered copy queued
 * before the GEMM -- the result must use the new value.  CAPTURED: the GEMM is
 * captured into a graph (as PyTorch's CUDA graphs do); it must not run before
 * the graph is launched. */
enum timing { NORMAL, HOST_CHANGED, DEVICE_WRITTEN, CAPTURED };

struct variant {
    const char *name;
    enum api api;
    int dbl;
    cublasOperation_t ta, tb;
    int m, n, k, batch;
    double alpha, beta;
    int nan_c;                   /* C starts as NaNs (with beta = 0) */
    int device_scalars;
    int legacy_stream;           /* cublasSetStream(handle, 0) */
    cublasComputeType_t compute; /* Ex variants */
    unsigned seed;
    enum timing timing;
};

#define N CUBLAS_OP_N
#define T CUBLAS_OP_T
#define C CUBLAS_OP_C

static const struct variant variants[] = {
    /* name                      api         dbl ta tb  m   n   k  b  alpha  beta  nan dev leg compute seed */
    {"sgemm_NN",                 SGEMM,      0, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 1, NORMAL},
    {"sgemm_NT",                 SGEMM,      0, N, T, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 2, NORMAL},
    {"sgemm_TN",                 SGEMM,      0, T, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 3, NORMAL},
    {"sgemm_TT",                 SGEMM,      0, T, T, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 4, NORMAL},
    {"sgemm_CN",                 SGEMM,      0, C, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 3, NORMAL},
    {"sgemm_NN_legacy",          SGEMM,      0, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 1, 0, 1, NORMAL},
    {"sgemm_NN_device_scalars",  SGEMM,      0, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 1, 0, 0, 1, NORMAL},
    {"sgemm_NN_beta0_nan",       SGEMM,      0, N, N, 37, 29, 53, 1, 0.75, 0.0, 1, 0, 0, 0, 5, NORMAL},
    {"sgemm_TN_beta0_nan_legacy", SGEMM,     0, T, N, 16, 64, 33, 1, -2.0, 0.0, 1, 0, 1, 0, 6, NORMAL},
    {"sgemm_k0_beta0_nan",       SGEMM,      0, N, N, 20, 10, 0, 1, 1.0, 0.0, 1, 0, 0, 0, 7, NORMAL},
    {"sgemm_alpha0",             SGEMM,      0, N, T, 20, 10, 12, 1, 0.0, 2.0, 0, 0, 0, 0, 8, NORMAL},
    {"sgemm_host_scalars_copied", SGEMM,     0, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 1, HOST_CHANGED},
    {"sgemm_device_scalars_read_late", SGEMM, 0, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 1, 0, 0, 1, DEVICE_WRITTEN},
    {"sgemm_NN_captured",        SGEMM,      0, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 1, CAPTURED},
    {"dgemm_batched_TN_captured", DBATCHED,  1, T, N, 23, 19, 31, 3, 0.5, 1.0, 0, 0, 0, 0, 23, CAPTURED},
    {"dgemm_NN",                 DGEMM,      1, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 11, NORMAL},
    {"dgemm_NT",                 DGEMM,      1, N, T, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 12, NORMAL},
    {"dgemm_TN",                 DGEMM,      1, T, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 13, NORMAL},
    {"dgemm_TT",                 DGEMM,      1, T, T, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, 0, 14, NORMAL},
    {"dgemm_TT_legacy_device_scalars", DGEMM, 1, T, T, 37, 29, 53, 1, 1.5, -0.5, 0, 1, 1, 0, 14, NORMAL},
    {"dgemm_NN_beta0_nan",       DGEMM,      1, N, N, 37, 29, 53, 1, -1.25, 0.0, 1, 0, 0, 0, 15, NORMAL},
    {"sgemm_batched_NT",         SBATCHED,   0, N, T, 23, 19, 31, 3, 1.0, 0.25, 0, 0, 0, 0, 21, NORMAL},
    {"sgemm_batched_TN_beta0_nan_legacy", SBATCHED, 0, T, N, 23, 19, 31, 3, 2.0, 0.0, 1, 0, 1, 0, 22, NORMAL},
    {"dgemm_batched_TN",         DBATCHED,   1, T, N, 23, 19, 31, 3, 0.5, 1.0, 0, 0, 0, 0, 23, NORMAL},
    {"dgemm_batched_TT_device_scalars", DBATCHED, 1, T, T, 23, 19, 31, 2, 0.5, -1.0, 0, 1, 0, 0, 24, NORMAL},
    {"gemmex_32f_NN",            EX,         0, N, N, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, CUBLAS_COMPUTE_32F, 1, NORMAL},
    {"gemmex_32f_fast_tf32_TT",  EX,         0, T, T, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, CUBLAS_COMPUTE_32F_FAST_TF32, 4, NORMAL},
    {"gemmex_32f_pedantic_NT_beta0_nan", EX, 0, N, T, 37, 29, 53, 1, 1.0, 0.0, 1, 0, 1, CUBLAS_COMPUTE_32F_PEDANTIC, 31, NORMAL},
    {"gemmex_64f_NT",            EX,         1, N, T, 37, 29, 53, 1, 1.5, -0.5, 0, 0, 0, CUBLAS_COMPUTE_64F, 12, NORMAL},
    {"gemmex_64f_TN_device_scalars", EX,     1, T, N, 37, 29, 53, 1, 1.5, -0.5, 0, 1, 0, CUBLAS_COMPUTE_64F, 13, NORMAL},
    {"gemmex_batched_32f_TN",    EX_BATCHED, 0, T, N, 23, 19, 31, 3, 1.0, 0.25, 0, 0, 0, CUBLAS_COMPUTE_32F, 41, NORMAL},
    {"gemmex_batched_64f_NN_legacy", EX_BATCHED, 1, N, N, 23, 19, 31, 2, 0.5, 1.0, 0, 0, 1, CUBLAS_COMPUTE_64F, 42, NORMAL},
    {"gemmex_batched_64f_NT_device_scalars", EX_BATCHED, 1, N, T, 23, 19, 31, 2, 0.5, 0.0, 1, 1, 0, CUBLAS_COMPUTE_64F, 43, NORMAL},
};

/* One matrix of `batch` stored rows x cols blocks, leading dimension rows + pad,
 * `stride` elements apart (with a gap between blocks). */
struct layout {
    int rows, cols, ld;
    long long stride, total;
};

static struct layout layout(int rows, int cols, int pad, int batch, int gap)
{
    struct layout l = {rows, cols, rows + pad, 0, 0};
    if (l.ld < 1)
        l.ld = 1;
    l.stride = (long long)l.ld * cols + gap;
    l.total = l.stride * (batch - 1) + (long long)l.ld * (cols > 0 ? cols : 1);
    return l;
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

static cublasStatus_t call(cublasHandle_t h, const struct variant *v, const void *alpha, const void *A,
                           int lda, long long sa, const void *B, int ldb, long long sb, const void *beta,
                           void *Cd, int ldc, long long sc)
{
    cudaDataType t = v->dbl ? CUDA_R_64F : CUDA_R_32F;
    switch (v->api) {
    case SGEMM:
        return cublasSgemm(h, v->ta, v->tb, v->m, v->n, v->k, alpha, A, lda, B, ldb, beta, Cd, ldc);
    case DGEMM:
        return cublasDgemm(h, v->ta, v->tb, v->m, v->n, v->k, alpha, A, lda, B, ldb, beta, Cd, ldc);
    case SBATCHED:
        return cublasSgemmStridedBatched(h, v->ta, v->tb, v->m, v->n, v->k, alpha, A, lda, sa, B, ldb,
                                         sb, beta, Cd, ldc, sc, v->batch);
    case DBATCHED:
        return cublasDgemmStridedBatched(h, v->ta, v->tb, v->m, v->n, v->k, alpha, A, lda, sa, B, ldb,
                                         sb, beta, Cd, ldc, sc, v->batch);
    case EX:
        return cublasGemmEx(h, v->ta, v->tb, v->m, v->n, v->k, alpha, A, t, lda, B, t, ldb, beta, Cd, t,
                            ldc, v->compute, CUBLAS_GEMM_DEFAULT);
    case EX_BATCHED:
        return cublasGemmStridedBatchedEx(h, v->ta, v->tb, v->m, v->n, v->k, alpha, A, t, lda, sa, B, t,
                                          ldb, sb, beta, Cd, t, ldc, sc, v->batch, v->compute,
                                          CUBLAS_GEMM_DEFAULT);
    }
    return CUBLAS_STATUS_INTERNAL_ERROR;
}

/* op(X)(r, c) for stored X. */
static double op_at(const void *buf, int dbl, const struct layout *l, long long base, int trans, int r, int c)
{
    return trans ? get(buf, dbl, base + c + (long long)r * l->ld) : get(buf, dbl, base + r + (long long)c * l->ld);
}

static void run_variant(cublasHandle_t h, cudaStream_t stream, const struct variant *v)
{
    const int dbl = v->dbl;
    const size_t es = dbl ? sizeof(double) : sizeof(float);
    const int ta = v->ta != CUBLAS_OP_N, tb = v->tb != CUBLAS_OP_N;
    struct layout la = layout(ta ? v->k : v->m, ta ? v->m : v->k, 3, v->batch, 5);
    struct layout lb = layout(tb ? v->n : v->k, tb ? v->k : v->n, 2, v->batch, 3);
    struct layout lc = layout(v->m, v->n, 4, v->batch, 7);

    void *hA = malloc(la.total * es), *hB = malloc(lb.total * es);
    void *hC0 = malloc(lc.total * es), *hC = malloc(lc.total * es);
    seed(v->seed);
    for (long long i = 0; i < la.total; i++)
        put(hA, dbl, i, next_value());
    for (long long i = 0; i < lb.total; i++)
        put(hB, dbl, i, next_value());
    for (long long i = 0; i < lc.total; i++)
        put(hC0, dbl, i, v->nan_c ? NAN : next_value());

    void *dA, *dB, *dC;
    CHECK_CUDA(cudaMalloc(&dA, la.total * es));
    CHECK_CUDA(cudaMalloc(&dB, lb.total * es));
    CHECK_CUDA(cudaMalloc(&dC, lc.total * es));
    CHECK_CUDA(cudaMemcpy(dA, hA, la.total * es, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dB, hB, lb.total * es, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dC, hC0, lc.total * es, cudaMemcpyHostToDevice));

    cudaStream_t s = v->legacy_stream ? (cudaStream_t)0 : stream;
    CHECK_BLAS(cublasSetStream(h, s));
    union scalar { float f; double d; } alpha, beta, wrong;
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
        CHECK_BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
    }
    if (v->timing != NORMAL)    /* keep the stream busy while the GEMM is queued */
        CHECK_CUDA(cudaLaunchHostFunc(s, host_fn_sleep, (void *)(intptr_t)150));
    if (v->timing == DEVICE_WRITTEN) {
        CHECK_CUDA(cudaMallocHost(&pinned, es));
        memcpy(pinned, &alpha, es);
        CHECK_CUDA(cudaMemcpyAsync(dScalars, pinned, es, cudaMemcpyHostToDevice, s));
    }
    cudaGraph_t graph = NULL;
    if (v->timing == CAPTURED)
        CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK_BLAS(call(h, v, pa, dA, la.ld, la.stride, dB, lb.ld, lb.stride, pb, dC, lc.ld, lc.stride));
    if (v->timing == CAPTURED) {
        CHECK_CUDA(cudaStreamEndCapture(s, &graph));
        CHECK_CUDA(cudaMemcpy(hC, dC, lc.total * es, cudaMemcpyDeviceToHost));
        if (memcmp(hC, hC0, lc.total * es) != 0) {
            fprintf(stderr, "%s: the captured GEMM ran before its graph was launched\n", v->name);
            exit(1);
        }
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        CHECK_CUDA(cudaGraphLaunch(exec, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_CUDA(cudaGraphExecDestroy(exec));
        CHECK_CUDA(cudaGraphDestroy(graph));
    }
    union scalar used_alpha = alpha;
    if (v->timing == HOST_CHANGED)
        alpha = wrong;          /* the queued GEMM must have copied the old value */
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    CHECK_CUDA(cudaMemcpy(hC, dC, lc.total * es, cudaMemcpyDeviceToHost));

    /* Compare with a double reference and with the fixed-order sum. */
    double maxdiff = 0;
    long long inexact = 0, pad = 0;
    char *touched = calloc(lc.total, 1);
    const double a_used = dbl ? used_alpha.d : used_alpha.f;
    for (int b = 0; b < v->batch; b++)
        for (int j = 0; j < v->n; j++)
            for (int i = 0; i < v->m; i++) {
                long long ci = b * lc.stride + i + (long long)j * lc.ld;
                touched[ci] = 1;
                double c0 = get(hC0, dbl, ci), got = get(hC, dbl, ci);
                long double sum = 0;    /* the straightforward reference, in extended precision */
                float fs = 0.0f;
                double ds = 0.0;
                for (int l = 0; l < v->k; l++) {
                    double x = op_at(hA, dbl, &la, b * la.stride, ta, i, l);
                    double y = op_at(hB, dbl, &lb, b * lb.stride, tb, l, j);
                    sum += (long double)x * y;
                    fs += (float)x * (float)y;
                    ds += x * y;
                }
                long double ref = a_used * sum + (v->beta == 0 ? 0 : (long double)v->beta * c0);
                double diff = (double)fabsl(got - ref);
                if (!isnan(maxdiff) && !(diff <= maxdiff))
                    maxdiff = diff; /* a NaN sticks */
                int same;
                if (dbl) {
                    /* alpha == 0 reads neither A nor B (BLAS) */
                    double want = a_used == 0 ? (v->beta == 0 ? 0 : v->beta * c0)
                                              : v->beta == 0 ? a_used * ds : a_used * ds + v->beta * c0;
                    double g = got;
                    same = memcmp(&want, &g, sizeof want) == 0;
                } else {
                    float fa = (float)a_used, fb = (float)v->beta, fc0 = (float)c0;
                    float want = fa == 0 ? (fb == 0 ? 0.0f : fb * fc0)
                                         : fb == 0 ? fa * fs : fa * fs + fb * fc0;
                    float g = (float)got;
                    same = memcmp(&want, &g, sizeof want) == 0;
                }
                inexact += !same;
            }
    for (long long i = 0; i < lc.total; i++)
        if (!touched[i] && memcmp((char *)hC + i * es, (char *)hC0 + i * es, es) != 0)
            pad++;
    printf("VARIANT %s hash=%016llx maxdiff=%.3e exact=%lld pad=%lld\n", v->name,
           (unsigned long long)fnv1a(FNV_START, hC, lc.total * es), maxdiff, inexact, pad);

    free(touched);
    free(hA);
    free(hB);
    free(hC0);
    free(hC);
    CHECK_CUDA(cudaFree(dA));
    CHECK_CUDA(cudaFree(dB));
    CHECK_CUDA(cudaFree(dC));
    if (dScalars)
        CHECK_CUDA(cudaFree(dScalars));
    if (pinned)
        CHECK_CUDA(cudaFreeHost(pinned));
}

/* ---- argument errors and settings ----------------------------------------------- */

static void status(const char *name, cublasStatus_t s)
{
    printf("STATUS %s %d\n", name, (int)s);
}

static void errors(cublasHandle_t h)
{
    float *dA, *dB, *dC, alpha = 1, beta = 0, *hostA = malloc(64 * 64 * sizeof(float));
    double *dD;
    CHECK_CUDA(cudaMalloc((void **)&dA, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&dB, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&dC, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&dD, 64 * 64 * sizeof(double)));
    CHECK_BLAS(cublasSetStream(h, 0));

    status("valid_sgemm", cublasSgemm(h, N, N, 8, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("null_handle", cublasSgemm(NULL, N, N, 8, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    cublasHandle_t gone;
    CHECK_BLAS(cublasCreate(&gone));
    CHECK_BLAS(cublasDestroy(gone));
    status("destroyed_handle", cublasSgemm(gone, N, N, 8, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("destroyed_handle_set_stream", cublasSetStream(gone, 0));
    status("destroy_twice", cublasDestroy(gone));
    status("create_null", cublasCreate(NULL));
    status("negative_m", cublasSgemm(h, N, N, -1, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("negative_n", cublasSgemm(h, N, N, 8, -1, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("negative_k", cublasSgemm(h, N, N, 8, 8, -1, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("lda_below_m_N", cublasSgemm(h, N, N, 8, 8, 8, &alpha, dA, 7, dB, 8, &beta, dC, 8));
    status("lda_5_N_m4_k6", cublasSgemm(h, N, N, 4, 8, 6, &alpha, dA, 5, dB, 6, &beta, dC, 4));
    status("lda_5_T_m4_k6", cublasSgemm(h, T, N, 4, 8, 6, &alpha, dA, 5, dB, 6, &beta, dC, 4));
    status("ldb_below_k_N", cublasSgemm(h, N, N, 8, 8, 8, &alpha, dA, 8, dB, 7, &beta, dC, 8));
    status("ldb_below_n_T", cublasSgemm(h, N, T, 8, 9, 4, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("ldc_below_m", cublasSgemm(h, N, N, 8, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 7));
    status("lda_zero_m0", cublasSgemm(h, N, N, 0, 8, 8, &alpha, dA, 0, dB, 8, &beta, dC, 1));
    status("bad_transa", cublasSgemm(h, CUBLAS_OP_CONJG, N, 8, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("bad_transb", cublasSgemm(h, N, (cublasOperation_t)7, 8, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    status("null_alpha", cublasSgemm(h, N, N, 8, 8, 8, NULL, dA, 8, dB, 8, &beta, dC, 8));
    status("m_zero_null_matrices", cublasSgemm(h, N, N, 0, 8, 8, &alpha, NULL, 1, NULL, 8, &beta, NULL, 1));
    status("host_memory_A", cublasSgemm(h, N, N, 8, 8, 8, &alpha, hostA, 8, dB, 8, &beta, dC, 8));
    status("A_past_end", cublasSgemm(h, N, N, 8, 8, 8, &alpha, dA, 1000, dB, 8, &beta, dC, 8));
    status("C_past_end", cublasSgemm(h, N, N, 64, 65, 8, &alpha, dA, 64, dB, 8, &beta, dC, 64));
    status("negative_batch", cublasSgemmStridedBatched(h, N, N, 8, 8, 8, &alpha, dA, 8, 64, dB, 8, 64,
                                                       &beta, dC, 8, 64, -1));
    status("batch_past_end", cublasSgemmStridedBatched(h, N, N, 8, 8, 8, &alpha, dA, 8, 64, dB, 8, 64,
                                                       &beta, dC, 8, 2048, 3));
    status("batch_zero", cublasSgemmStridedBatched(h, N, N, 8, 8, 8, &alpha, dA, 8, 64, dB, 8, 64,
                                                   &beta, dC, 8, 64, 0));
    CHECK_BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
    status("device_mode_host_alpha", cublasSgemm(h, N, N, 8, 8, 8, &alpha, dA, 8, dB, 8, &beta, dC, 8));
    CHECK_BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));

    double dalpha = 1, dbeta = 0;
    status("ex_valid_32f", cublasGemmEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_32F, 8, dB, CUDA_R_32F, 8,
                                        &beta, dC, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    status("ex_r16f", cublasGemmEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_16F, 8, dB, CUDA_R_16F, 8, &beta,
                                   dC, CUDA_R_16F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    status("ex_bf16_in_32f_out", cublasGemmEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_16BF, 8, dB, CUDA_R_16BF,
                                              8, &beta, dC, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
    status("ex_mixed_32f_64f", cublasGemmEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_32F, 8, dB, CUDA_R_32F, 8,
                                            &beta, dD, CUDA_R_64F, 8, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
    status("ex_32f_compute_64f", cublasGemmEx(h, N, N, 8, 8, 8, &dalpha, dA, CUDA_R_32F, 8, dB, CUDA_R_32F,
                                              8, &dbeta, dC, CUDA_R_32F, 8, CUBLAS_COMPUTE_64F,
                                              CUBLAS_GEMM_DEFAULT));
    status("ex_64f_compute_32f", cublasGemmEx(h, N, N, 8, 8, 8, &alpha, dD, CUDA_R_64F, 8, dD, CUDA_R_64F, 8,
                                              &beta, dD, CUDA_R_64F, 8, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
    status("ex_compute_32i", cublasGemmEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_32F, 8, dB, CUDA_R_32F, 8,
                                          &beta, dC, CUDA_R_32F, 8, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
    status("ex_complex_32f", cublasGemmEx(h, N, N, 4, 4, 4, &alpha, dA, CUDA_C_32F, 4, dB, CUDA_C_32F, 4,
                                          &beta, dC, CUDA_C_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    status("ex_bad_algo", cublasGemmEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_32F, 8, dB, CUDA_R_32F, 8, &beta,
                                       dC, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, (cublasGemmAlgo_t)12345));
    status("ex_null_handle", cublasGemmEx(NULL, N, N, 8, 8, 8, &alpha, dA, CUDA_R_32F, 8, dB, CUDA_R_32F, 8,
                                          &beta, dC, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    status("ex_batched_r16f", cublasGemmStridedBatchedEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_16F, 8, 64, dB,
                                                         CUDA_R_16F, 8, 64, &beta, dC, CUDA_R_16F, 8, 64, 2,
                                                         CUBLAS_COMPUTE_16F, CUBLAS_GEMM_DEFAULT));
    status("ex_batched_negative_batch", cublasGemmStridedBatchedEx(h, N, N, 8, 8, 8, &alpha, dA, CUDA_R_32F,
                                                                   8, 64, dB, CUDA_R_32F, 8, 64, &beta, dC,
                                                                   CUDA_R_32F, 8, 64, -2, CUBLAS_COMPUTE_32F,
                                                                   CUBLAS_GEMM_DEFAULT));
    status("dgemm_batched_lda_small", cublasDgemmStridedBatched(h, T, N, 8, 8, 8, &dalpha, dD, 7, 64, dD, 8,
                                                                64, &dbeta, dD, 8, 64, 1));

    /* settings */
    int version = 0;
    status("get_version", cublasGetVersion(h, &version));
    printf("INFO version %d\n", version);
    status("get_version_null", cublasGetVersion(h, NULL));
    cudaStream_t s, got;
    CHECK_CUDA(cudaStreamCreate(&s));
    status("set_stream", cublasSetStream(h, s));
    status("get_stream", cublasGetStream(h, &got));
    printf("INFO get_stream_matches %d\n", got == s);
    status("get_stream_null", cublasGetStream(h, NULL));
    CHECK_BLAS(cublasSetStream(h, 0));
    CHECK_CUDA(cudaStreamDestroy(s));
    cublasPointerMode_t pm;
    status("set_pointer_mode_device", cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
    status("get_pointer_mode", cublasGetPointerMode(h, &pm));
    printf("INFO pointer_mode %d\n", (int)pm);
    status("set_pointer_mode_bad", cublasSetPointerMode(h, (cublasPointerMode_t)5));
    status("set_pointer_mode_host", cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    cublasMath_t mm;
    status("set_math_mode_tf32", cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
    status("get_math_mode", cublasGetMathMode(h, &mm));
    printf("INFO math_mode %d\n", (int)mm);
    status("set_math_mode_bad", cublasSetMathMode(h, (cublasMath_t)5));
    status("set_math_mode_default", cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    status("set_workspace", cublasSetWorkspace(h, dD, 64 * 64 * sizeof(double)));
    status("get_math_mode_null_handle", cublasGetMathMode(NULL, &mm));
    printf("INFO status_name_7 %s\n", cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE));
    printf("INFO status_name_15 %s\n", cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED));
    printf("INFO status_string_1 %s\n", cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED));

    CHECK_CUDA(cudaDeviceSynchronize());
    free(hostA);
    CHECK_CUDA(cudaFree(dA));
    CHECK_CUDA(cudaFree(dB));
    CHECK_CUDA(cudaFree(dC));
    CHECK_CUDA(cudaFree(dD));
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "all";
    cublasHandle_t h;
    CHECK_BLAS(cublasCreate(&h));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    if (!strcmp(what, "all") || !strcmp(what, "gemm"))
        for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
            run_variant(h, stream, &variants[i]);
    if (!strcmp(what, "all") || !strcmp(what, "errors"))
        errors(h);
    CHECK_CUDA(cudaStreamDestroy(stream));
    CHECK_BLAS(cublasDestroy(h));
    printf("DONE\n");
    return 0;
}
