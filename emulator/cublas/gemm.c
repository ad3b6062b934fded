/* gemm.c -- the GEMM entry points: cublas{S,D}gemm_v2,
 * cublas{S,D}gemmStridedBatched, cublasGemmEx and cublasGemmStridedBatchedEx.
 *
 * Each call validates its arguments as cuBLAS does, checks that the matrices
 * (and, in device pointer mode, alpha and beta) are memory of the emulated
 * device, and queues one job on the handle's stream (stream 0: the legacy
 * default stream, as in the runtime).  In host pointer mode alpha and beta
 * are copied now; in device pointer mode the job reads them when it runs.
 *
 * Statuses: a NULL or destroyed handle is NOT_INITIALIZED; bad dimensions,
 * leading dimensions, operations, batch counts or algorithms, NULL scalars,
 * and pointers that are not emulated device memory or whose matrix runs past
 * the end of its allocation are INVALID_VALUE (with a message on stderr: a
 * GPU would fault in the kernel instead); a type combination other than
 * all-FP32 (compute 32F and its fast/pedantic variants) or all-FP64 (compute
 * 64F) is NOT_SUPPORTED; a device that already failed, or a stream the work
 * cannot be queued on, is EXECUTION_FAILED. */

#include <stdlib.h>

#include "internal.h"

/* N -> 0, T and C (conjugate transpose = transpose for real types) -> 1. */
static int parse_op(cublasOperation_t op, int *trans)
{
    switch (op) {
    case CUBLAS_OP_N: *trans = 0; return 1;
    case CUBLAS_OP_T:
    case CUBLAS_OP_C: *trans = 1; return 1;
    default: return 0;
    }
}

static long long max1(long long v)
{
    return v > 1 ? v : 1;
}

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
        return report(CUBLAS_STATUS_INVALID_VALUE, api, "matrix %s is too large", what);
    long long lo = span < 0 ? span : 0;
    long long hi;
    if (__builtin_add_overflow(span > 0 ? span : 0, extent, &hi) ||
        __builtin_mul_overflow(hi - lo, (long long)es, &bytes))
        return report(CUBLAS_STATUS_INVALID_VALUE, api, "matrix %s is too large", what);
    if (jitckpt_simdev_check_range(p, 1) != cudaSuccess)
        return report(CUBLAS_STATUS_INVALID_VALUE, api,
                      "%s %p is not memory of the emulated device (allocate it with cudaMalloc)",
                      what, p);
    const char *start = (const char *)p + lo * (long long)es;
    if (jitckpt_simdev_check_range(start, (size_t)bytes) != cudaSuccess)
        return report(CUBLAS_STATUS_INVALID_VALUE, api,
                      "%s %p: %lld x %lld (leading dimension %lld, %d batch(es) %lld elements "
                      "apart) runs past the end of its allocation", what, p, rows, cols, ld, batch,
                      stride);
    return CUBLAS_STATUS_SUCCESS;
}

static int scalar_is(enum gemm_type type, union scalar s, double v)
{
    return type == GEMM_F32 ? s.f == (float)v : s.d == v;
}

static cublasStatus_t submit_gemm(const char *api, cublasHandle_t handle, enum gemm_type type,
                                  cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                  int k, const void *alpha, const void *A, int lda,
                                  long long strideA, const void *B, int ldb, long long strideB,
                                  const void *beta, void *C, int ldc, long long strideC,
                                  int batchCount)
{
    struct handle_state st;
    cublasStatus_t s = handle_state(handle, &st);
    if (s != CUBLAS_STATUS_SUCCESS)
        return report(s, api, "handle %p is not a live cuBLAS handle (create it with "
                      "cublasCreate_v2)", (void *)handle);
    int ta, tb;
    if (!parse_op(transa, &ta) || !parse_op(transb, &tb))
        return report(CUBLAS_STATUS_INVALID_VALUE, api, "transa %d / transb %d: not N, T or C",
                      (int)transa, (int)transb);
    if (m < 0 || n < 0 || k < 0 || batchCount < 0)
        return report(CUBLAS_STATUS_INVALID_VALUE, api, "m=%d n=%d k=%d batchCount=%d: negative",
                      m, n, k, batchCount);
    /* op(A) is m x k, stored as m x k (N) or k x m (T); op(B) is k x n. */
    long long a_rows = ta ? k : m, a_cols = ta ? m : k;
    long long b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (lda < max1(a_rows) || ldb < max1(b_rows) || ldc < max1(m))
        return report(CUBLAS_STATUS_INVALID_VALUE, api,
                      "lda=%d ldb=%d ldc=%d: must be at least max(1, %lld), max(1, %lld), "
                      "max(1, %d)", lda, ldb, ldc, a_rows, b_rows, m);
    size_t es = type == GEMM_F32 ? sizeof(float) : sizeof(double);
    int device_scalars = st.pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
    if (!alpha || !beta)
        return report(CUBLAS_STATUS_INVALID_VALUE, api, "alpha %p / beta %p is NULL", alpha, beta);
    if (m == 0 || n == 0 || batchCount == 0)
        return CUBLAS_STATUS_SUCCESS;

    struct gemm_job *jb = calloc(1, sizeof *jb);
    if (!jb)
        return report(CUBLAS_STATUS_ALLOC_FAILED, api, "out of memory");
    jb->type = type;
    jb->transa = ta;
    jb->transb = tb;
    jb->m = m;
    jb->n = n;
    jb->k = k;
    jb->A = A;
    jb->B = B;
    jb->C = C;
    jb->lda = lda;
    jb->ldb = ldb;
    jb->ldc = ldc;
    jb->stride_a = strideA;
    jb->stride_b = strideB;
    jb->stride_c = strideC;
    jb->batch = batchCount;
    jb->device_scalars = device_scalars;
    int reads_ab = 1;
    if (device_scalars) {
        jb->alpha_ptr = alpha;
        jb->beta_ptr = beta;
        if (jitckpt_simdev_check_range(alpha, es) != cudaSuccess ||
            jitckpt_simdev_check_range(beta, es) != cudaSuccess) {
            free(jb);
            return report(CUBLAS_STATUS_INVALID_VALUE, api,
                          "device pointer mode: alpha %p / beta %p is not memory of the emulated "
                          "device", alpha, beta);
        }
    } else {
        if (type == GEMM_F32) {
            jb->alpha.f = *(const float *)alpha;
            jb->beta.f = *(const float *)beta;
        } else {
            jb->alpha.d = *(const double *)alpha;
            jb->beta.d = *(const double *)beta;
        }
        int alpha0 = scalar_is(type, jb->alpha, 0.0);
        if ((alpha0 || k == 0) && scalar_is(type, jb->beta, 1.0)) {   /* C unchanged (BLAS) */
            free(jb);
            return CUBLAS_STATUS_SUCCESS;
        }
        reads_ab = !alpha0;
    }

    int dev = st.device;
    cudaError_t derr = jitckpt_simdev_device_error(dev);
    if (derr != cudaSuccess) {
        free(jb);
        return report(CUBLAS_STATUS_EXECUTION_FAILED, api, "device %d failed (cuda error %d)", dev,
                      (int)derr);
    }
    if (reads_ab &&
        ((s = check_matrix(api, "A", A, a_rows, a_cols, lda, strideA, batchCount, es)) !=
             CUBLAS_STATUS_SUCCESS ||
         (s = check_matrix(api, "B", B, b_rows, b_cols, ldb, strideB, batchCount, es)) !=
             CUBLAS_STATUS_SUCCESS)) {
        free(jb);
        return s;
    }
    if ((s = check_matrix(api, "C", C, m, n, ldc, strideC, batchCount, es)) != CUBLAS_STATUS_SUCCESS) {
        free(jb);
        return s;
    }
    /* On failure the enqueue has released (freed) the job. */
    cudaError_t e = jitckpt_simdev_enqueue(st.stream, api, gemm_run, jb, gemm_release);
    if (e != cudaSuccess)
        return report(CUBLAS_STATUS_EXECUTION_FAILED, api,
                      "cannot queue the work on stream %p (cuda error %d)", (void *)st.stream,
                      (int)e);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- typed entry points ---------------------------------------------------- */

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float *alpha, const float *A, int lda,
                                           const float *B, int ldb, const float *beta, float *C,
                                           int ldc)
{
    return submit_gemm("cublasSgemm_v2", handle, GEMM_F32, transa, transb, m, n, k, alpha, A, lda,
                       0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t CUBLASWINAPI cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const double *alpha, const double *A, int lda,
                                           const double *B, int ldb, const double *beta, double *C,
                                           int ldc)
{
    return submit_gemm("cublasDgemm_v2", handle, GEMM_F64, transa, transb, m, n, k, alpha, A, lda,
                       0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float *alpha, const float *A, int lda, long long int strideA, const float *B, int ldb,
    long long int strideB, const float *beta, float *C, int ldc, long long int strideC,
    int batchCount)
{
    return submit_gemm("cublasSgemmStridedBatched", handle, GEMM_F32, transa, transb, m, n, k,
                       alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batchCount);
}

cublasStatus_t CUBLASWINAPI cublasDgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const double *alpha, const double *A, int lda, long long int strideA, const double *B, int ldb,
    long long int strideB, const double *beta, double *C, int ldc, long long int strideC,
    int batchCount)
{
    return submit_gemm("cublasDgemmStridedBatched", handle, GEMM_F64, transa, transb, m, n, k,
                       alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batchCount);
}

/* ---- the Ex variants: types chosen at run time ------------------------------ */

/* The one supported element type for these types, or -1 (NOT_SUPPORTED).
 * The 32F compute types that allow down-converting (TF32, BF16, FP16,
 * BF16x9) are computed in full FP32, like CUBLAS_COMPUTE_32F. */
static int ex_type(cudaDataType a, cudaDataType b, cudaDataType c, cublasComputeType_t ct)
{
    if (a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F) {
        switch (ct) {
        case CUBLAS_COMPUTE_32F:
        case CUBLAS_COMPUTE_32F_PEDANTIC:
        case CUBLAS_COMPUTE_32F_FAST_16F:
        case CUBLAS_COMPUTE_32F_FAST_16BF:
        case CUBLAS_COMPUTE_32F_FAST_TF32:
        case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
            return GEMM_F32;
        default:
            return -1;
        }
    }
    if (a == CUDA_R_64F && b == CUDA_R_64F && c == CUDA_R_64F) {
        switch (ct) {
        case CUBLAS_COMPUTE_64F:
        case CUBLAS_COMPUTE_64F_PEDANTIC:
        case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT:
            return GEMM_F64;
        default:
            return -1;
        }
    }
    return -1;
}

/* Every cublasGemmAlgo_t is accepted (and ignored: there is one algorithm). */
static int valid_algo(cublasGemmAlgo_t algo)
{
    return (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
           (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP) ||
           algo == CUBLAS_GEMM_AUTOTUNE;
}

static cublasStatus_t check_ex(const char *api, cublasHandle_t handle, cudaDataType Atype,
                               cudaDataType Btype, cudaDataType Ctype,
                               cublasComputeType_t computeType, cublasGemmAlgo_t algo, int *type)
{
    struct handle_state st;
    cublasStatus_t s = handle_state(handle, &st);
    if (s != CUBLAS_STATUS_SUCCESS)
        return report(s, api, "handle %p is not a live cuBLAS handle (create it with "
                      "cublasCreate_v2)", (void *)handle);
    *type = ex_type(Atype, Btype, Ctype, computeType);
    if (*type < 0)
        return report(CUBLAS_STATUS_NOT_SUPPORTED, api,
                      "Atype %d, Btype %d, Ctype %d with computeType %d: the emulator implements "
                      "only all CUDA_R_32F (compute 32F) and all CUDA_R_64F (compute 64F)",
                      (int)Atype, (int)Btype, (int)Ctype, (int)computeType);
    if (!valid_algo(algo))
        return report(CUBLAS_STATUS_INVALID_VALUE, api, "algo %d is not a cublasGemmAlgo_t",
                      (int)algo);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void *alpha, const void *A, cudaDataType Atype,
                                         int lda, const void *B, cudaDataType Btype, int ldb,
                                         const void *beta, void *C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    int type;
    cublasStatus_t s = check_ex("cublasGemmEx", handle, Atype, Btype, Ctype, computeType, algo, &type);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    return submit_gemm("cublasGemmEx", handle, (enum gemm_type)type, transa, transb, m, n, k, alpha,
                       A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    int type;
    cublasStatus_t s = check_ex("cublasGemmStridedBatchedEx", handle, Atype, Btype, Ctype,
                                computeType, algo, &type);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    return submit_gemm("cublasGemmStridedBatchedEx", handle, (enum gemm_type)type, transa, transb,
                       m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                       batchCount);
}
