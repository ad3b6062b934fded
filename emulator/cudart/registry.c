/* registry.c -- what nvcc-generated code registers at start-up: fatbinaries
 * (modules), kernels and device variables, and the queries about them.
 *
 * nvcc emits, per translation unit, a constructor that calls
 * __cudaRegisterFatBinary, then __cudaRegisterFunction for each kernel (host
 * stub address -> mangled device name) and __cudaRegisterVar for each
 * __device__/__constant__ variable (host shadow address -> device name),
 * then __cudaRegisterFatBinaryEnd; at exit it calls
 * __cudaUnregisterFatBinary.  A launch later names a kernel by its host stub
 * (cudaLaunchKernel) or by the cudaKernel_t that __cudaGetKernel returned
 * for that stub (the <<<>>> path in CUDA 13).
 *
 * Kernel and variable records are never freed: a stream worker may still be
 * running a kernel of a module that is being unregistered at exit. */

#include <stdlib.h>
#include <string.h>

#include "simdev.h"

#define BUCKETS 1024

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
/* Separate from reg_lock: resolving a twin may dlopen a library whose
 * constructors register kernels of their own. */
static pthread_mutex_t prepare_lock = PTHREAD_MUTEX_INITIALIZER;
static struct simdev_module *modules;
static struct simdev_kernel *by_fun[BUCKETS];
static struct simdev_var *vars;
int simdev_loading_twins;

struct handle_node {
    struct handle_node *next;
    const struct simdev_kernel *k;
};
static struct handle_node *by_handle[BUCKETS];

static size_t bucket(const void *p)
{
    uintptr_t v = (uintptr_t)p;
    return (size_t)((v >> 4) ^ (v >> 14)) % BUCKETS;
}

struct simdev_kernel *simdev_kernel_by_host_fun(const void *host_fun)
{
    pthread_mutex_lock(&reg_lock);
    struct simdev_kernel *k = by_fun[bucket(host_fun)];
    while (k && (k->host_fun != host_fun || k->module->unregistered))
        k = k->next;
    pthread_mutex_unlock(&reg_lock);
    return k;
}

struct simdev_kernel *simdev_kernel_by_handle(const void *handle)
{
    pthread_mutex_lock(&reg_lock);
    struct handle_node *n = by_handle[bucket(handle)];
    while (n && (const void *)n->k != handle)
        n = n->next;
    struct simdev_kernel *k = n && !n->k->module->unregistered ? (struct simdev_kernel *)n->k : NULL;
    pthread_mutex_unlock(&reg_lock);
    return k;
}

/* A function argument may be a host stub or a cudaKernel_t/cudaFunction_t. */
static struct simdev_kernel *kernel_from_func(const void *func)
{
    struct simdev_kernel *k = simdev_kernel_by_host_fun(func);
    return k ? k : simdev_kernel_by_handle(func);
}

cudaError_t simdev_kernel_prepare(struct simdev_kernel *k)
{
    pthread_mutex_lock(&prepare_lock);
    if (!k->resolved) {
        char searched[1024];
        k->twin = simdev_twin_lookup(k->name, k->host_fun, searched, sizeof searched);
        if (!k->twin) {
            simdev_log("no host twin for kernel %s: define extern \"C\" void %s__host(dim3 grid, "
                       "dim3 block, size_t shared_mem, void **args) in a library named in "
                       "JITCKPT_SIMDEV_KERNELS or in the program (searched: %s)",
                       k->name, k->name, searched);
            k->resolve_error = cudaErrorInvalidDeviceFunction;
        } else if (!simdev_fatbin_param_layout(k->module->wrapper, k->name, &k->layout)) {
            simdev_log("kernel %s: its fatbinary has no parameter information (EIATTR_KPARAM_INFO "
                       "or PTX .entry), so its arguments cannot be copied for an asynchronous "
                       "launch", k->name);
            k->resolve_error = cudaErrorInvalidKernelImage;
        }
        k->resolved = 1;
    }
    cudaError_t err = k->resolve_error;
    pthread_mutex_unlock(&prepare_lock);
    return err;
}

/* ---- hidden registration entry points ----------------------------------- */

void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize);
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                       const char *deviceName, int ext, size_t size, int constant, int global);
void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                              char *deviceAddress, const char *deviceName, int ext, size_t size,
                              int constant, int global);
char __cudaInitModule(void **fatCubinHandle);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);

void **__cudaRegisterFatBinary(void *fatCubin)
{
    simdev_init();
    struct simdev_module *m = calloc(1, sizeof *m);
    if (!m) {
        simdev_log("out of memory registering a fatbinary");
        abort();
    }
    m->wrapper = fatCubin;
    m->twin = simdev_loading_twins;
    pthread_mutex_lock(&reg_lock);
    m->next = modules;
    modules = m;
    pthread_mutex_unlock(&reg_lock);
    return (void **)m;
}

void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
    (void)fatCubinHandle;       /* nothing is loaded eagerly */
}

void __cudaUnregisterFatBinary(void **fatCubinHandle)
{
    struct simdev_module *m = (struct simdev_module *)fatCubinHandle;
    pthread_mutex_lock(&reg_lock);
    m->unregistered = 1;
    pthread_mutex_unlock(&reg_lock);
}

void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)deviceFun; (void)thread_limit; (void)tid; (void)bid; (void)bDim; (void)gDim;
    (void)wSize;
    struct simdev_kernel *k = calloc(1, sizeof *k);
    struct handle_node *n = calloc(1, sizeof *n);
    if (!k || !n) {
        simdev_log("out of memory registering kernel %s", deviceName);
        abort();
    }
    k->host_fun = hostFun;
    k->name = deviceName;
    k->module = (struct simdev_module *)fatCubinHandle;
    n->k = k;
    pthread_mutex_lock(&reg_lock);
    size_t b = bucket(hostFun);
    k->next = by_fun[b];
    by_fun[b] = k;
    b = bucket(k);
    n->next = by_handle[b];
    by_handle[b] = n;
    pthread_mutex_unlock(&reg_lock);
}

static void add_var(struct simdev_var *v)
{
    pthread_mutex_lock(&reg_lock);
    v->next = vars;
    vars = v;
    pthread_mutex_unlock(&reg_lock);
}

void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                       const char *deviceName, int ext, size_t size, int constant, int global)
{
    (void)deviceAddress; (void)ext; (void)global;
    struct simdev_var *v = calloc(1, sizeof *v);
    if (!v) {
        simdev_log("out of memory registering variable %s", deviceName);
        abort();
    }
    v->host_var = hostVar;
    v->name = deviceName;
    v->size = size;
    v->constant = constant;
    v->module = (struct simdev_module *)fatCubinHandle;
    add_var(v);
}

void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                              char *deviceAddress, const char *deviceName, int ext, size_t size,
                              int constant, int global)
{
    (void)deviceAddress; (void)ext; (void)global;
    struct simdev_var *v = calloc(1, sizeof *v);
    if (!v) {
        simdev_log("out of memory registering variable %s", deviceName);
        abort();
    }
    v->host_var = hostVarPtrAddress;
    v->name = deviceName;
    v->size = size;
    v->constant = constant;
    v->managed = 1;
    v->managed_slot = hostVarPtrAddress;
    v->module = (struct simdev_module *)fatCubinHandle;
    add_var(v);
}

/* Gives a variable its emulated storage, initialised from the device image.
 * Caller holds reg_lock. */
static cudaError_t materialise_locked(struct simdev_var *v)
{
    if (v->storage)
        return cudaSuccess;
    void *p = NULL;
    cudaError_t err = simdev_mem_alloc(v->managed ? SIMDEV_MEM_MANAGED : SIMDEV_MEM_SYMBOL, 0,
                                       v->size ? v->size : 1, 0, &p);
    if (err != cudaSuccess)
        return err;
    memset(p, 0, v->size);
    simdev_fatbin_var_init(v->module->wrapper, v->name, p, v->size);
    v->storage = p;
    if (v->managed_slot)
        *v->managed_slot = p;
    return cudaSuccess;
}

char __cudaInitModule(void **fatCubinHandle)
{
    simdev_init();
    struct simdev_module *m = (struct simdev_module *)fatCubinHandle;
    pthread_mutex_lock(&reg_lock);
    int ok = 1;
    for (struct simdev_var *v = vars; v; v = v->next)
        if (v->module == m && v->managed && materialise_locked(v) != cudaSuccess)
            ok = 0;
    pthread_mutex_unlock(&reg_lock);
    return (char)ok;
}

cudaError_t simdev_var_lookup(const void *symbol, struct simdev_var **out)
{
    pthread_mutex_lock(&reg_lock);
    struct simdev_var *v = vars;
    while (v && (v->host_var != symbol || v->module->unregistered))
        v = v->next;
    /* A twin library built by nvcc registered its own copy of the program's
     * variables (the device proxy loads the program's twins that way): a twin
     * that asks for its copy gets the program's variable of the same name, as
     * the device code it stands for would use. */
    if (v && v->module->twin)
        for (struct simdev_var *p = vars; p; p = p->next)
            if (!p->module->twin && !p->module->unregistered && strcmp(p->name, v->name) == 0) {
                v = p;
                break;
            }
    cudaError_t err = cudaErrorInvalidSymbol;
    if (v)
        err = materialise_locked(v);
    pthread_mutex_unlock(&reg_lock);
    if (!v)
        simdev_trace("%p is not a registered __device__ or __constant__ variable", symbol);
    if (err == cudaSuccess)
        *out = v;
    return err;
}

cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun)
{
    simdev_init();
    struct simdev_kernel *k = simdev_kernel_by_host_fun(hostFun);
    if (!kernel || !k)
        return simdev_return(cudaErrorInvalidDeviceFunction);
    *kernel = (cudaKernel_t)k;
    return cudaSuccess;
}

/* ---- libraries (cudaLibraryLoadData) ------------------------------------- */

static void add_handle_locked(struct simdev_kernel *k, struct handle_node *n)
{
    n->k = k;
    size_t b = bucket(k);
    n->next = by_handle[b];
    by_handle[b] = n;
}

struct simdev_module *simdev_library_new(const void *code)
{
    struct simdev_module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->wrapper = code;
    m->is_library = 1;
    pthread_mutex_lock(&reg_lock);
    m->next = modules;
    modules = m;
    pthread_mutex_unlock(&reg_lock);
    return m;
}

struct simdev_module *simdev_library_check(const void *handle)
{
    pthread_mutex_lock(&reg_lock);
    struct simdev_module *m = modules;
    while (m && ((const void *)m != handle || !m->is_library || m->unregistered))
        m = m->next;
    pthread_mutex_unlock(&reg_lock);
    return m;
}

void simdev_library_unload(struct simdev_module *m)
{
    pthread_mutex_lock(&reg_lock);
    m->unregistered = 1;
    pthread_mutex_unlock(&reg_lock);
    /* Kernel records stay (queued launches use them); the code goes. */
    simdev_fatbin_forget(m->wrapper);
    free((void *)m->wrapper);
    m->wrapper = NULL;
}

struct simdev_kernel *simdev_library_kernel(struct simdev_module *m, const char *name)
{
    struct simdev_param_layout probe;
    pthread_mutex_lock(&reg_lock);
    struct simdev_kernel *k = m->library_kernels;
    while (k && strcmp(k->name, name) != 0)
        k = k->next;
    pthread_mutex_unlock(&reg_lock);
    if (k)
        return k;
    if (!simdev_fatbin_param_layout(m->wrapper, name, &probe))
        return NULL;
    k = calloc(1, sizeof *k);
    struct handle_node *n = calloc(1, sizeof *n);
    char *copy = strdup(name);
    if (!k || !n || !copy) {
        free(k);
        free(n);
        free(copy);
        return NULL;
    }
    k->name = copy;
    k->module = m;
    pthread_mutex_lock(&reg_lock);
    k->next = m->library_kernels;
    m->library_kernels = k;
    add_handle_locked(k, n);
    pthread_mutex_unlock(&reg_lock);
    return k;
}

/* ---- public queries ----------------------------------------------------- */

cudaError_t cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr)
{
    cudaError_t err = simdev_enter("cudaGetKernel", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_kernel *k = kernel_from_func(entryFuncAddr);
    if (!kernelPtr || !k)
        return simdev_return(kernelPtr ? cudaErrorInvalidDeviceFunction : cudaErrorInvalidValue);
    *kernelPtr = (cudaKernel_t)k;
    return cudaSuccess;
}

cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr)
{
    cudaError_t err = simdev_enter("cudaGetFuncBySymbol", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_kernel *k = kernel_from_func(symbolPtr);
    if (!functionPtr || !k)
        return simdev_return(functionPtr ? cudaErrorInvalidDeviceFunction : cudaErrorInvalidValue);
    *functionPtr = (cudaFunction_t)k;
    return cudaSuccess;
}

cudaError_t cudaFuncGetName(const char **name, const void *func)
{
    cudaError_t err = simdev_enter("cudaFuncGetName", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_kernel *k = kernel_from_func(func);
    if (!name || !k)
        return simdev_return(name ? cudaErrorInvalidDeviceFunction : cudaErrorInvalidValue);
    *name = k->name;
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    cudaError_t err = simdev_enter("cudaFuncGetAttributes", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_kernel *k = kernel_from_func(func);
    if (!attr || !k)
        return simdev_return(attr ? cudaErrorInvalidDeviceFunction : cudaErrorInvalidValue);
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = 80;
    attr->binaryVersion = 80;
    attr->maxDynamicSharedSizeBytes = k->max_dynamic_shared ? k->max_dynamic_shared : 48 * 1024;
    attr->preferredShmemCarveout = -1;
    return cudaSuccess;
}

/* Occupancy, as cudaFuncGetAttributes describes a kernel here (1024 threads a block, no register limit) on an
 * emulated SM of 2048 threads and 32 blocks: floor(2048 / blockSize rounded up to a warp), at most 32, and 0
 * when the dynamic shared memory asked for exceeds the kernel's limit.  A pure function of the arguments. */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, const void *func, int blockSize,
                                                                   size_t dynamicSMemSize, unsigned int flags)
{
    cudaError_t err = simdev_enter("cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_kernel *k = kernel_from_func(func);
    if (!k)
        return simdev_return(cudaErrorInvalidDeviceFunction);
    if (!numBlocks || blockSize <= 0 || blockSize > 1024 ||
        (flags != cudaOccupancyDefault && flags != cudaOccupancyDisableCachingOverride))
        return simdev_return(cudaErrorInvalidValue);
    size_t limit = k->max_dynamic_shared ? (size_t)k->max_dynamic_shared : 48 * 1024;
    int warps = (blockSize + 31) / 32;
    int blocks = 2048 / (warps * 32);
    *numBlocks = dynamicSMemSize > limit ? 0 : blocks > 32 ? 32 : blocks;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func, int blockSize,
                                                          size_t dynamicSMemSize)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize,
                                                                  cudaOccupancyDefault);
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    cudaError_t err = simdev_enter("cudaFuncSetAttribute", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_kernel *k = kernel_from_func(func);
    if (!k)
        return simdev_return(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > 163 * 1024)
            return simdev_return(cudaErrorInvalidValue);
        k->max_dynamic_shared = value;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig)
{
    (void)cacheConfig;
    cudaError_t err = simdev_enter("cudaFuncSetCacheConfig", NULL);
    if (err == cudaSuccess && !kernel_from_func(func))
        err = cudaErrorInvalidDeviceFunction;
    return simdev_return(err);
}

cudaError_t cudaFuncGetParamInfo(const void *func, size_t paramIndex, size_t *paramOffset,
                                 size_t *paramSize)
{
    cudaError_t err = simdev_enter("cudaFuncGetParamInfo", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_kernel *k = kernel_from_func(func);
    if (!k)
        return simdev_return(cudaErrorInvalidDeviceFunction);
    struct simdev_param_layout layout;
    if (!simdev_fatbin_param_layout(k->module->wrapper, k->name, &layout))
        return simdev_return(cudaErrorInvalidKernelImage);
    if (paramIndex >= (size_t)layout.nparams)
        return simdev_return(cudaErrorInvalidValue);
    if (paramOffset)
        *paramOffset = layout.offset[paramIndex];
    if (paramSize)
        *paramSize = layout.size[paramIndex];
    return cudaSuccess;
}

cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
    cudaError_t err = simdev_enter("cudaGetSymbolAddress", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_var *v;
    if (!devPtr)
        return simdev_return(cudaErrorInvalidValue);
    err = simdev_var_lookup(symbol, &v);
    if (err == cudaSuccess)
        *devPtr = v->storage;
    return simdev_return(err);
}

cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol)
{
    cudaError_t err = simdev_enter("cudaGetSymbolSize", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_var *v;
    if (!size)
        return simdev_return(cudaErrorInvalidValue);
    err = simdev_var_lookup(symbol, &v);
    if (err == cudaSuccess)
        *size = v->size;
    return simdev_return(err);
}
