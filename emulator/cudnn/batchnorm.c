/* batchnorm.c -- the legacy batch normalization API that PyTorch's BatchNorm
 * calls: cudnnBatchNormalizationForwardTraining[Ex],
 * cudnnBatchNormalizationForwardInference, cudnnBatchNormalizationBackward[Ex],
 * their workspace and reserve-space size queries and
 * cudnnDeriveBNTensorDescriptor.
 *
 * Modes CUDNN_BATCHNORM_SPATIAL and _SPATIAL_PERSISTENT (the same math: one
 * feature per channel, over N and the spatial dimensions) and
 * CUDNN_BATCHNORM_PER_ACTIVATION (one feature per channel and spatial
 * position, over N); bnOps CUDNN_BATCHNORM_OPS_BN only (others:
 * NOT_SUPPORTED; zDesc/activationDesc are then ignored, as cuDNN does).  x, y,
 * dy, dx are 4-D or 5-D FLOAT or DOUBLE tensors with any strides; the
 * parameter tensors (scale, bias, means, variances and their gradients) are
 * described by their own descriptor: 1xCx1x1[x1] (spatial) or 1xCxHxW[xD]
 * (per activation), FLOAT for FLOAT data and DOUBLE for DOUBLE data.  The
 * workspace and reserve space sizes are 0.
 *
 * The math, with cuDNN's semantics (emulator/README.md, "cuDNN"), is done in
 * double, whatever T, with a fixed order: per feature, the members in order
 * n, then the spatial position row-major; two passes (mean, then the sum of
 * squared deviations).  Compiled with -ffp-contract=off.
 *
 *   mean = sum(x) / M;  var = sum((x - mean)^2) / M;  invstd = 1 / sqrt(var + eps)
 *   y = alpha * (scale * ((x - mean) * invstd) + bias)  [+ beta * y if beta != 0]
 *   runningMean = (1 - f) * runningMean + f * mean
 *   runningVar  = (1 - f) * runningVar + f * sum((x - mean)^2) / (M - 1)   (M > 1; else + f * var)
 *   saveMean = mean;  saveInvVariance = invstd
 *   inference: invstd = 1 / sqrt(estimatedVariance + eps), mean = estimatedMean
 *   backward (mean, invstd saved, or recomputed from x and eps as above):
 *     xhat = (x - mean) * invstd;  sdy = sum(dy);  sdyx = sum(dy * xhat)
 *     dx = (scale * invstd) * ((dy - sdy / M) - xhat * (sdyx / M))
 *     dx = alphaDataDiff * dx [+ betaDataDiff * dx];  dScale = alphaParamDiff * sdyx [+ betaParamDiff * dScale];
 *     dBias = alphaParamDiff * sdy [+ betaParamDiff * dBias]
 * Each result is rounded to T once, when stored. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum bn_kind { BN_TRAIN, BN_INFER, BN_BACKWARD };

struct bn_job {
    int kind;
    enum dnn_type type;
    int per_activation;
    int64_t N, C, S[3];             /* spatial extents, right-aligned into (d, h, w) */
    int64_t xs[5], ys[5], ps[5];    /* x, y (y/dy/dx as the op uses them), parameter strides */
    int64_t dxs[5];                 /* backward: dx's strides (y is dy) */
    const void *x;
    void *y;                        /* y, or dy (backward) */
    void *dx;
    const void *scale, *bias;
    void *run_mean, *run_var;       /* training: updated; inference: read */
    void *save_mean, *save_inv;     /* training: written; backward: read */
    void *dscale, *dbias;
    double alpha, beta, alpha_p, beta_p;
    double eps, factor;
};

/* ---- the job -------------------------------------------------------------------------------- */

/* The members of the feature (c, p) in order: n, then the spatial position row-major
 * (in per-activation mode the spatial position is p itself). */
#define MEMBERS(...)                                                                                       \
    for (int64_t n = 0; n < j->N; n++)                                                                      \
        for (int64_t m0 = 0; m0 < Mx[0]; m0++)                                                              \
            for (int64_t m1 = 0; m1 < Mx[1]; m1++)                                                          \
                for (int64_t m2 = 0; m2 < Mx[2]; m2++) {                                                    \
                    const int64_t s0 = pa ? p0 : m0, s1 = pa ? p1 : m1, s2 = pa ? p2 : m2;                  \
                    const int64_t xo = n * j->xs[0] + c * j->xs[1] + s0 * j->xs[2] + s1 * j->xs[3] +        \
                                       s2 * j->xs[4];                                                       \
                    const int64_t yo = n * j->ys[0] + c * j->ys[1] + s0 * j->ys[2] + s1 * j->ys[3] +        \
                                       s2 * j->ys[4];                                                       \
                    const int64_t dxo = n * j->dxs[0] + c * j->dxs[1] + s0 * j->dxs[2] + s1 * j->dxs[3] +   \
                                        s2 * j->dxs[4];                                                     \
                    (void)yo;                                                                               \
                    (void)dxo;                                                                              \
                    __VA_ARGS__                                                                             \
                }

#define DEFINE_BN(SUFFIX, T)                                                                                \
    static void bn_##SUFFIX(const struct bn_job *j)                                                         \
    {                                                                                                       \
        const T *X = j->x;                                                                                  \
        T *Y = j->y, *DX = j->dx;                                                                           \
        const T *SC = j->scale, *BI = j->bias;                                                              \
        const int pa = j->per_activation;                                                                   \
        const int64_t P[3] = {pa ? j->S[0] : 1, pa ? j->S[1] : 1, pa ? j->S[2] : 1};                        \
        const int64_t Mx[3] = {pa ? 1 : j->S[0], pa ? 1 : j->S[1], pa ? 1 : j->S[2]};                       \
        const double M = (double)(j->N * Mx[0] * Mx[1] * Mx[2]);                                            \
        for (int64_t c = 0; c < j->C; c++) {                                                                \
            if (jitckpt_simdev_worker_should_stop())                                                        \
                return;                                                                                     \
            for (int64_t p0 = 0; p0 < P[0]; p0++)                                                           \
                for (int64_t p1 = 0; p1 < P[1]; p1++)                                                       \
                    for (int64_t p2 = 0; p2 < P[2]; p2++) {                                                 \
                        const int64_t po = c * j->ps[1] + p0 * j->ps[2] + p1 * j->ps[3] + p2 * j->ps[4];    \
                        double mean, invstd, sq = 0.0;                                                      \
                        const double sc = (double)SC[po];                                                   \
                        int have_stats = 0;                                                                 \
                        if (j->kind == BN_INFER) {                                                          \
                            mean = (double)((const T *)j->run_mean)[po];                                    \
                            invstd = 1.0 / sqrt((double)((const T *)j->run_var)[po] + j->eps);              \
                            have_stats = 1;                                                                 \
                        } else if (j->kind == BN_BACKWARD && j->save_mean) {                                \
                            mean = (double)((const T *)j->save_mean)[po];                                   \
                            invstd = (double)((const T *)j->save_inv)[po];                                  \
                            have_stats = 1;                                                                 \
                        }                                                                                   \
                        if (!have_stats) {                                                                  \
                            double sum = 0.0;                                                               \
                            MEMBERS(sum += (double)X[xo];)                                                  \
                            mean = sum / M;                                                                 \
                            MEMBERS(const double d = (double)X[xo] - mean; sq += d * d;)                    \
                            invstd = 1.0 / sqrt(sq / M + j->eps);                                           \
                        }                                                                                   \
                        if (j->kind != BN_BACKWARD) {                                                       \
                            const double bi = (double)BI[po];                                               \
                            MEMBERS({                                                                       \
                                const double t = sc * (((double)X[xo] - mean) * invstd) + bi;               \
                                double out = j->alpha * t;                                                  \
                                if (j->beta != 0.0)                                                         \
                                    out = out + j->beta * (double)Y[yo];                                    \
                                Y[yo] = (T)out;                                                             \
                            })                                                                              \
                            if (j->kind == BN_TRAIN) {                                                      \
                                if (j->run_mean) {                                                          \
                                    T *rm = (T *)j->run_mean + po, *rv = (T *)j->run_var + po;              \
                                    const double uvar = M > 1.0 ? sq / (M - 1.0) : sq / M;                  \
                                    *rm = (T)((1.0 - j->factor) * (double)*rm + j->factor * mean);          \
                                    *rv = (T)((1.0 - j->factor) * (double)*rv + j->factor * uvar);          \
                                }                                                                           \
                                if (j->save_mean) {                                                         \
                                    ((T *)j->save_mean)[po] = (T)mean;                                      \
                                    ((T *)j->save_inv)[po] = (T)invstd;                                     \
                                }                                                                           \
                            }                                                                               \
                            continue;                                                                       \
                        }                                                                                   \
                        double sdy = 0.0, sdyx = 0.0;                                                       \
                        MEMBERS({                                                                           \
                            const double xh = ((double)X[xo] - mean) * invstd;                              \
                            const double dyv = (double)Y[yo];                                               \
                            sdy += dyv;                                                                     \
                            sdyx += dyv * xh;                                                               \
                        })                                                                                  \
                        const double mdy = sdy / M, mdyx = sdyx / M, k = sc * invstd;                       \
                        MEMBERS({                                                                           \
                            const double xh = ((double)X[xo] - mean) * invstd;                              \
                            const double d = k * (((double)Y[yo] - mdy) - xh * mdyx);                       \
                            double out = j->alpha * d;                                                      \
                            if (j->beta != 0.0)                                                             \
                                out = out + j->beta * (double)DX[dxo];                                      \
                            DX[dxo] = (T)out;                                                               \
                        })                                                                                  \
                        T *ds = (T *)j->dscale + po, *db = (T *)j->dbias + po;                              \
                        double vs = j->alpha_p * sdyx, vb = j->alpha_p * sdy;                               \
                        if (j->beta_p != 0.0) {                                                             \
                            vs = vs + j->beta_p * (double)*ds;                                              \
                            vb = vb + j->beta_p * (double)*db;                                              \
                        }                                                                                   \
                        *ds = (T)vs;                                                                        \
                        *db = (T)vb;                                                                        \
                    }                                                                                       \
        }                                                                                                   \
    }

DEFINE_BN(f32, float)
DEFINE_BN(f64, double)
#undef MEMBERS

static void bn_job_run(void *arg)
{
    const struct bn_job *j = arg;
    if (j->type == DNN_F32)
        bn_f32(j);
    else
        bn_f64(j);
}

static void bn_job_release(void *job)
{
    free(job);
}

/* ---- validation --------------------------------------------------------------------------------- */

static int valid_mode(cudnnBatchNormMode_t mode)
{
    return mode == CUDNN_BATCHNORM_PER_ACTIVATION || mode == CUDNN_BATCHNORM_SPATIAL ||
           mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
}

/* The handle, mode and bnOps (CUDNN_BATCHNORM_OPS_BN for the plain functions). */
static cudnnStatus_t check_call(const char *api, cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                                cudnnBatchNormOps_t ops, struct dnn_handle_state *hs)
{
    if (dnn_handle_state(handle, hs) != CUDNN_STATUS_SUCCESS)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "invalid handle %p", (void *)handle);
    if (!valid_mode(mode))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "unknown batch normalization mode %d", (int)mode);
    if (ops != CUDNN_BATCHNORM_OPS_BN)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, api,
                          "bnOps %d: only CUDNN_BATCHNORM_OPS_BN (no fused activation or add) is implemented",
                          (int)ops);
    return CUDNN_STATUS_SUCCESS;
}

/* A data tensor (x, y, dy, dx): live, set, 4-D or 5-D, FLOAT or DOUBLE,
 * and (if `like` is given) of its dimensions and type. */
static cudnnStatus_t data_tensor(const char *api, const char *what, cudnnTensorDescriptor_t d,
                                 const struct legacy_tensor *like, struct legacy_tensor *out)
{
    if (!dnn_legacy_tensor(d, out) || !out->set)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "%s descriptor %p is NULL, unknown, destroyed or not set",
                          what, (void *)d);
    if (out->nd != 4 && out->nd != 5)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "%s has %d dimensions: batch normalization takes 4 or 5",
                          what, out->nd);
    if (like) {
        if (out->nd != like->nd || memcmp(out->dims, like->dims, (size_t)out->nd * sizeof out->dims[0]) ||
            out->dtype != like->dtype)
            return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "%s's dimensions or data type differ from x's", what);
        return CUDNN_STATUS_SUCCESS;
    }
    if (out->dtype != CUDNN_DATA_FLOAT && out->dtype != CUDNN_DATA_DOUBLE)
        return dnn_report(CUDNN_STATUS_NOT_SUPPORTED, api,
                          "%s has data type %d: the emulator implements FLOAT and DOUBLE batch normalization", what,
                          (int)out->dtype);
    return CUDNN_STATUS_SUCCESS;
}

/* The parameter descriptor: 1xCx1x1[x1] (spatial) or 1xCxHxW[xD] (per
 * activation), FLOAT for FLOAT x, DOUBLE for DOUBLE x. */
static cudnnStatus_t param_tensor(const char *api, cudnnTensorDescriptor_t d, const struct legacy_tensor *x,
                                  cudnnBatchNormMode_t mode, struct legacy_tensor *out)
{
    if (!dnn_legacy_tensor(d, out) || !out->set)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api,
                          "the parameter descriptor %p is NULL, unknown, destroyed or not set", (void *)d);
    int ok = out->nd == x->nd && out->dims[0] == 1 && out->dims[1] == x->dims[1] && out->dtype == x->dtype;
    for (int i = 2; ok && i < x->nd; i++)
        ok = out->dims[i] == (mode == CUDNN_BATCHNORM_PER_ACTIVATION ? x->dims[i] : 1);
    if (!ok)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api,
                          "the parameter descriptor must be 1 x C x %s of x's type (see cudnnDeriveBNTensorDescriptor)",
                          mode == CUDNN_BATCHNORM_PER_ACTIVATION ? "(x's spatial dimensions)" : "1 ...");
    return CUDNN_STATUS_SUCCESS;
}

static double scalar(const struct legacy_tensor *x, const void *p)
{
    return x->dtype == CUDNN_DATA_FLOAT ? (double)*(const float *)p : *(const double *)p;
}

/* Fills the job's geometry from x, the parameter descriptor and the output descriptor(s). */
static void geometry(struct bn_job *j, const struct legacy_tensor *x, const struct legacy_tensor *y,
                     const struct legacy_tensor *p, const struct legacy_tensor *dx, cudnnBatchNormMode_t mode)
{
    j->type = x->dtype == CUDNN_DATA_FLOAT ? DNN_F32 : DNN_F64;
    j->per_activation = mode == CUDNN_BATCHNORM_PER_ACTIVATION;
    j->N = x->dims[0];
    j->C = x->dims[1];
    int skip = 5 - x->nd;  /* 4-D: d = 1 */
    for (int i = 0; i < 2; i++) {
        j->xs[i] = x->strides[i];
        j->ys[i] = y->strides[i];
        j->ps[i] = p->strides[i];
        j->dxs[i] = dx ? dx->strides[i] : 0;
    }
    for (int i = 0; i < 3; i++) {
        int src = 2 + i - skip;
        int have = i >= skip;
        j->S[i] = have ? x->dims[src] : 1;
        j->xs[2 + i] = have ? x->strides[src] : 0;
        j->ys[2 + i] = have ? y->strides[src] : 0;
        j->ps[2 + i] = have ? p->strides[src] : 0;
        j->dxs[2 + i] = have && dx ? dx->strides[src] : 0;
    }
}

static cudnnStatus_t check_params(const char *api, const struct legacy_tensor *p, const void *const *ptrs,
                                  const char *const *names, int n)
{
    size_t es = dnn_type_size(p->dtype);
    for (int i = 0; i < n; i++)
        if (ptrs[i]) {
            cudnnStatus_t s = dnn_check_tensor(api, names[i], ptrs[i], p->nd, p->dims, p->strides, es);
            if (s)
                return s;
        }
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t queue(const char *api, const struct dnn_handle_state *hs, struct bn_job *j)
{
    cudaError_t derr = jitckpt_simdev_device_error(hs->device);
    if (derr != cudaSuccess) {
        free(j);
        return dnn_report(CUDNN_STATUS_EXECUTION_FAILED, api, "device %d failed (cuda error %d)", hs->device,
                          (int)derr);
    }
    cudaError_t e = jitckpt_simdev_enqueue(hs->stream, api, bn_job_run, j, bn_job_release);
    if (e != cudaSuccess)
        return dnn_report(CUDNN_STATUS_EXECUTION_FAILED, api, "cannot queue the work on stream %p (cuda error %d)",
                          (void *)hs->stream, (int)e);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- forward ------------------------------------------------------------------------------------ */

static cudnnStatus_t forward(const char *api, int kind, cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                             cudnnBatchNormOps_t ops, const void *alpha, const void *beta,
                             cudnnTensorDescriptor_t xDesc, const void *x, cudnnTensorDescriptor_t yDesc, void *y,
                             cudnnTensorDescriptor_t pDesc, const void *scale, const void *bias, double factor,
                             void *runMean, void *runVar, double epsilon, void *saveMean, void *saveInv)
{
    struct dnn_handle_state hs;
    cudnnStatus_t s = check_call(api, handle, mode, ops, &hs);
    if (s)
        return s;
    if (!alpha || !beta || !x || !y || !scale || !bias)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "alpha, beta, x, y, bnScale or bnBias is NULL");
    if (kind == BN_INFER && (!runMean || !runVar))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "estimatedMean or estimatedVariance is NULL");
    if (kind == BN_TRAIN && (!runMean != !runVar))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api,
                          "exactly one of resultRunningMean and resultRunningVariance is NULL");
    if (kind == BN_TRAIN && (!saveMean != !saveInv))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api,
                          "exactly one of resultSaveMean and resultSaveInvVariance is NULL");
    if (!(epsilon >= CUDNN_BN_MIN_EPSILON))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "epsilon %g is below CUDNN_BN_MIN_EPSILON", epsilon);
    struct legacy_tensor xt, yt, pt;
    if ((s = data_tensor(api, "x", xDesc, NULL, &xt)) || (s = data_tensor(api, "y", yDesc, &xt, &yt)) ||
        (s = param_tensor(api, pDesc, &xt, mode, &pt)))
        return s;
    size_t es = dnn_type_size(xt.dtype);
    const void *params[6] = {scale, bias, runMean, runVar, saveMean, saveInv};
    static const char *const names[6] = {"bnScale", "bnBias", "running mean", "running variance", "saved mean",
                                         "saved inverse variance"};
    if ((s = dnn_check_tensor(api, "x", x, xt.nd, xt.dims, xt.strides, es)) ||
        (s = dnn_check_tensor(api, "y", y, yt.nd, yt.dims, yt.strides, es)) ||
        (s = check_params(api, &pt, params, names, 6)))
        return s;
    struct bn_job *j = calloc(1, sizeof *j);
    if (!j)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    j->kind = kind;
    geometry(j, &xt, &yt, &pt, NULL, mode);
    j->x = x;
    j->y = y;
    j->scale = scale;
    j->bias = bias;
    j->run_mean = runMean;
    j->run_var = runVar;
    j->save_mean = saveMean;
    j->save_inv = saveInv;
    j->alpha = scalar(&xt, alpha);
    j->beta = scalar(&xt, beta);
    j->eps = epsilon;
    j->factor = factor;
    return queue(api, &hs, j);
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    double exponentialAverageFactor, void *resultRunningMean, void *resultRunningVariance, double epsilon,
    void *resultSaveMean, void *resultSaveInvVariance)
{
    return forward("cudnnBatchNormalizationForwardTraining", BN_TRAIN, handle, mode, CUDNN_BATCHNORM_OPS_BN, alpha,
                   beta, xDesc, x, yDesc, y, bnScaleBiasMeanVarDesc, bnScale, bnBias, exponentialAverageFactor,
                   resultRunningMean, resultRunningVariance, epsilon, resultSaveMean, resultSaveInvVariance);
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t zDesc, const void *zData,
    const cudnnTensorDescriptor_t yDesc, void *yData, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    const void *bnScale, const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    cudnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes, void *reserveSpace,
    size_t reserveSpaceSizeInBytes)
{
    (void)zDesc, (void)zData, (void)activationDesc, (void)workspace, (void)workSpaceSizeInBytes;
    (void)reserveSpace, (void)reserveSpaceSizeInBytes;
    return forward("cudnnBatchNormalizationForwardTrainingEx", BN_TRAIN, handle, mode, bnOps, alpha, beta, xDesc,
                   xData, yDesc, yData, bnScaleBiasMeanVarDesc, bnScale, bnBias, exponentialAverageFactor,
                   resultRunningMean, resultRunningVariance, epsilon, resultSaveMean, resultSaveInvVariance);
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    const void *estimatedMean, const void *estimatedVariance, double epsilon)
{
    return forward("cudnnBatchNormalizationForwardInference", BN_INFER, handle, mode, CUDNN_BATCHNORM_OPS_BN, alpha,
                   beta, xDesc, x, yDesc, y, bnScaleBiasMeanVarDesc, bnScale, bnBias, 0.0, (void *)estimatedMean,
                   (void *)estimatedVariance, epsilon, NULL, NULL);
}

/* ---- backward ------------------------------------------------------------------------------------ */

static cudnnStatus_t backward(const char *api, cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
                              const void *alphaD, const void *betaD, const void *alphaP, const void *betaP,
                              cudnnTensorDescriptor_t xDesc, const void *x, cudnnTensorDescriptor_t dyDesc,
                              const void *dy, cudnnTensorDescriptor_t dxDesc, void *dx, cudnnTensorDescriptor_t pDesc,
                              const void *scale, void *dScale, void *dBias, double epsilon, const void *savedMean,
                              const void *savedInv)
{
    struct dnn_handle_state hs;
    cudnnStatus_t s = check_call(api, handle, mode, ops, &hs);
    if (s)
        return s;
    if (!alphaD || !betaD || !alphaP || !betaP || !x || !dy || !dx || !scale || !dScale || !dBias)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api,
                          "alpha/beta (data or parameter), x, dy, dx, bnScale, dBnScale or dBnBias is NULL");
    if (!savedMean != !savedInv)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "exactly one of savedMean and savedInvVariance is NULL");
    if (!(epsilon >= CUDNN_BN_MIN_EPSILON))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "epsilon %g is below CUDNN_BN_MIN_EPSILON", epsilon);
    struct legacy_tensor xt, dyt, dxt, pt;
    if ((s = data_tensor(api, "x", xDesc, NULL, &xt)) || (s = data_tensor(api, "dy", dyDesc, &xt, &dyt)) ||
        (s = data_tensor(api, "dx", dxDesc, &xt, &dxt)) || (s = param_tensor(api, pDesc, &xt, mode, &pt)))
        return s;
    size_t es = dnn_type_size(xt.dtype);
    const void *params[5] = {scale, dScale, dBias, savedMean, savedInv};
    static const char *const names[5] = {"bnScale", "dBnScale", "dBnBias", "saved mean", "saved inverse variance"};
    if ((s = dnn_check_tensor(api, "x", x, xt.nd, xt.dims, xt.strides, es)) ||
        (s = dnn_check_tensor(api, "dy", dy, dyt.nd, dyt.dims, dyt.strides, es)) ||
        (s = dnn_check_tensor(api, "dx", dx, dxt.nd, dxt.dims, dxt.strides, es)) ||
        (s = check_params(api, &pt, params, names, 5)))
        return s;
    struct bn_job *j = calloc(1, sizeof *j);
    if (!j)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    j->kind = BN_BACKWARD;
    geometry(j, &xt, &dyt, &pt, &dxt, mode);
    j->x = x;
    j->y = (void *)dy;
    j->dx = dx;
    j->scale = scale;
    j->dscale = dScale;
    j->dbias = dBias;
    j->save_mean = (void *)savedMean;
    j->save_inv = (void *)savedInv;
    j->alpha = scalar(&xt, alphaD);
    j->beta = scalar(&xt, betaD);
    j->alpha_p = scalar(&xt, alphaP);
    j->beta_p = scalar(&xt, betaP);
    j->eps = epsilon;
    return queue(api, &hs, j);
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff, const void *betaDataDiff,
    const void *alphaParamDiff, const void *betaParamDiff, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult, void *dBnBiasResult,
    double epsilon, const void *savedMean, const void *savedInvVariance)
{
    return backward("cudnnBatchNormalizationBackward", handle, mode, CUDNN_BATCHNORM_OPS_BN, alphaDataDiff,
                    betaDataDiff, alphaParamDiff, betaParamDiff, xDesc, x, dyDesc, dy, dxDesc, dx, dBnScaleBiasDesc,
                    bnScale, dBnScaleResult, dBnBiasResult, epsilon, savedMean, savedInvVariance);
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t yDesc, const void *yData,
    const cudnnTensorDescriptor_t dyDesc, const void *dyData, const cudnnTensorDescriptor_t dzDesc, void *dzData,
    const cudnnTensorDescriptor_t dxDesc, void *dxData, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const void *bnScaleData, const void *bnBiasData, void *dBnScaleData, void *dBnBiasData, double epsilon,
    const void *savedMean, const void *savedInvVariance, cudnnActivationDescriptor_t activationDesc,
    void *workSpace, size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes)
{
    (void)yDesc, (void)yData, (void)dzDesc, (void)dzData, (void)bnBiasData, (void)activationDesc;
    (void)workSpace, (void)workSpaceSizeInBytes, (void)reserveSpace, (void)reserveSpaceSizeInBytes;
    return backward("cudnnBatchNormalizationBackwardEx", handle, mode, bnOps, alphaDataDiff, betaDataDiff,
                    alphaParamDiff, betaParamDiff, xDesc, xData, dyDesc, dyData, dxDesc, dxData, dBnScaleBiasDesc,
                    bnScaleData, dBnScaleData, dBnBiasData, epsilon, savedMean, savedInvVariance);
}

/* ---- sizes and the derived descriptor --------------------------------------------------------------- */

static cudnnStatus_t size_query(const char *api, cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                                cudnnBatchNormOps_t ops, cudnnTensorDescriptor_t xDesc, size_t *sizeInBytes)
{
    struct dnn_handle_state hs;
    cudnnStatus_t s = check_call(api, handle, mode, ops, &hs);
    if (s)
        return s;
    if (!sizeInBytes)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "sizeInBytes is NULL");
    struct legacy_tensor xt;
    if ((s = data_tensor(api, "x", xDesc, NULL, &xt)))
        return s;
    *sizeInBytes = 0;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const cudnnTensorDescriptor_t xDesc,
    const cudnnTensorDescriptor_t zDesc, const cudnnTensorDescriptor_t yDesc,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const cudnnActivationDescriptor_t activationDesc,
    size_t *sizeInBytes)
{
    (void)zDesc, (void)yDesc, (void)bnScaleBiasMeanVarDesc, (void)activationDesc;
    return size_query("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", handle, mode, bnOps, xDesc,
                      sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const cudnnTensorDescriptor_t xDesc,
    const cudnnTensorDescriptor_t yDesc, const cudnnTensorDescriptor_t dyDesc, const cudnnTensorDescriptor_t dzDesc,
    const cudnnTensorDescriptor_t dxDesc, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes)
{
    (void)yDesc, (void)dyDesc, (void)dzDesc, (void)dxDesc, (void)dBnScaleBiasDesc, (void)activationDesc;
    return size_query("cudnnGetBatchNormalizationBackwardExWorkspaceSize", handle, mode, bnOps, xDesc, sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t xDesc, size_t *sizeInBytes)
{
    (void)activationDesc;
    return size_query("cudnnGetBatchNormalizationTrainingExReserveSpaceSize", handle, mode, bnOps, xDesc,
                      sizeInBytes);
}

/* 1xCx1x1[x1] (spatial modes) or 1xCxHxW[xD] (per activation), packed, of
 * x's type (FLOAT for HALF and BFLOAT16 data, as cuDNN derives it). */
cudnnStatus_t CUDNNWINAPI cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
                                                        const cudnnTensorDescriptor_t xDesc, cudnnBatchNormMode_t mode)
{
    static const char api[] = "cudnnDeriveBNTensorDescriptor";
    struct legacy_tensor xt;
    if (!dnn_legacy_tensor(xDesc, &xt) || !xt.set)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "xDesc %p is NULL, unknown, destroyed or not set", (void *)xDesc);
    if (!valid_mode(mode))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "unknown batch normalization mode %d", (int)mode);
    if (xt.nd != 4 && xt.nd != 5)
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "xDesc has %d dimensions, not 4 or 5", xt.nd);
    int dims[5], strides[5];
    for (int i = 0; i < xt.nd; i++)
        dims[i] = i == 0 ? 1 : i == 1 || mode == CUDNN_BATCHNORM_PER_ACTIVATION ? (int)xt.dims[i] : 1;
    strides[xt.nd - 1] = 1;
    for (int i = xt.nd - 2; i >= 0; i--)
        strides[i] = strides[i + 1] * dims[i + 1];
    cudnnDataType_t t = xt.dtype == CUDNN_DATA_HALF || xt.dtype == CUDNN_DATA_BFLOAT16 ? CUDNN_DATA_FLOAT
                                                                                          : (cudnnDataType_t)xt.dtype;
    if (!dnn_legacy_tensor(derivedBnDesc, NULL))
        return dnn_report(CUDNN_STATUS_BAD_PARAM, api, "derivedBnDesc %p is NULL, unknown or destroyed",
                          (void *)derivedBnDesc);
    return cudnnSetTensorNdDescriptor(derivedBnDesc, t, xt.nd, dims, strides);
}
