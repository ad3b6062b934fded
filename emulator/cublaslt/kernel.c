/* kernel.c -- the CPU matmul that a queued cublasLtMatmul job runs on its
 * stream worker: D = epilogue(alpha op(A) op(B) + beta C).
 *
 * Column-major, as cuBLASLt.  For every element, in the compute type (FP32
 * for CUDA_R_32F data, FP64 for CUDA_R_64F):
 *
 *     acc = 0;  for l = 0, 1, ..., k-1 in order:  acc += op(A)(i,l) * op(B)(l,j)
 *     t = alpha * acc;  if (beta != 0) t = t + beta * C(i,j)
 *     BIAS epilogues:  t = t + bias[i]
 *     RELU:            t = t > 0 ? t : 0          (NaN -> 0, like fmaxf(t, 0))
 *     GELU:            t = (0.5 * t) * (1 + tanh(0.7978845608028654 * (t + 0.044715 * ((t * t) * t))))
 *                      (the tanh approximation cuBLASLt documents; tanhf/tanh of libm)
 *     D(i,j) = t
 *
 * Each element's sum is always accumulated in l order, one rounded multiply
 * and one rounded add per term (this file is compiled with
 * -ffp-contract=off: no fused multiply-add), so the result is the same bits
 * on every run (GELU's also depends on the C library's tanh, the same for a
 * given machine).  Plain single-threaded loops.  BLAS conventions: beta == 0
 * never reads C (NaNs there are overwritten); alpha == 0 reads neither A nor
 * B.  C may be D (in place, same leading dimension): each element of C is
 * read just before the same element of D is written. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static inline float gelu_f32(float x)
{
    return (0.5f * x) * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * ((x * x) * x))));
}

static inline double gelu_f64(double x)
{
    return (0.5 * x) * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * ((x * x) * x))));
}

/* One matrix product with its epilogue, of type T; `acc` is scratch for m
 * values of T, or NULL (then a slower loop needs none). */
#define DEFINE_MATMUL(NAME, T, GELU)                                                               \
    static inline T NAME##_epilogue(const struct lt_job *jb, T t, const T *bias, long long i)      \
    {                                                                                              \
        if (bias)                                                                                  \
            t = t + bias[i];                                                                       \
        if (jb->relu)                                                                              \
            t = t > (T)0 ? t : (T)0;                                                               \
        else if (jb->gelu)                                                                         \
            t = GELU(t);                                                                           \
        return t;                                                                                  \
    }                                                                                              \
                                                                                                   \
    static void NAME(const struct lt_job *jb, T alpha, T beta, const T *A, const T *B, const T *C, \
                     T *D, const T *bias, T *acc)                                                  \
    {                                                                                              \
        const long long m = jb->m, n = jb->n, k = jb->k;                                           \
        const long long lda = jb->lda, ldb = jb->ldb;                                              \
        for (long long j = 0; j < n; j++) {                                                        \
            const T *c = C + j * jb->ldc;                                                          \
            T *d = D + j * jb->ldd;                                                                \
            if (jitckpt_simdev_worker_should_stop())                                               \
                return;                                                                            \
            if (alpha == (T)0) {                                                                   \
                for (long long i = 0; i < m; i++) {                                                \
                    const T t = beta == (T)0 ? (T)0 : beta * c[i];                                 \
                    d[i] = NAME##_epilogue(jb, t, bias, i);                                        \
                }                                                                                  \
                continue;                                                                          \
            }                                                                                      \
            /* op(B)(l, j) = B[l + j*ldb], or B[j + l*ldb] transposed */                           \
            const T *bcol = jb->transb ? B + j : B + j * ldb;                                      \
            const long long bstep = jb->transb ? ldb : 1;                                          \
            if (!jb->transa && acc) {                                                              \
                /* op(A)(i, l) = A[i + l*lda]: a column of A per term, all rows at once */         \
                for (long long i = 0; i < m; i++)                                                  \
                    acc[i] = (T)0;                                                                 \
                for (long long l = 0; l < k; l++) {                                                \
                    const T b = bcol[l * bstep];                                                   \
                    const T *a = A + l * lda;                                                      \
                    for (long long i = 0; i < m; i++)                                              \
                        acc[i] += a[i] * b;                                                        \
                }                                                                                  \
                for (long long i = 0; i < m; i++) {                                                \
                    T t = alpha * acc[i];                                                          \
                    if (beta != (T)0)                                                              \
                        t = t + beta * c[i];                                                       \
                    d[i] = NAME##_epilogue(jb, t, bias, i);                                        \
                }                                                                                  \
            } else {                                                                               \
                /* op(A)(i, l) = A[l + i*lda] (transposed) or A[i + l*lda]: one dot per row */     \
                const long long astep = jb->transa ? 1 : lda;                                      \
                for (long long i = 0; i < m; i++) {                                                \
                    const T *a = jb->transa ? A + i * lda : A + i;                                 \
                    T s = (T)0;                                                                    \
                    for (long long l = 0; l < k; l++)                                              \
                        s += a[l * astep] * bcol[l * bstep];                                       \
                    T t = alpha * s;                                                               \
                    if (beta != (T)0)                                                              \
                        t = t + beta * c[i];                                                       \
                    d[i] = NAME##_epilogue(jb, t, bias, i);                                        \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_MATMUL(matmul_f32, float, gelu_f32)
DEFINE_MATMUL(matmul_f64, double, gelu_f64)

void lt_job_run(void *arg)
{
    const struct lt_job *jb = arg;
    union lt_scalar alpha = jb->alpha, beta = jb->beta;
    size_t es = jb->type == LT_F32 ? sizeof(float) : sizeof(double);
    if (jb->device_scalars) {       /* read now, in stream order, as a GPU kernel would */
        memcpy(&alpha, jb->alpha_ptr, es);
        memcpy(&beta, jb->beta_ptr, es);
    }
    void *acc = malloc((size_t)jb->m * es);     /* NULL: the loop without scratch */
    for (int b = 0; b < jb->batch && !jitckpt_simdev_worker_should_stop(); b++) {
        if (jb->type == LT_F32)
            matmul_f32(jb, alpha.f, beta.f, (const float *)jb->A + b * jb->stride_a,
                       (const float *)jb->B + b * jb->stride_b, (const float *)jb->C + b * jb->stride_c,
                       (float *)jb->D + b * jb->stride_d,
                       jb->bias ? (const float *)jb->bias + b * jb->bias_stride : NULL, acc);
        else
            matmul_f64(jb, alpha.d, beta.d, (const double *)jb->A + b * jb->stride_a,
                       (const double *)jb->B + b * jb->stride_b,
                       (const double *)jb->C + b * jb->stride_c, (double *)jb->D + b * jb->stride_d,
                       jb->bias ? (const double *)jb->bias + b * jb->bias_stride : NULL, acc);
    }
    free(acc);
}

void lt_job_release(void *job)
{
    free(job);
}
