/* launch.c -- kernel launches and host functions on streams.
 *
 * `kernel<<<grid, block, shmem, stream>>>(a, b)` compiles (nvcc 13) to
 * __cudaPushCallConfiguration(grid, block, shmem, stream) followed by a call
 * of the kernel's host stub, which calls __cudaPopCallConfiguration, gets a
 * cudaKernel_t once from __cudaGetKernel and calls __cudaLaunchKernel with an
 * array of pointers to its parameters.  Those pointers point into the stub's
 * stack frame, so the launch copies the values (sizes from the device image,
 * see fatbin.c) and queues a call of the kernel's host twin on the stream. */

#include <stdlib.h>
#include <string.h>

#include "simdev.h"

/* ---- call configuration stack ------------------------------------------ */

#define CONFIG_DEPTH 16

struct call_config {
    dim3 grid, block;
    size_t shared_mem;
    cudaStream_t stream;
};

static __thread struct call_config config_stack[CONFIG_DEPTH];
static __thread int config_depth;

unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void **args, size_t sharedMem, cudaStream_t stream);

unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st *stream)
{
    if (config_depth == CONFIG_DEPTH)
        return 1;
    struct call_config *c = &config_stack[config_depth++];
    c->grid = gridDim;
    c->block = blockDim;
    c->shared_mem = sharedMem;
    c->stream = stream;
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream)
{
    if (config_depth == 0)
        return simdev_return(cudaErrorMissingConfiguration);
    struct call_config *c = &config_stack[--config_depth];
    *gridDim = c->grid;
    *blockDim = c->block;
    *sharedMem = c->shared_mem;
    *(cudaStream_t *)stream = c->stream;
    return cudaSuccess;
}

/* ---- kernels ------------------------------------------------------------ */

struct kernel_job {
    simdev_twin_fn twin;
    dim3 grid, block;
    size_t shared_mem;
    void **argv;
    unsigned char *params;
};

static void run_kernel(void *arg)
{
    struct kernel_job *j = arg;
    j->twin(j->grid, j->block, j->shared_mem, j->argv);
}

static void free_kernel(void *arg)
{
    struct kernel_job *j = arg;
    free(j->argv);
    free(j->params);
    free(j);
}

static int bad_config(dim3 g, dim3 b)
{
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    return g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 ||
           g.z > 65535 || threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 ||
           b.z > 64;
}

cudaError_t simdev_launch(struct simdev_kernel *k, dim3 grid, dim3 block, void **args,
                          size_t shared_mem, cudaStream_t stream, int ptds)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter_kernel(k ? k->name : "", &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!k)
        return simdev_return(cudaErrorInvalidDeviceFunction);
    if (bad_config(grid, block)) {
        simdev_trace("launch of %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)",
                     k->name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return simdev_return(cudaErrorInvalidConfiguration);
    }
    err = simdev_kernel_prepare(k);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (k->layout.nparams > 0 && !args)
        return simdev_return(cudaErrorInvalidValue);

    struct kernel_job *j = calloc(1, sizeof *j);
    int n = k->layout.nparams;
    if (j) {
        j->argv = calloc((size_t)(n ? n : 1), sizeof *j->argv);
        j->params = aligned_alloc(16, (k->layout.total + 16) / 16 * 16);
    }
    if (!j || !j->argv || !j->params) {
        if (j)
            free_kernel(j);
        return simdev_return(cudaErrorMemoryAllocation);
    }
    for (int i = 0; i < n; i++) {
        memcpy(j->params + k->layout.offset[i], args[i], k->layout.size[i]);
        j->argv[i] = j->params + k->layout.offset[i];
    }
    j->twin = k->twin;
    j->grid = grid;
    j->block = block;
    j->shared_mem = shared_mem;
    return simdev_return(simdev_submit_call(stream, ptds, k->name, run_kernel, j, free_kernel,
                                            &hit, NULL, NULL));
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream)
{
    return simdev_launch(simdev_kernel_by_handle(kernel), gridDim, blockDim, args, sharedMem,
                         stream, 0);
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void **args, size_t sharedMem, cudaStream_t stream)
{
    return simdev_launch(simdev_kernel_by_handle(kernel), gridDim, blockDim, args, sharedMem,
                         stream, 1);
}

static struct simdev_kernel *kernel_from_func(const void *func)
{
    struct simdev_kernel *k = simdev_kernel_by_host_fun(func);
    return k ? k : simdev_kernel_by_handle(func);
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream)
{
    return simdev_launch(kernel_from_func(func), gridDim, blockDim, args, sharedMem, stream, 0);
}

cudaError_t simdev_launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args,
                             int ptds)
{
    if (!config)
        return simdev_return(cudaErrorInvalidValue);
    return simdev_launch(kernel_from_func(func), config->gridDim, config->blockDim, args,
                         config->dynamicSmemBytes, config->stream, ptds);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    return simdev_launch_ex(config, func, args, 0);
}

/* ---- host functions ----------------------------------------------------- */

struct host_job {
    cudaHostFn_t fn;
    cudaStreamCallback_t cb;
    cudaStream_t stream;
    void *user_data;
};

static void run_host(void *arg)
{
    struct host_job *j = arg;
    if (j->fn)
        j->fn(j->user_data);
    else
        j->cb(j->stream, cudaSuccess, j->user_data);
}

cudaError_t simdev_launch_host_func(cudaStream_t stream, cudaHostFn_t fn, void *user_data,
                                    int ptds, const char *op)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter(op, &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!fn)
        return simdev_return(cudaErrorInvalidValue);
    struct host_job *j = calloc(1, sizeof *j);
    if (!j)
        return simdev_return(cudaErrorMemoryAllocation);
    j->fn = fn;
    j->user_data = user_data;
    return simdev_return(simdev_submit_call(stream, ptds, op, run_host, j, free, &hit, NULL,
                                            NULL));
}

cudaError_t simdev_stream_add_callback(cudaStream_t stream, cudaStreamCallback_t cb,
                                       void *user_data, unsigned flags, int ptds)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter("cudaStreamAddCallback", &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!cb || flags != 0)
        return simdev_return(cudaErrorInvalidValue);
    struct host_job *j = calloc(1, sizeof *j);
    if (!j)
        return simdev_return(cudaErrorMemoryAllocation);
    j->cb = cb;
    j->stream = stream;
    j->user_data = user_data;
    return simdev_return(simdev_submit_call(stream, ptds, "cudaStreamAddCallback", run_host, j,
                                            free, &hit, NULL, NULL));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    return simdev_launch_host_func(stream, fn, userData, 0, "cudaLaunchHostFunc");
}

cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                  void *userData, unsigned int flags)
{
    return simdev_stream_add_callback(stream, callback, userData, flags, 0);
}
