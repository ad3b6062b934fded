// mlp_kernels.cuh -- the six kernels of mlp.cu, one thread per output
// element, each a one-line wrapper around the per-thread function in
// mlp_math.h.  Included by mlp.cu and by benchmarks/transparent/kernel_time.cu
// (which times each kernel alone), so both launch exactly the same code.
#pragma once

#include "mlp_math.h"

extern "C" __global__ void mlp_forward_hidden(int batch, const float *p, const float *x, float *act)
{
    mlp::forward_hidden((int)(blockIdx.x * blockDim.x + threadIdx.x), batch, p, x, act);
}

extern "C" __global__ void mlp_forward_output(int batch, const float *p, const float *act, const float *y,
                                              float *err)
{
    mlp::forward_output((int)(blockIdx.x * blockDim.x + threadIdx.x), batch, p, act, y, err);
}

extern "C" __global__ void mlp_backward_output(int batch, float inv_n, const float *act, const float *err,
                                               float *grad)
{
    mlp::backward_output((int)(blockIdx.x * blockDim.x + threadIdx.x), batch, inv_n, act, err, grad);
}

extern "C" __global__ void mlp_backward_delta(int batch, float inv_n, const float *p, const float *act,
                                              const float *err, float *delta)
{
    mlp::backward_delta((int)(blockIdx.x * blockDim.x + threadIdx.x), batch, inv_n, p, act, err, delta);
}

extern "C" __global__ void mlp_backward_hidden(int batch, const float *x, const float *delta, float *grad)
{
    mlp::backward_hidden((int)(blockIdx.x * blockDim.x + threadIdx.x), batch, x, delta, grad);
}

extern "C" __global__ void mlp_adam(int n, float lr, float beta1, float beta2, float eps, float bias1, float bias2,
                                    float *p, const float *g, float *m, float *v)
{
    mlp::adam((int)(blockIdx.x * blockDim.x + threadIdx.x), n, lr, beta1, beta2, eps, bias1, bias2, p, g, m, v);
}
