/* conv.c -- the CPU convolutions that a queued cudnnBackendExecute job runs on
 * its stream worker.
 *
 * Every tensor is addressed through its own strides (any layout: NCHW,
 * NHWC, padded, ...), with up to 3 spatial dimensions (missing ones have
 * size 1).  T is the data type, FLOAT or DOUBLE, which is also the compute
 * type; alpha and beta are rounded to T.  For every output element, in T
 * (this file is compiled with -ffp-contract=off: one rounded multiply and one
 * rounded add per term):
 *
 *   forward          y[n,k,o]:  acc = 0; for c, then filter position f in
 *                    row-major order, skipping positions whose input
 *                    i = o*stride - pre_pad + f*dilation lies in the padding:
 *                    acc += x[n,c,i] * w[k,c,f']
 *   backward data    dx[n,c,i]: acc = 0; for k, then f in row-major order,
 *                    where (i + pre_pad - f*dilation) is a multiple of the
 *                    stride giving an output o inside dy:
 *                    acc += dy[n,k,o] * w[k,c,f']
 *   backward filter  dw[k,c,f']: acc = 0; for n, then o in row-major order,
 *                    skipping padding: acc += x[n,c,i] * dy[n,k,o]
 *                    (the accumulators of all dw elements live in the
 *                    workspace: the loop runs n outermost, and each
 *                    element's terms still come in that order)
 *   then             out = alpha * acc, plus beta * out when beta != 0
 *                    (beta == 0 never reads out); alpha == 0 reads no input:
 *                    out = beta * out, or 0.
 *
 * f' is f for CUDNN_CROSS_CORRELATION and the mirrored position
 * (F-1-f per dimension) for CUDNN_CONVOLUTION.  Plain single-threaded loops;
 * a job stops early (its output then partial) once its device fails. */

#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFINE_CONV(SUFFIX, T)                                                                       \
    static void forward_##SUFFIX(const struct conv_job *j)                                           \
    {                                                                                                \
        const T *X = j->x, *W = j->w;                                                                \
        T *Y = j->y;                                                                                 \
        const T alpha = (T)j->alpha, beta = (T)j->beta;                                              \
        for (int64_t n = 0; n < j->N; n++)                                                           \
            for (int64_t k = 0; k < j->K; k++) {                                                     \
                if (jitckpt_simdev_worker_should_stop())                                             \
                    return;                                                                          \
                for (int64_t o0 = 0; o0 < j->out[0]; o0++)                                           \
                    for (int64_t o1 = 0; o1 < j->out[1]; o1++)                                       \
                        for (int64_t o2 = 0; o2 < j->out[2]; o2++) {                                 \
                            T *y = Y + n * j->ys[0] + k * j->ys[1] + o0 * j->ys[2] + o1 * j->ys[3] + \
                                   o2 * j->ys[4];                                                    \
                            if (alpha == (T)0) {                                                     \
                                *y = beta == (T)0 ? (T)0 : beta * *y;                                \
                                continue;                                                            \
                            }                                                                        \
                            T acc = (T)0;                                                            \
                            for (int64_t c = 0; c < j->C; c++)                                       \
                                for (int64_t f0 = 0; f0 < j->filt[0]; f0++) {                        \
                                    int64_t i0 = o0 * j->stride[0] - j->pre[0] + f0 * j->dil[0];     \
                                    if (i0 < 0 || i0 >= j->in[0])                                    \
                                        continue;                                                    \
                                    for (int64_t f1 = 0; f1 < j->filt[1]; f1++) {                    \
                                        int64_t i1 = o1 * j->stride[1] - j->pre[1] + f1 * j->dil[1]; \
                                        if (i1 < 0 || i1 >= j->in[1])                                \
                                            continue;                                                \
                                        for (int64_t f2 = 0; f2 < j->filt[2]; f2++) {                \
                                            int64_t i2 =                                             \
                                                o2 * j->stride[2] - j->pre[2] + f2 * j->dil[2];      \
                                            if (i2 < 0 || i2 >= j->in[2])                            \
                                                continue;                                            \
                                            const T xv = X[n * j->xs[0] + c * j->xs[1] +             \
                                                           i0 * j->xs[2] + i1 * j->xs[3] +           \
                                                           i2 * j->xs[4]];                           \
                                            const T wv = W[wofs(j, k, c, f0, f1, f2)];               \
                                            acc += xv * wv;                                          \
                                        }                                                            \
                                    }                                                                \
                                }                                                                    \
                            T t = alpha * acc;                                                       \
                            if (beta != (T)0)                                                        \
                                t = t + beta * *y;                                                   \
                            *y = t;                                                                  \
                        }                                                                            \
            }                                                                                        \
    }                                                                                                \
                                                                                                     \
    static void backward_data_##SUFFIX(const struct conv_job *j)                                     \
    {                                                                                                \
        T *X = j->x;                                                                                 \
        const T *W = j->w, *Y = j->y;                                                                \
        const T alpha = (T)j->alpha, beta = (T)j->beta;                                              \
        for (int64_t n = 0; n < j->N; n++)                                                           \
            for (int64_t c = 0; c < j->C; c++) {                                                     \
                if (jitckpt_simdev_worker_should_stop())                                             \
                    return;                                                                          \
                for (int64_t i0 = 0; i0 < j->in[0]; i0++)                                            \
                    for (int64_t i1 = 0; i1 < j->in[1]; i1++)                                        \
                        for (int64_t i2 = 0; i2 < j->in[2]; i2++) {                                  \
                            T *x = X + n * j->xs[0] + c * j->xs[1] + i0 * j->xs[2] + i1 * j->xs[3] + \
                                   i2 * j->xs[4];                                                    \
                            if (alpha == (T)0) {                                                     \
                                *x = beta == (T)0 ? (T)0 : beta * *x;                                \
                                continue;                                                            \
                            }                                                                        \
                            T acc = (T)0;                                                            \
                            for (int64_t k = 0; k < j->K; k++)                                       \
                                for (int64_t f0 = 0; f0 < j->filt[0]; f0++) {                        \
                                    int64_t q0 = i0 + j->pre[0] - f0 * j->dil[0];                    \
                                    if (q0 < 0 || q0 % j->stride[0] || q0 / j->stride[0] >= j->out[0]) \
                                        continue;                                                    \
                                    int64_t o0 = q0 / j->stride[0];                                  \
                                    for (int64_t f1 = 0; f1 < j->filt[1]; f1++) {                    \
                                        int64_t q1 = i1 + j->pre[1] - f1 * j->dil[1];                \
                                        if (q1 < 0 || q1 % j->stride[1] ||                           \
                                            q1 / j->stride[1] >= j->out[1])                          \
                                            continue;                                                \
                                        int64_t o1 = q1 / j->stride[1];                              \
                                        for (int64_t f2 = 0; f2 < j->filt[2]; f2++) {                \
                                            int64_t q2 = i2 + j->pre[2] - f2 * j->dil[2];            \
                                            if (q2 < 0 || q2 % j->stride[2] ||                       \
                                                q2 / j->stride[2] >= j->out[2])                      \
                                                continue;                                            \
                                            int64_t o2 = q2 / j->stride[2];                          \
                                            const T dy = Y[n * j->ys[0] + k * j->ys[1] +             \
                                                           o0 * j->ys[2] + o1 * j->ys[3] +           \
                                                           o2 * j->ys[4]];                           \
                                            const T wv = W[wofs(j, k, c, f0, f1, f2)];               \
                                            acc += dy * wv;                                          \
                                        }                                                            \
                                    }                                                                \
                                }                                                                    \
                            T t = alpha * acc;                                                       \
                            if (beta != (T)0)                                                        \
                                t = t + beta * *x;                                                   \
                            *x = t;                                                                  \
                        }                                                                            \
            }                                                                                        \
    }                                                                                                \
                                                                                                     \
    static void backward_filter_##SUFFIX(const struct conv_job *j)                                   \
    {                                                                                                \
        const T *X = j->x, *Y = j->y;                                                                \
        T *W = j->w;                                                                                 \
        T *acc = j->workspace;                                                                       \
        const T alpha = (T)j->alpha, beta = (T)j->beta;                                              \
        const int64_t F = j->filt[0] * j->filt[1] * j->filt[2];                                      \
        if (alpha != (T)0) {                                                                         \
            for (int64_t e = 0; e < j->K * j->C * F; e++)                                            \
                acc[e] = (T)0;                                                                       \
            for (int64_t n = 0; n < j->N; n++)                                                       \
                for (int64_t k = 0; k < j->K; k++) {                                                 \
                    if (jitckpt_simdev_worker_should_stop())                                         \
                        return;                                                                      \
                    for (int64_t c = 0; c < j->C; c++)                                               \
                        for (int64_t f0 = 0; f0 < j->filt[0]; f0++)                                  \
                            for (int64_t f1 = 0; f1 < j->filt[1]; f1++)                              \
                                for (int64_t f2 = 0; f2 < j->filt[2]; f2++) {                        \
                                    T *a = &acc[((k * j->C + c) * j->filt[0] + f0) * j->filt[1] *    \
                                                    j->filt[2] + f1 * j->filt[2] + f2];              \
                                    T s = *a;                                                        \
                                    for (int64_t o0 = 0; o0 < j->out[0]; o0++) {                     \
                                        int64_t i0 = o0 * j->stride[0] - j->pre[0] + f0 * j->dil[0]; \
                                        if (i0 < 0 || i0 >= j->in[0])                                \
                                            continue;                                                \
                                        for (int64_t o1 = 0; o1 < j->out[1]; o1++) {                 \
                                            int64_t i1 =                                             \
                                                o1 * j->stride[1] - j->pre[1] + f1 * j->dil[1];      \
                                            if (i1 < 0 || i1 >= j->in[1])                            \
                                                continue;                                            \
                                            for (int64_t o2 = 0; o2 < j->out[2]; o2++) {             \
                                                int64_t i2 =                                         \
                                                    o2 * j->stride[2] - j->pre[2] + f2 * j->dil[2];  \
                                                if (i2 < 0 || i2 >= j->in[2])                        \
                                                    continue;                                        \
                                                const T xv = X[n * j->xs[0] + c * j->xs[1] +         \
                                                               i0 * j->xs[2] + i1 * j->xs[3] +       \
                                                               i2 * j->xs[4]];                       \
                                                const T dy = Y[n * j->ys[0] + k * j->ys[1] +         \
                                                               o0 * j->ys[2] + o1 * j->ys[3] +       \
                                                               o2 * j->ys[4]];                       \
                                                s += xv * dy;                                        \
                                            }                                                        \
                                        }                                                            \
                                    }                                                                \
                                    *a = s;                                                          \
                                }                                                                    \
                }                                                                                    \
        }                                                                                            \
        for (int64_t k = 0; k < j->K; k++)                                                           \
            for (int64_t c = 0; c < j->C; c++)                                                       \
                for (int64_t f0 = 0; f0 < j->filt[0]; f0++)                                          \
                    for (int64_t f1 = 0; f1 < j->filt[1]; f1++)                                      \
                        for (int64_t f2 = 0; f2 < j->filt[2]; f2++) {                                \
                            T *w = W + wofs(j, k, c, f0, f1, f2);                                    \
                            T t;                                                                     \
                            if (alpha == (T)0) {                                                     \
                                t = beta == (T)0 ? (T)0 : beta * *w;                                 \
                            } else {                                                                 \
                                t = alpha * acc[((k * j->C + c) * j->filt[0] + f0) * j->filt[1] *    \
                                                    j->filt[2] + f1 * j->filt[2] + f2];              \
                                if (beta != (T)0)                                                    \
                                    t = t + beta * *w;                                               \
                            }                                                                        \
                            *w = t;                                                                  \
                        }                                                                            \
    }

/* The offset of filter element (k, c, f) used at filter position f: mirrored
 * for CUDNN_CONVOLUTION. */
static inline int64_t wofs(const struct conv_job *j, int64_t k, int64_t c, int64_t f0, int64_t f1, int64_t f2)
{
    if (j->flip) {
        f0 = j->filt[0] - 1 - f0;
        f1 = j->filt[1] - 1 - f1;
        f2 = j->filt[2] - 1 - f2;
    }
    return k * j->ws[0] + c * j->ws[1] + f0 * j->ws[2] + f1 * j->ws[3] + f2 * j->ws[4];
}

DEFINE_CONV(f32, float)
DEFINE_CONV(f64, double)

void conv_job_run(void *arg)
{
    const struct conv_job *j = arg;
    switch (j->kind) {
    case CONV_FWD:
        if (j->type == DNN_F32)
            forward_f32(j);
        else
            forward_f64(j);
        break;
    case CONV_BWD_DATA:
        if (j->type == DNN_F32)
            backward_data_f32(j);
        else
            backward_data_f64(j);
        break;
    case CONV_BWD_FILTER:
        if (j->type == DNN_F32)
            backward_filter_f32(j);
        else
            backward_filter_f64(j);
        break;
    }
}

void conv_job_release(void *job)
{
    free(job);
}
