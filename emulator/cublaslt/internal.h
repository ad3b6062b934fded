/* internal.h -- declarations shared by the files of the emulated cuBLASLt
 * (libcublasLt.so.13 of the jitckpt CPU device emulator).
 *
 * Like the emulated cuBLAS, the emulated cuBLASLt reaches the emulated device
 * only through the private interface of the emulated libcudart
 * (jitckpt_simdev.h) and imports no cuda* symbol.
 *
 * The descriptors (matmul, matrix layout, preference) are plain structs that
 * fit in NVIDIA's semi-opaque descriptor types (cublasLtMatmulDescOpaque_t,
 * ...), so every attribute is stored with the size the header documents.
 * Every cublasLtMatmul is stream work: the call validates its descriptors and
 * pointers, copies what the job needs (host scalars included) and queues one
 * job on the given stream; the job runs a CPU GEMM with a fixed summation
 * order and the epilogue (kernel.c), so results are bit-reproducible. */

#ifndef JITCKPT_SIMDEV_CUBLASLT_INTERNAL_H
#define JITCKPT_SIMDEV_CUBLASLT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>

#include "jitckpt_simdev.h"

/* ---- descriptors.c ------------------------------------------------------- */

#define LT_MATMUL_DESC_MAGIC 0x6a636b4c744d4d44ull  /* "jckLtMMD" */
#define LT_LAYOUT_MAGIC 0x6a636b4c744c4159ull       /* "jckLtLAY" */
#define LT_PREF_MAGIC 0x6a636b4c74505246ull         /* "jckLtPRF" */

/* cublasLtMatmulDesc_t points to one of these (inside a
 * cublasLtMatmulDescOpaque_t's storage).  Field types are the attributes'
 * documented data types. */
struct lt_matmul_desc {
    uint64_t magic;
    int32_t compute_type;           /* cublasComputeType_t */
    int32_t scale_type;             /* cudaDataType */
    int32_t pointer_mode;           /* cublasLtPointerMode_t */
    int32_t transa, transb, transc; /* cublasOperation_t */
    int32_t fill_mode;              /* cublasFillMode_t */
    uint32_t epilogue;              /* cublasLtEpilogue_t */
    const void *bias;
    int64_t bias_batch_stride;
    void *aux;
    int64_t aux_ld, aux_batch_stride;
    int64_t alpha_vector_batch_stride;
    int32_t sm_count_target;
    int32_t aux_data_type;
    const void *a_scale, *b_scale, *c_scale, *d_scale;
    void *amax_d;
    void *aux_scale, *aux_amax;
    int32_t bias_data_type;
    int32_t a_scale_mode, b_scale_mode, c_scale_mode, d_scale_mode, aux_scale_mode;
    int32_t d_out_scale_mode;
    void *d_out_scale;
    void *emulation_desc;           /* cublasLtEmulationDesc_t */
    int64_t alpha_batch_stride, beta_batch_stride;
    int32_t batch_invariance_flags;
    int8_t fast_accum;
};

/* cublasLtMatrixLayout_t points to one of these. */
struct lt_layout {
    uint64_t magic;
    uint32_t type;                  /* cudaDataType */
    int32_t order;                  /* cublasLtOrder_t */
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch_count;
    uint32_t batch_mode;            /* cublasLtBatchMode_t */
    int64_t batch_stride;           /* STRIDED_BATCH_OFFSET, in elements */
    int64_t plane_offset;
    const void *rows_array, *cols_array, *ld_array;
    int32_t rows_cols_width, ld_width;
};

/* cublasLtMatmulPreference_t points to one of these. */
struct lt_pref {
    uint64_t magic;
    uint32_t search_mode;
    uint32_t reduction_scheme_mask;
    uint64_t max_workspace_bytes;
    uint32_t min_alignment[4];      /* A, B, C, D */
    float max_waves_count;
    uint32_t grouped_avg_reduction_dim;
    uint64_t impl_mask;
    uint32_t grouped_avg_rows, grouped_avg_cols;
};

/* The live descriptor behind a public handle, or NULL (NULL or destroyed). */
struct lt_matmul_desc *lt_matmul_desc(cublasLtMatmulDesc_t d);
struct lt_layout *lt_layout(cublasLtMatrixLayout_t l);
struct lt_pref *lt_pref(cublasLtMatmulPreference_t p);

/* ---- status.c ------------------------------------------------------------ */

/* Logs "cuBLASLt <api>: <message>" and returns `status`. */
cublasStatus_t lt_report(cublasStatus_t status, const char *api, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- matmul.c: the one algorithm ------------------------------------------ */

/* The data[0] of the only cublasLtMatmulAlgo_t the heuristic returns. */
#define LT_ALGO_MAGIC 0x6a636b4c74414c47ull         /* "jckLtALG" */

/* ---- kernel.c: the job that runs on the stream worker -------------------- */

enum lt_type { LT_F32, LT_F64 };

union lt_scalar {
    float f;
    double d;
};

struct lt_job {
    enum lt_type type;          /* A, B, C, D, bias, alpha, beta and compute type */
    int transa, transb;         /* nonzero: op(X) = X^T */
    long long m, n, k;
    const void *A, *B, *C;
    void *D;
    long long lda, ldb, ldc, ldd;
    long long stride_a, stride_b, stride_c, stride_d;  /* in elements */
    int batch;
    int relu, gelu;             /* the activation of the epilogue (at most one) */
    const void *bias;           /* device vector of m elements, or NULL */
    long long bias_stride;      /* per batch, in elements */
    int device_scalars;         /* CUBLASLT_POINTER_MODE_DEVICE: read alpha/beta when run */
    const void *alpha_ptr, *beta_ptr;
    union lt_scalar alpha, beta;    /* copied at call time (host mode) */
};

/* Stream worker entry point: runs the job; never frees it (a captured job
 * runs again at every graph launch).  lt_job_release frees it. */
void lt_job_run(void *job);
void lt_job_release(void *job);

#endif /* JITCKPT_SIMDEV_CUBLASLT_INTERNAL_H */
