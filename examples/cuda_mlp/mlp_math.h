// mlp_math.h -- the math of the example, one function per GPU thread.
//
// Every kernel in mlp.cu is a one-line wrapper that computes its global
// thread index and calls one of these functions; every host twin in
// mlp_twins.cpp calls the same function for each thread index of the grid,
// in order.  So the kernel and its twin cannot drift apart: they differ only
// in who supplies the thread index.  tests/test_cuda_mlp.py checks this math
// against an independent numpy implementation.
//
// Each thread writes its own outputs and sums in a fixed order (no atomics,
// no shared-memory trees), so results are bit-for-bit reproducible.  The
// arithmetic uses only +, -, *, /, fabsf and sqrtf, which IEEE 754 rounds
// exactly; with FMA contraction off (the Makefile passes -fmad=false to the
// device compiler and -ffp-contract=off to the host compiler), a GPU thread
// and a twin round identically.
//
// The model: x (32) -> softsign(W1 x + b1) (64) -> w2 . h + b2 (1), mean
// squared error, Adam.  softsign(z) = z / (1 + |z|); its derivative is
// (1 - |softsign(z)|)^2, exact in float arithmetic, unlike tanh.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MLP_HD __host__ __device__ __forceinline__
#else
#define MLP_HD inline
#endif

namespace mlp {

constexpr int kIn = 32;      // input features
constexpr int kHidden = 64;  // hidden units

// Layout of the flat parameter vector (float32), also the layout of --out.
constexpr int kW1 = 0;                       // W1[j][k], row-major, kHidden x kIn
constexpr int kB1 = kW1 + kHidden * kIn;     // b1[j]
constexpr int kW2 = kB1 + kHidden;           // w2[j]
constexpr int kB2 = kW2 + kHidden;           // b2
constexpr int kParams = kB2 + 1;             // 2177
// The gradient buffer has one extra slot: this rank's share of the mean
// loss, so that the one all-reduce that sums gradients also sums the loss.
constexpr int kLossSlot = kParams;
constexpr int kGradLen = kParams + 1;

MLP_HD float softsign(float z) { return z / (1.0f + fabsf(z)); }

// ---- forward -------------------------------------------------------------

// Thread t < batch * kHidden: act[b][j] = softsign(b1[j] + sum_k W1[j][k] x[b][k]).
MLP_HD void forward_hidden(int t, int batch, const float *p, const float *x, float *act)
{
    if (t >= batch * kHidden)
        return;
    const int b = t / kHidden, j = t % kHidden;
    float z = p[kB1 + j];
    for (int k = 0; k < kIn; k++)
        z += p[kW1 + j * kIn + k] * x[b * kIn + k];
    act[t] = softsign(z);
}

// Thread b < batch: err[b] = (b2 + sum_j w2[j] act[b][j]) - y[b].
MLP_HD void forward_output(int b, int batch, const float *p, const float *act, const float *y, float *err)
{
    if (b >= batch)
        return;
    float out = p[kB2];
    for (int j = 0; j < kHidden; j++)
        out += p[kW2 + j] * act[b * kHidden + j];
    err[b] = out - y[b];
}

// ---- backward ------------------------------------------------------------
// loss = sum over the global batch of err^2 * inv_n, inv_n = 1 / (batch * world);
// d loss / d out[b] = (2 * err[b]) * inv_n.

// Thread j <= kHidden: j < kHidden: grad w2[j]; j == kHidden: grad b2 and
// this rank's share of the loss.
MLP_HD void backward_output(int j, int batch, float inv_n, const float *act, const float *err, float *grad)
{
    if (j > kHidden)
        return;
    if (j < kHidden) {
        float g = 0.0f;
        for (int b = 0; b < batch; b++)
            g += ((2.0f * err[b]) * inv_n) * act[b * kHidden + j];
        grad[kW2 + j] = g;
    } else {
        float g = 0.0f, loss = 0.0f;
        for (int b = 0; b < batch; b++) {
            g += (2.0f * err[b]) * inv_n;
            loss += err[b] * err[b];
        }
        grad[kB2] = g;
        grad[kLossSlot] = loss * inv_n;
    }
}

// Thread t < batch * kHidden: delta[b][j] = d loss / d z[b][j]
//   = ((2 err[b]) inv_n * w2[j]) * (1 - |act[b][j]|)^2.
MLP_HD void backward_delta(int t, int batch, float inv_n, const float *p, const float *act, const float *err,
                           float *delta)
{
    if (t >= batch * kHidden)
        return;
    const int b = t / kHidden, j = t % kHidden;
    const float s = 1.0f - fabsf(act[t]);
    delta[t] = (((2.0f * err[b]) * inv_n) * p[kW2 + j]) * (s * s);
}

// Thread t < kHidden * (kIn + 1): j = t / (kIn + 1), k = t % (kIn + 1);
// k < kIn: grad W1[j][k] = sum_b delta[b][j] x[b][k]; k == kIn: grad b1[j].
MLP_HD void backward_hidden(int t, int batch, const float *x, const float *delta, float *grad)
{
    if (t >= kHidden * (kIn + 1))
        return;
    const int j = t / (kIn + 1), k = t % (kIn + 1);
    float g = 0.0f;
    if (k < kIn) {
        for (int b = 0; b < batch; b++)
            g += delta[b * kHidden + j] * x[b * kIn + k];
        grad[kW1 + j * kIn + k] = g;
    } else {
        for (int b = 0; b < batch; b++)
            g += delta[b * kHidden + j];
        grad[kB1 + j] = g;
    }
}

// ---- optimizer -----------------------------------------------------------

// Thread i < n: one Adam step of parameter i with the (summed) gradient g[i].
// bias1 = 1 - beta1^t and bias2 = 1 - beta2^t are computed on the host in double.
MLP_HD void adam(int i, int n, float lr, float beta1, float beta2, float eps, float bias1, float bias2,
                 float *p, const float *g, float *m, float *v)
{
    if (i >= n)
        return;
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bias1;
    const float vhat = vi / bias2;
    p[i] = p[i] - (lr * mhat) / (sqrtf(vhat) + eps);
}

// ---- deterministic host-side data ---------------------------------------
// (Host only: the program generates parameters and batches on the CPU and
// copies them to the device, as a data loader would.)

inline uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Uniform in [-1, 1), a multiple of 2^-23: exact in float32.
inline float uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    const uint64_t key = splitmix64(seed + splitmix64(stream));
    const uint64_t h = splitmix64(key + index);
    return (float)((int64_t)(h >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
}

enum Stream : uint64_t { kStreamInit = 1, kStreamTeacher = 2, kStreamX = 3 };

// Initial parameters, PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
inline void init_params(uint64_t seed, float *p)
{
    const float a1 = (float)(1.0 / std::sqrt((double)kIn));
    const float a2 = (float)(1.0 / std::sqrt((double)kHidden));
    for (int i = 0; i < kParams; i++)
        p[i] = uniform(seed, kStreamInit, (uint64_t)i) * (i < kW2 ? a1 : a2);
}

// Sample number `global` (steps are 1-based; rank r of step s owns samples
// (s-1)*batch*world + r*batch + [0, batch)).  x ~ U[-1,1)^32;
// y = softsign(u . x) + 0.25 x0 x1 with a fixed "teacher" u ~ U[-0.5,0.5)^32.
inline void sample(uint64_t seed, uint64_t global, float *x, float *y)
{
    for (int k = 0; k < kIn; k++)
        x[k] = uniform(seed, kStreamX, global * kIn + (uint64_t)k);
    float t = 0.0f;
    for (int k = 0; k < kIn; k++)
        t += (uniform(seed, kStreamTeacher, (uint64_t)k) * 0.5f) * x[k];
    *y = softsign(t) + (0.25f * x[0]) * x[1];
}

}  // namespace mlp
