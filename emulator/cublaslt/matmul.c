/* matmul.c -- cublasLtMatmul and cublasLtMatmulAlgoGetHeuristic.
 *
 * Both validate the descriptors the same way (plan()); the heuristic then
 * offers the emulator's one algorithm, and cublasLtMatmul checks the
 * pointers, copies what it needs and queues one job on the given stream
 * (stream 0: the legacy default stream, as in the runtime).  In
 * CUBLASLT_POINTER_MODE_HOST alpha and beta are copied now; in
 * CUBLASLT_POINTER_MODE_DEVICE the job reads them when it runs.
 *
 * Supported: A, B, C, D all CUDA_R_32F with scale type CUDA_R_32F and
 * compute type CUBLAS_COMPUTE_32F (its _PEDANTIC, _FAST_TF32, _FAST_16F,
 * _FAST_16BF and _EMULATED_16BFX9 variants are computed in full FP32), or all
 * CUDA_R_64F with scale type CUDA_R_64F and CUBLAS_COMPUTE_64F (and
 * _PEDANTIC, _EMULATED_FIXEDPOINT); column-major order, strided batches; the
 * epilogues DEFAULT, RELU, BIAS, RELU_BIAS, GELU and GELU_BIAS (bias of D's
 * type, BIAS_BATCH_STRIDE per batch).
 *
 * Statuses: NULL handle -> NOT_INITIALIZED (any other handle, a cuBLAS one
 * included, is accepted and not read).  NULL or destroyed descriptors,
 * inconsistent dimensions (op(A) m x k, op(B) k x n, C and D m x n), a
 * leading dimension below max(1, rows), batch counts that differ or are
 * below 1, an operation other than N/T/C, NULL alpha or beta, C == D with a
 * different layout, a bias epilogue without a bias pointer, a scale or amax
 * pointer (documented: INVALID_VALUE for types that do not support them), an
 * algo that the heuristic did not return, pointers that are not emulated
 * device memory or whose matrices run past their allocation ->
 * INVALID_VALUE.  Other types, orders, batch modes, pointer modes,
 * epilogues, TRANSC or FILL_MODE other than the default, per-batch
 * alpha/beta strides, dimensions beyond int32 -> NOT_SUPPORTED.  A failed
 * device or a stream the work cannot be queued on -> EXECUTION_FAILED.
 * Attributes that cannot change a float result (SM_COUNT_TARGET,
 * FAST_ACCUM, BATCH_INVARIANCE_FLAGS, the scale modes, the emulation
 * descriptor, AUX settings without an AUX epilogue, the preference's
 * alignments and workspace) are accepted and ignored. */

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* N -> 0, T and C (conjugate transpose = transpose for real types) -> 1. */
static int parse_op(int32_t op, int *trans)
{
    switch (op) {
    case CUBLAS_OP_N: *trans = 0; return 1;
    case CUBLAS_OP_T:
    case CUBLAS_OP_C: *trans = 1; return 1;
    default: return 0;
    }
}

/* The element type of a supported type combination, or -1. */
static int matmul_type(const struct lt_matmul_desc *d, const struct lt_layout *const l[4])
{
    uint32_t t = l[0]->type;
    for (int i = 1; i < 4; i++)
        if (l[i]->type != t)
            return -1;
    if (t == CUDA_R_32F && d->scale_type == CUDA_R_32F) {
        switch (d->compute_type) {
        case CUBLAS_COMPUTE_32F:
        case CUBLAS_COMPUTE_32F_PEDANTIC:
        case CUBLAS_COMPUTE_32F_FAST_16F:
        case CUBLAS_COMPUTE_32F_FAST_16BF:
        case CUBLAS_COMPUTE_32F_FAST_TF32:
        case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
            return LT_F32;
        default:
            return -1;
        }
    }
    if (t == CUDA_R_64F && d->scale_type == CUDA_R_64F) {
        switch (d->compute_type) {
        case CUBLAS_COMPUTE_64F:
        case CUBLAS_COMPUTE_64F_PEDANTIC:
        case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT:
            return LT_F64;
        default:
            return -1;
        }
    }
    return -1;
}

static long long max1(long long v)
{
    return v > 1 ? v : 1;
}

/* Validates the descriptors and fills everything of `jb` but the matrix
 * pointers and the scalars (device_scalars says which pointer mode). */
static cublasStatus_t plan(const char *api, cublasLtMatmulDesc_t computeDesc,
                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                           struct lt_job *jb)
{
    static const char names[4] = {'A', 'B', 'C', 'D'};
    const struct lt_matmul_desc *d = lt_matmul_desc(computeDesc);
    const struct lt_layout *l[4] = {lt_layout(Adesc), lt_layout(Bdesc), lt_layout(Cdesc),
                                    lt_layout(Ddesc)};
    if (!d)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "computeDesc %p is NULL or destroyed",
                         (void *)computeDesc);
    for (int i = 0; i < 4; i++)
        if (!l[i])
            return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "%cdesc is NULL or destroyed", names[i]);

    int type = matmul_type(d, l);
    if (type < 0)
        return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                         "types A %u, B %u, C %u, D %u, scale %d, compute %d: the emulator implements "
                         "only all CUDA_R_32F (compute 32F) and all CUDA_R_64F (compute 64F)",
                         l[0]->type, l[1]->type, l[2]->type, l[3]->type, (int)d->scale_type,
                         (int)d->compute_type);
    for (int i = 0; i < 4; i++) {
        if (l[i]->order != CUBLASLT_ORDER_COL)
            return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                             "%cdesc order %d: only CUBLASLT_ORDER_COL is implemented", names[i],
                             (int)l[i]->order);
        if (l[i]->batch_mode != CUBLASLT_BATCH_MODE_STRIDED || l[i]->plane_offset != 0)
            return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                             "%cdesc: batch mode %u / plane offset %lld: only strided batches of "
                             "real matrices are implemented", names[i], l[i]->batch_mode,
                             (long long)l[i]->plane_offset);
        if (l[i]->rows > INT_MAX || l[i]->cols > INT_MAX)
            return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api, "%cdesc: %llu x %llu is beyond int32",
                             names[i], (unsigned long long)l[i]->rows,
                             (unsigned long long)l[i]->cols);
    }
    int ta, tb;
    if (!parse_op(d->transa, &ta) || !parse_op(d->transb, &tb))
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "transa %d / transb %d: not N, T or C",
                         (int)d->transa, (int)d->transb);
    if (d->transc != CUBLAS_OP_N || d->fill_mode != CUBLAS_FILL_MODE_FULL)
        return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api, "transc %d / fill mode %d: only N / FULL",
                         (int)d->transc, (int)d->fill_mode);
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST && d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
        return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                         "pointer mode %d: only CUBLASLT_POINTER_MODE_HOST and _DEVICE are implemented",
                         (int)d->pointer_mode);
    int relu = 0, gelu = 0, bias = 0;
    switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_RELU: relu = 1; break;
    case CUBLASLT_EPILOGUE_BIAS: bias = 1; break;
    case CUBLASLT_EPILOGUE_RELU_BIAS: relu = bias = 1; break;
    case CUBLASLT_EPILOGUE_GELU: gelu = 1; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: gelu = bias = 1; break;
    default:
        return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                         "epilogue %u: only DEFAULT, RELU, BIAS, RELU_BIAS, GELU and GELU_BIAS are "
                         "implemented", d->epilogue);
    }
    if (bias && d->bias_data_type != -1 && (uint32_t)d->bias_data_type != l[3]->type)
        return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api, "bias data type %d differs from D's %u",
                         (int)d->bias_data_type, l[3]->type);
    if (d->a_scale || d->b_scale || d->c_scale || d->d_scale || d->amax_d || d->d_out_scale ||
        d->aux_scale || d->aux_amax)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "scale or amax pointers are set: not supported for FP32/FP64 matmuls");
    if (d->alpha_batch_stride || d->beta_batch_stride)
        return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api, "per-batch alpha/beta strides are not "
                         "implemented");

    /* op(A) is m x k, stored as m x k (N) or k x m (T); op(B) is k x n. */
    long long m = (long long)l[3]->rows, n = (long long)l[3]->cols;
    long long k = ta ? (long long)l[0]->rows : (long long)l[0]->cols;
    long long a_m = ta ? (long long)l[0]->cols : (long long)l[0]->rows;
    long long b_k = tb ? (long long)l[1]->cols : (long long)l[1]->rows;
    long long b_n = tb ? (long long)l[1]->rows : (long long)l[1]->cols;
    if (a_m != m || b_k != k || b_n != n || (long long)l[2]->rows != m || (long long)l[2]->cols != n)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "inconsistent dimensions: op(A) %lld x %lld, op(B) %lld x %lld, C %llu x "
                         "%llu, D %lld x %lld", a_m, k, b_k, b_n, (unsigned long long)l[2]->rows,
                         (unsigned long long)l[2]->cols, m, n);
    for (int i = 0; i < 4; i++) {
        if (l[i]->ld < max1((long long)l[i]->rows))
            return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                             "%cdesc: leading dimension %lld below max(1, rows %llu)", names[i],
                             (long long)l[i]->ld, (unsigned long long)l[i]->rows);
        if (l[i]->batch_count < 1 || l[i]->batch_count != l[3]->batch_count)
            return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                             "%cdesc: batch count %d (D's is %d): must be at least 1 and equal",
                             names[i], (int)l[i]->batch_count, (int)l[3]->batch_count);
    }

    memset(jb, 0, sizeof *jb);
    jb->type = (enum lt_type)type;
    jb->transa = ta;
    jb->transb = tb;
    jb->m = m;
    jb->n = n;
    jb->k = k;
    jb->lda = l[0]->ld;
    jb->ldb = l[1]->ld;
    jb->ldc = l[2]->ld;
    jb->ldd = l[3]->ld;
    jb->stride_a = l[0]->batch_stride;
    jb->stride_b = l[1]->batch_stride;
    jb->stride_c = l[2]->batch_stride;
    jb->stride_d = l[3]->batch_stride;
    jb->batch = l[3]->batch_count;
    jb->relu = relu;
    jb->gelu = gelu;
    jb->bias = bias ? d->bias : NULL;
    jb->bias_stride = d->bias_batch_stride;
    jb->device_scalars = d->pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- heuristic -------------------------------------------------------------- */

/* What the one algorithm is, for CUBLASLT_MATMUL_PREF_IMPL_MASK: plain
 * multiply-adds (no tensor cores) with accumulator and inputs of the data type. */
static uint64_t impl_flags(enum lt_type type)
{
    return CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA |
           (type == LT_F32 ? CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F
                           : CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_64F | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_64F);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount)
{
    static const char api[] = "cublasLtMatmulAlgoGetHeuristic";
    if (!lightHandle)
        return lt_report(CUBLAS_STATUS_NOT_INITIALIZED, api, "lightHandle is NULL");
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "requestedAlgoCount %d, heuristicResultsArray %p, returnAlgoCount %p",
                         requestedAlgoCount, (void *)heuristicResultsArray, (void *)returnAlgoCount);
    *returnAlgoCount = 0;
    const struct lt_pref *p = lt_pref(preference);
    if (preference && !p)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "preference %p is destroyed",
                         (void *)preference);
    struct lt_job jb;
    cublasStatus_t s = plan(api, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &jb);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (p) {
        uint64_t flags = impl_flags(jb.type);
        if ((flags & p->impl_mask) != flags)
            return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                             "the implementation mask %#llx excludes the emulator's algorithm (%#llx)",
                             (unsigned long long)p->impl_mask, (unsigned long long)flags);
        if (p->max_waves_count > 0.0f && p->max_waves_count < 1.0f)
            return lt_report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                             "max waves count %g is below the algorithm's 1.0", p->max_waves_count);
    }
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof *r);
    r->algo.data[0] = LT_ALGO_MAGIC;
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- matmul ------------------------------------------------------------------ */

/* The elements that `batch` matrices of rows x cols (leading dimension ld,
 * `stride` elements apart) span must all lie in one allocation of the
 * emulated device. */
static cublasStatus_t check_matrix(const char *api, const char *what, const void *p, long long rows,
                                   long long cols, long long ld, long long stride, int batch,
                                   size_t es)
{
    if (rows == 0 || cols == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    long long extent, span, bytes;
    if (__builtin_mul_overflow(cols - 1, ld, &extent) || __builtin_add_overflow(extent, rows, &extent) ||
        __builtin_mul_overflow((long long)(batch - 1), stride, &span))
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "matrix %s is too large", what);
    long long lo = span < 0 ? span : 0;
    long long hi;
    if (__builtin_add_overflow(span > 0 ? span : 0, extent, &hi) ||
        __builtin_mul_overflow(hi - lo, (long long)es, &bytes))
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "matrix %s is too large", what);
    if (jitckpt_simdev_check_range(p, 1) != cudaSuccess)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "%s %p is not memory of the emulated device (allocate it with cudaMalloc)",
                         what, p);
    const char *start = (const char *)p + lo * (long long)es;
    if (jitckpt_simdev_check_range(start, (size_t)bytes) != cudaSuccess)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "%s %p: %lld x %lld (leading dimension %lld, %d batch(es) %lld elements "
                         "apart) runs past the end of its allocation", what, p, rows, cols, ld,
                         batch, stride);
    return CUBLAS_STATUS_SUCCESS;
}

static int scalar_is_zero(enum lt_type type, union lt_scalar s)
{
    return type == LT_F32 ? s.f == 0.0f : s.d == 0.0;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                           const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                           const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                           void *workspace, size_t workspaceSizeInBytes,
                                           cudaStream_t stream)
{
    static const char api[] = "cublasLtMatmul";
    if (!lightHandle)
        return lt_report(CUBLAS_STATUS_NOT_INITIALIZED, api, "lightHandle is NULL");
    struct lt_job plan_job;
    cublasStatus_t s = plan(api, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &plan_job);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (!alpha || !beta)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "alpha %p / beta %p is NULL", alpha, beta);
    if (algo) {
        int ours = algo->data[0] == LT_ALGO_MAGIC;
        for (int i = 1; i < 8; i++)
            ours &= algo->data[i] == 0;
        if (!ours)
            return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                             "algo %p was not returned by cublasLtMatmulAlgoGetHeuristic", (void *)algo);
    }
    if (C == D && (plan_job.ldc != plan_job.ldd || (plan_job.batch > 1 && plan_job.stride_c != plan_job.stride_d)))
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "in place (C == D) needs the same layout: ldc %lld / ldd %lld, strides %lld / %lld",
                         plan_job.ldc, plan_job.ldd, plan_job.stride_c, plan_job.stride_d);
    if (plan_job.bias == NULL && (lt_matmul_desc(computeDesc)->epilogue & CUBLASLT_EPILOGUE_BIAS))
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "the epilogue adds a bias but CUBLASLT_MATMUL_DESC_BIAS_POINTER is NULL");
    if (plan_job.m == 0 || plan_job.n == 0)
        return CUBLAS_STATUS_SUCCESS;

    struct lt_job *jb = malloc(sizeof *jb);
    if (!jb)
        return lt_report(CUBLAS_STATUS_ALLOC_FAILED, api, "out of memory");
    *jb = plan_job;
    jb->A = A;
    jb->B = B;
    jb->C = C;
    jb->D = D;
    size_t es = jb->type == LT_F32 ? sizeof(float) : sizeof(double);
    int reads_ab = 1, reads_c = 1;
    if (jb->device_scalars) {
        jb->alpha_ptr = alpha;
        jb->beta_ptr = beta;
        if (jitckpt_simdev_check_range(alpha, es) != cudaSuccess ||
            jitckpt_simdev_check_range(beta, es) != cudaSuccess) {
            free(jb);
            return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                             "device pointer mode: alpha %p / beta %p is not memory of the emulated "
                             "device", alpha, beta);
        }
    } else {
        memcpy(&jb->alpha, alpha, es);
        memcpy(&jb->beta, beta, es);
        reads_ab = !scalar_is_zero(jb->type, jb->alpha);
        reads_c = !scalar_is_zero(jb->type, jb->beta);
    }

    int dev = jitckpt_simdev_current_device();
    cudaError_t derr = jitckpt_simdev_device_error(dev);
    if (derr != cudaSuccess) {
        free(jb);
        return lt_report(CUBLAS_STATUS_EXECUTION_FAILED, api, "device %d failed (cuda error %d)", dev,
                         (int)derr);
    }
    long long a_rows = jb->transa ? jb->k : jb->m, a_cols = jb->transa ? jb->m : jb->k;
    long long b_rows = jb->transb ? jb->n : jb->k, b_cols = jb->transb ? jb->k : jb->n;
    if ((reads_ab &&
         ((s = check_matrix(api, "A", A, a_rows, a_cols, jb->lda, jb->stride_a, jb->batch, es)) !=
              CUBLAS_STATUS_SUCCESS ||
          (s = check_matrix(api, "B", B, b_rows, b_cols, jb->ldb, jb->stride_b, jb->batch, es)) !=
              CUBLAS_STATUS_SUCCESS)) ||
        (reads_c &&
         (s = check_matrix(api, "C", C, jb->m, jb->n, jb->ldc, jb->stride_c, jb->batch, es)) !=
             CUBLAS_STATUS_SUCCESS) ||
        (s = check_matrix(api, "D", D, jb->m, jb->n, jb->ldd, jb->stride_d, jb->batch, es)) !=
            CUBLAS_STATUS_SUCCESS ||
        (jb->bias &&
         (s = check_matrix(api, "bias", jb->bias, jb->m, 1, jb->m, jb->bias_stride, jb->batch, es)) !=
             CUBLAS_STATUS_SUCCESS)) {
        free(jb);
        return s;
    }
    /* On failure the enqueue has released (freed) the job. */
    cudaError_t e = jitckpt_simdev_enqueue(stream, api, lt_job_run, jb, lt_job_release);
    if (e != cudaSuccess)
        return lt_report(CUBLAS_STATUS_EXECUTION_FAILED, api,
                         "cannot queue the work on stream %p (cuda error %d)", (void *)stream, (int)e);
    return CUBLAS_STATUS_SUCCESS;
}
