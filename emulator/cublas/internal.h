/* internal.h -- declarations shared by the files of the emulated cuBLAS
 * (libcublas.so.13 of the jitckpt CPU device emulator).
 *
 * The emulated cuBLAS reaches the emulated device only through the private
 * interface of the emulated libcudart (jitckpt_simdev.h), as the emulated NCCL
 * does: it imports no cuda* symbol, so an LD_PRELOAD interposer of the
 * runtime sees none of cuBLAS's own stream work (as with the real library,
 * which launches its kernels through the driver).
 *
 * Every GEMM is stream work: the API call validates its arguments, copies the
 * scalars (host pointer mode) and queues one job on the handle's stream; the
 * job runs a CPU reference GEMM with a fixed summation order (kernel.c), so
 * results are bit-reproducible from run to run. */

#ifndef JITCKPT_SIMDEV_CUBLAS_INTERNAL_H
#define JITCKPT_SIMDEV_CUBLAS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_api.h>

#include "jitckpt_simdev.h"

/* ---- handle.c ------------------------------------------------------------- */

/* What a call needs from its handle, copied under the handle lock so that a
 * concurrent cublasSetStream or cublasDestroy cannot tear it. */
struct handle_state {
    int device;
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math_mode;
};

/* CUBLAS_STATUS_NOT_INITIALIZED for NULL or a handle that is not live
 * (never created, or destroyed); else copies its state into *out. */
cublasStatus_t handle_state(cublasHandle_t handle, struct handle_state *out);

/* ---- status.c ------------------------------------------------------------- */

/* Logs "cuBLAS <api>: <message>" and returns `status`. */
cublasStatus_t report(cublasStatus_t status, const char *api, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- kernel.c: the job that runs on the stream worker --------------------- */

enum gemm_type { GEMM_F32, GEMM_F64 };

union scalar {
    float f;
    double d;
};

struct gemm_job {
    enum gemm_type type;        /* data and compute type (A, B, C, alpha, beta) */
    int transa, transb;         /* nonzero: op(X) = X^T */
    int m, n, k;
    const void *A, *B;
    void *C;
    long long lda, ldb, ldc;
    long long stride_a, stride_b, stride_c;     /* in elements */
    int batch;
    int device_scalars;         /* CUBLAS_POINTER_MODE_DEVICE: read alpha/beta when run */
    const void *alpha_ptr, *beta_ptr;           /* device pointers (device_scalars) */
    union scalar alpha, beta;                   /* copied at call time (host mode) */
};

/* Stream worker entry point: runs the job; never frees it (a captured job
 * runs again at every graph launch).  gemm_release frees it. */
void gemm_run(void *job);
void gemm_release(void *job);

#endif /* JITCKPT_SIMDEV_CUBLAS_INTERNAL_H */
