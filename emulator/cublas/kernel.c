/* kernel.c -- the CPU reference GEMM that a queued cuBLAS job runs on its
 * stream worker.
 *
 * Column-major, as cuBLAS.  For every element, in the compute type:
 *
 *     acc = 0;  for l = 0, 1, ..., k-1 in order:  acc += op(A)(i,l) * op(B)(l,j)
 *     C(i,j) = alpha * acc + beta * C(i,j)        (C(i,j) = alpha * acc if beta == 0)
 *
 * The loops may visit elements in a cache-friendly order, but each element's
 * sum is always accumulated in l order, one rounded multiply and one rounded
 * add per term (this file is compiled with -ffp-contract=off: no fused
 * multiply-add), so the result is bit-identical on every run and every
 * machine with IEEE float/double, whatever the loop order or thread count.
 * Plain single-threaded loops; no OpenMP.
 *
 * BLAS conventions: beta == 0 never reads C (NaNs there are overwritten);
 * alpha == 0 reads neither A nor B (C = beta * C). */

#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* One matrix product C = alpha op(A) op(B) + beta C of type T; `acc` is
 * scratch for m values of T, or NULL (then a slower loop needs none). */
#define DEFINE_GEMM(NAME, T)                                                                   \
    static void NAME(const struct gemm_job *jb, T alpha, T beta, const T *A, const T *B, T *C, \
                     T *acc)                                                                   \
    {                                                                                          \
        const long long m = jb->m, n = jb->n, k = jb->k;                                       \
        const long long lda = jb->lda, ldb = jb->ldb, ldc = jb->ldc;                           \
        for (long long j = 0; j < n; j++) {                                                    \
            T *c = C + j * ldc;                                                                \
            if (jitckpt_simdev_worker_should_stop())                                           \
                return;                                                                        \
            if (alpha == (T)0) {                                                               \
                for (long long i = 0; i < m; i++)                                              \
                    c[i] = beta == (T)0 ? (T)0 : beta * c[i];                                  \
                continue;                                                                      \
            }                                                                                  \
            /* op(B)(l, j) = B[l + j*ldb], or B[j + l*ldb] transposed */                       \
            const T *bcol = jb->transb ? B + j : B + j * ldb;                                  \
            const long long bstep = jb->transb ? ldb : 1;                                      \
            if (!jb->transa && acc) {                                                          \
                /* op(A)(i, l) = A[i + l*lda]: a column of A per term, all rows at once */     \
                for (long long i = 0; i < m; i++)                                              \
                    acc[i] = (T)0;                                                             \
                for (long long l = 0; l < k; l++) {                                            \
                    const T b = bcol[l * bstep];                                               \
                    const T *a = A + l * lda;                                                  \
                    for (long long i = 0; i < m; i++)                                          \
                        acc[i] += a[i] * b;                                                    \
                }                                                                              \
                for (long long i = 0; i < m; i++) {                                            \
                    const T t = alpha * acc[i];                                                \
                    c[i] = beta == (T)0 ? t : t + beta * c[i];                                 \
                }                                                                              \
            } else {                                                                           \
                /* op(A)(i, l) = A[l + i*lda] (transposed) or A[i + l*lda]: one dot per row */ \
                const long long astep = jb->transa ? 1 : lda;                                  \
                for (long long i = 0; i < m; i++) {                                            \
                    const T *a = jb->transa ? A + i * lda : A + i;                             \
                    T s = (T)0;                                                                \
                    for (long long l = 0; l < k; l++)                                          \
                        s += a[l * astep] * bcol[l * bstep];                                   \
                    const T t = alpha * s;                                                     \
                    c[i] = beta == (T)0 ? t : t + beta * c[i];                                 \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

DEFINE_GEMM(gemm_f32, float)
DEFINE_GEMM(gemm_f64, double)

void gemm_run(void *arg)
{
    const struct gemm_job *jb = arg;
    union scalar alpha = jb->alpha, beta = jb->beta;
    size_t es = jb->type == GEMM_F32 ? sizeof(float) : sizeof(double);
    if (jb->device_scalars) {       /* read now, in stream order, as a GPU kernel would */
        memcpy(&alpha, jb->alpha_ptr, es);
        memcpy(&beta, jb->beta_ptr, es);
    }
    void *acc = malloc((size_t)jb->m * es);     /* NULL: the loop without scratch */
    for (int b = 0; b < jb->batch && !jitckpt_simdev_worker_should_stop(); b++) {
        if (jb->type == GEMM_F32)
            gemm_f32(jb, alpha.f, beta.f, (const float *)jb->A + b * jb->stride_a,
                     (const float *)jb->B + b * jb->stride_b, (float *)jb->C + b * jb->stride_c, acc);
        else
            gemm_f64(jb, alpha.d, beta.d, (const double *)jb->A + b * jb->stride_a,
                     (const double *)jb->B + b * jb->stride_b, (double *)jb->C + b * jb->stride_c, acc);
    }
    free(acc);
}

void gemm_release(void *job)
{
    free(job);
}
