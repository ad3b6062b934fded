// mlp_twins.cpp -- host twins of the kernels in mlp.cu, for the jitckpt CPU
// device emulator (emulator/README.md, "Kernels run as host twins").
//
// The emulator runs a kernel registered as NAME by calling
//     extern "C" void NAME__host(dim3 grid, dim3 block, size_t shared_mem, void **args)
// where args[i] points to a copy of the i-th kernel argument.  The kernels
// are declared extern "C", so NAME is the plain kernel name.
//
// This file is plain host C++ (no device code).  It is linked into the
// program, where the emulator finds the twins in the executable's symbol
// table (do not strip the binary), and it is also built on its own as
// build/libmlp_twins.so, for JITCKPT_SIMDEV_KERNELS: a device proxy that
// launches the program's kernels without containing its code needs that.
//
// On a GPU these functions are never called.
#include <cuda_runtime.h>  // dim3 only

#include <cstdio>
#include <cstdlib>

#include "mlp_math.h"

namespace {

// Runs body(t) for every global thread index t of a 1-D launch, in order:
// each thread's work is independent, so sequential order is a valid schedule.
template <typename Body>
void for_each_thread(const char *kernel, dim3 grid, dim3 block, Body body)
{
    if (grid.y != 1 || grid.z != 1 || block.y != 1 || block.z != 1) {
        std::fprintf(stderr, "%s__host: expected a 1-D launch, got grid (%u,%u,%u) block (%u,%u,%u)\n", kernel,
                     grid.x, grid.y, grid.z, block.x, block.y, block.z);
        std::abort();
    }
    const long n = (long)grid.x * (long)block.x;
    for (long t = 0; t < n; t++)
        body((int)t);
}

template <typename T> T arg(void **args, int i) { return *static_cast<T *>(args[i]); }

}  // namespace

// Each twin reads the arguments in the order of the kernel's parameter list
// in mlp.cu.

extern "C" void mlp_forward_hidden__host(dim3 grid, dim3 block, size_t, void **args)
{
    const int batch = arg<int>(args, 0);
    const float *p = arg<const float *>(args, 1);
    const float *x = arg<const float *>(args, 2);
    float *act = arg<float *>(args, 3);
    for_each_thread("mlp_forward_hidden", grid, block, [&](int t) { mlp::forward_hidden(t, batch, p, x, act); });
}

extern "C" void mlp_forward_output__host(dim3 grid, dim3 block, size_t, void **args)
{
    const int batch = arg<int>(args, 0);
    const float *p = arg<const float *>(args, 1);
    const float *act = arg<const float *>(args, 2);
    const float *y = arg<const float *>(args, 3);
    float *err = arg<float *>(args, 4);
    for_each_thread("mlp_forward_output", grid, block,
                    [&](int t) { mlp::forward_output(t, batch, p, act, y, err); });
}

extern "C" void mlp_backward_output__host(dim3 grid, dim3 block, size_t, void **args)
{
    const int batch = arg<int>(args, 0);
    const float inv_n = arg<float>(args, 1);
    const float *act = arg<const float *>(args, 2);
    const float *err = arg<const float *>(args, 3);
    float *grad = arg<float *>(args, 4);
    for_each_thread("mlp_backward_output", grid, block,
                    [&](int t) { mlp::backward_output(t, batch, inv_n, act, err, grad); });
}

extern "C" void mlp_backward_delta__host(dim3 grid, dim3 block, size_t, void **args)
{
    const int batch = arg<int>(args, 0);
    const float inv_n = arg<float>(args, 1);
    const float *p = arg<const float *>(args, 2);
    const float *act = arg<const float *>(args, 3);
    const float *err = arg<const float *>(args, 4);
    float *delta = arg<float *>(args, 5);
    for_each_thread("mlp_backward_delta", grid, block,
                    [&](int t) { mlp::backward_delta(t, batch, inv_n, p, act, err, delta); });
}

extern "C" void mlp_backward_hidden__host(dim3 grid, dim3 block, size_t, void **args)
{
    const int batch = arg<int>(args, 0);
    const float *x = arg<const float *>(args, 1);
    const float *delta = arg<const float *>(args, 2);
    float *grad = arg<float *>(args, 3);
    for_each_thread("mlp_backward_hidden", grid, block,
                    [&](int t) { mlp::backward_hidden(t, batch, x, delta, grad); });
}

extern "C" void mlp_adam__host(dim3 grid, dim3 block, size_t, void **args)
{
    const int n = arg<int>(args, 0);
    const float lr = arg<float>(args, 1);
    const float beta1 = arg<float>(args, 2);
    const float beta2 = arg<float>(args, 3);
    const float eps = arg<float>(args, 4);
    const float bias1 = arg<float>(args, 5);
    const float bias2 = arg<float>(args, 6);
    float *p = arg<float *>(args, 7);
    const float *g = arg<const float *>(args, 8);
    float *m = arg<float *>(args, 9);
    float *v = arg<float *>(args, 10);
    for_each_thread("mlp_adam", grid, block,
                    [&](int i) { mlp::adam(i, n, lr, beta1, beta2, eps, bias1, bias2, p, g, m, v); });
}
