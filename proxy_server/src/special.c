/* special.c -- the hand-written half of the dispatch: nvcc's hidden
 * registration entry points, kernel launches and parameter layouts.
 *
 * Registration: the worker sends the fatbinary image's bytes; the proxy
 * keeps its own copy for the life of the process, wraps it in a fatbinary
 * wrapper of its own and registers that with its runtime.  Kernels and
 * device variables are registered under the worker's host-stub and
 * host-shadow addresses, which the runtime uses only as keys (on the
 * emulator; on a GPU the real runtime does the same -- unverified on GPU).
 * Names stay allocated: the runtime keeps the pointers.
 *
 * Launches: the kernel's parameter layout comes from the runtime
 * (cudaFuncGetParamInfo: on the emulator, emulator/cudart/fatbin.c's parser
 * of the registered image), so there is one parser; the worker asks for the
 * sizes once per kernel (JITCKPT_RFN_PARAM_SIZES) and sends the arguments'
 * bytes in that order. */

#include "dispatch.h"

#include <stdlib.h>


#define WRAPPER_MAGIC 0x466243b1u
#define MAX_PARAMS 256

typedef void **register_fatbinary_fn(void *fatCubin);
typedef void register_fatbinary_end_fn(void **fatCubinHandle);
typedef void register_function_fn(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                  const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                                  dim3 *bDim, dim3 *gDim, int *wSize);
typedef void register_var_fn(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                             const char *deviceName, int ext, size_t size, int constant, int global);
typedef char init_module_fn(void **fatCubinHandle);
typedef cudaError_t get_kernel_fn(cudaKernel_t *kernel, const void *hostFun);
typedef cudaError_t launch_hidden_fn(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                     size_t sharedMem, cudaStream_t stream);

static register_fatbinary_fn *real_register_fatbinary;
static register_fatbinary_end_fn *real_register_fatbinary_end;
static register_function_fn *real_register_function;
static register_var_fn *real_register_var;
static init_module_fn *real_init_module;
static get_kernel_fn *real_get_kernel;
static launch_hidden_fn *real_launch_hidden;
static __typeof__(cudaLaunchKernel) *real_launch;
static __typeof__(cudaFuncGetParamInfo) *real_param_info;
static __typeof__(cudaPeekAtLastError) *real_peek_error;
static __typeof__(cudaGetLastError) *real_get_error;

const char *special_resolve(void *lib)
{
#define RESOLVE(var, name) if ((var = (__typeof__(var))proxy_sym(lib, name)) == NULL) return name
    RESOLVE(real_register_fatbinary, "__cudaRegisterFatBinary");
    RESOLVE(real_register_fatbinary_end, "__cudaRegisterFatBinaryEnd");
    RESOLVE(real_register_function, "__cudaRegisterFunction");
    RESOLVE(real_register_var, "__cudaRegisterVar");
    RESOLVE(real_init_module, "__cudaInitModule");
    RESOLVE(real_get_kernel, "__cudaGetKernel");
    RESOLVE(real_launch_hidden, "__cudaLaunchKernel");
    RESOLVE(real_launch, "cudaLaunchKernel");
    RESOLVE(real_param_info, "cudaFuncGetParamInfo");
    RESOLVE(real_peek_error, "cudaPeekAtLastError");
    RESOLVE(real_get_error, "cudaGetLastError");
#undef RESOLVE
    return NULL;
}

/* The proxy's own copy of a fatbinary and the wrapper around it (never freed:
 * the runtime keeps pointing at both). */
struct wrapper { uint32_t magic, version; const void *data; void *prelinked; };

static int32_t register_fatbinary(struct rdisp *d)
{
    const void *image = NULL;
    if (rd_host_in(d, &image) != 0 || image == NULL)
        return RD_BAD;
    uint64_t n;
    memcpy(&n, d->w->req, sizeof n);    /* the size that rd_host_in just read: the request's first field */
    void *copy = malloc(n);
    struct wrapper *w = malloc(sizeof *w);
    if (!copy || !w)
        return cudaErrorMemoryAllocation;
    memcpy(copy, image, n);
    *w = (struct wrapper){WRAPPER_MAGIC, 1, copy, NULL};
    void **handle = real_register_fatbinary(w);
    rd_put_new_handle(d, VH_MODULE, handle);
    pdebug("registered a fatbinary of %llu bytes", (unsigned long long)n);
    return handle ? 0 : cudaErrorInvalidKernelImage;
}

static int32_t module_handle(struct rdisp *d, void ***handle)
{
    uint64_t vid;
    return rd_get_handle(d, VH_MODULE, &vid, (void **)handle) == 0 && *handle ? 0 : -1;
}

static int32_t register_function(struct rdisp *d)
{
    void **module;
    const char *host_fun;
    char *device_fun, *device_name;
    int thread_limit;
    if (module_handle(d, &module) || rd_get(d, &host_fun, sizeof host_fun) ||
        rd_get_string(d, &device_fun) || rd_get_string(d, &device_name) ||
        rd_get(d, &thread_limit, sizeof thread_limit))
        return RD_BAD;
    real_register_function(module, host_fun, device_fun, device_name, thread_limit, NULL, NULL, NULL, NULL,
                           NULL);
    pdebug("registered kernel %s", device_name ? device_name : "?");
    return 0;
}

static int32_t register_var(struct rdisp *d)
{
    void **module;
    char *host_var, *device_address, *device_name;
    int ext, constant, global;
    size_t size;
    if (module_handle(d, &module) || rd_get(d, &host_var, sizeof host_var) ||
        rd_get_string(d, &device_address) || rd_get_string(d, &device_name) || rd_get(d, &ext, sizeof ext) ||
        rd_get(d, &size, sizeof size) || rd_get(d, &constant, sizeof constant) ||
        rd_get(d, &global, sizeof global))
        return RD_BAD;
    real_register_var(module, host_var, device_address, device_name, ext, size, constant, global);
    return 0;
}

static int32_t get_kernel(struct rdisp *d)
{
    const void *host_fun;
    if (rd_get(d, &host_fun, sizeof host_fun))
        return RD_BAD;
    cudaKernel_t kernel = NULL;
    cudaError_t err = real_get_kernel(&kernel, host_fun);
    rd_put_new_handle(d, VH_KERNEL, err == cudaSuccess ? kernel : NULL);
    return err;
}

/* The function a launch names: a host stub (by value) or a virtual kernel id. */
static int launch_target(uint64_t key, int is_handle, const void **func)
{
    if (!is_handle) {
        *func = (const void *)(uintptr_t)key;
        return 0;
    }
    return vh_lookup(VH_KERNEL, key, (void **)func);
}

static int32_t param_sizes(struct rdisp *d)
{
    uint64_t key;
    int is_handle;
    const void *func;
    if (rd_get(d, &key, sizeof key) || rd_get(d, &is_handle, sizeof is_handle))
        return RD_BAD;
    if (launch_target(key, is_handle, &func) != 0)
        return cudaErrorInvalidResourceHandle;
    uint64_t size[MAX_PARAMS];
    uint32_t n = 0;
    /* The query past the last parameter fails, and a failed call becomes the
     * thread's last error: keep the program's own (an earlier error survives
     * only as cudaErrorInvalidValue: a known imperfection). */
    cudaError_t before = real_peek_error();
    for (; n < MAX_PARAMS; n++) {
        size_t offset, sz;
        cudaError_t err = real_param_info(func, n, &offset, &sz);
        if (err == cudaErrorInvalidValue)
            break;                      /* past the last parameter */
        if (err != cudaSuccess)
            return err;
        size[n] = sz;
    }
    if (before == cudaSuccess)
        real_get_error();
    rd_put(d, &n, sizeof n);
    rd_put(d, size, n * sizeof size[0]);
    return 0;
}

static int32_t launch(struct rdisp *d, int is_handle)
{
    uint64_t key, stream_vid;
    dim3 grid, block;
    size_t shmem;
    uint32_t n;
    cudaStream_t stream;
    const void *func;
    if (rd_get(d, &key, sizeof key) || rd_get(d, &grid, sizeof grid) || rd_get(d, &block, sizeof block) ||
        rd_get(d, &shmem, sizeof shmem))
        return RD_BAD;
    if (rd_get_handle(d, VH_STREAM, &stream_vid, (void **)&stream) != 0 ||
        launch_target(key, is_handle, &func) != 0)
        return cudaErrorInvalidResourceHandle;
    if (rd_get(d, &n, sizeof n) || n > MAX_PARAMS)
        return RD_BAD;
    /* The arguments' bytes, in order; sizes from the same layout the worker used. */
    void *args[MAX_PARAMS];
    for (uint32_t i = 0; i < n; i++) {
        size_t offset, sz;
        if (real_param_info(func, i, &offset, &sz) != cudaSuccess || d->req + sz > d->req_len)
            return RD_BAD;
        args[i] = d->w->req + d->req;    /* the runtime copies them before it returns */
        d->req += sz;
    }
    if (is_handle)
        return real_launch_hidden((cudaKernel_t)func, grid, block, args, shmem, stream);
    return real_launch(func, grid, block, args, shmem, stream);
}

/* cudaMalloc and cudaFree: device memory in the proxy's reserved range, so
 * that a restarted proxy can re-create it at the same addresses (devmem.c).
 * The wire is the generated one (api_facts.py: devPtr an output, size by value;
 * cudaFree's pointer by value). */
static int32_t malloc_in_range(struct rdisp *d)
{
    void *p = NULL;
    int want = rd_flag(d);
    size_t size;
    if (rd_get(d, &size, sizeof size))
        return RD_BAD;
    int32_t err = devmem_malloc(want ? &p : NULL, size);
    if (err == 0 && want)
        rd_put(d, &p, sizeof p);
    return err;
}

static int32_t free_in_range(struct rdisp *d)
{
    void *p;
    if (rd_get(d, &p, sizeof p))
        return RD_BAD;
    if (p != NULL && alloc_is_deferred(p))
        return cudaErrorInvalidValue;            /* cudaFreeAsync'ed already (alloc.c) */
    return devmem_free(p);
}

int32_t dispatch_special(unsigned fn, struct rdisp *d, int *handled)
{
    *handled = 1;
    switch (fn) {
    case RFN_cudaMalloc: {
        int32_t err = malloc_in_range(d);
        proxy_note_error(err);
        return err;
    }
    case RFN_cudaFree: return free_in_range(d);
    case RFN_cudaMallocPitch: case RFN_cudaMallocAsync: case RFN_cudaFreeAsync: case RFN_cudaDeviceReset:
    case RFN_ncclMemAlloc: case RFN_ncclMemFree: return dispatch_alloc(fn, d);      /* alloc.c */
    case RFN_cudaDeviceSynchronize: return alloc_device_synchronize();            /* alloc.c: and its frees */
    case RFN_ncclCommInitAll: return dispatch_nccl_init_all(d);                   /* nccl_init.c */
    case RFN_cudaLaunchHostFunc: case RFN_cudaStreamAddCallback: return dispatch_hostfn(fn, d);  /* hostfn.c */
    case RFN_cudaLibraryLoadData: case RFN_cudaLibraryEnumerateKernels: return dispatch_library(fn, d);  /* library.c */
    case RFN_cudaStreamGetCaptureInfo: return dispatch_capture_info(d);           /* graphs.c */
    case RFN_ncclGetLastError: return dispatch_nccl_last_error(d);               /* nccl_init.c */
    case RFN___cudaRegisterFatBinary: return register_fatbinary(d);
    case RFN___cudaRegisterFunction: return register_function(d);
    case RFN___cudaRegisterVar: return register_var(d);
    case RFN___cudaGetKernel: return get_kernel(d);
    case RFN_cudaLaunchKernel: return launch(d, 0);
    case RFN___cudaLaunchKernel: return launch(d, 1);
#ifdef JITCKPT_REMOTE_CUBLASLT
    case RFN_cublasLtMatmul: case RFN_cublasLtMatmulAlgoGetHeuristic: case RFN_cublasLtMatmulDescGetAttribute:
    case RFN_cublasLtMatrixLayoutGetAttribute: case RFN_cublasLtMatmulPreferenceGetAttribute:
        return dispatch_blaslt(fn, d);                                            /* blaslt.c */
#endif
#ifdef JITCKPT_REMOTE_CUDNN
    case RFN_cudnnBackendCreateDescriptor: case RFN_cudnnBackendDestroyDescriptor: case RFN_cudnnBackendSetAttribute:
    case RFN_cudnnBackendGetAttribute: case RFN_cudnnBackendFinalize: case RFN_cudnnBackendExecute:
    case RFN_cudnnBackendInitialize: case RFN_cudnnGetLastErrorString:
        return dispatch_dnn(fn, d);                                               /* dnn.c */
#endif
    case JITCKPT_RFN_PARAM_SIZES: return param_sizes(d);
    case JITCKPT_RFN_HOST_REGISTER:
    case JITCKPT_RFN_HOST_UNREGISTER: return dispatch_pinned(fn, d);      /* pinned.c */
    case RFN___cudaRegisterFatBinaryEnd:
    case RFN___cudaInitModule: {
        void **module;
        if (module_handle(d, &module))
            return RD_BAD;
        if (fn == RFN___cudaInitModule)
            return real_init_module(module);
        real_register_fatbinary_end(module);
        return 0;
    }
    default:
        return dispatch_restore(fn, d, handled);      /* the restart protocol, or not handled */
    }
}
