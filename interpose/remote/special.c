/* special.c -- the hand-written remote functions: nvcc's hidden registration
 * and launch entry points, and kernel launches (pinned host memory: pinned.c).
 *
 * Registration: __cudaRegisterFatBinary sends the fatbinary image's bytes
 * (its size from the fatbinary header); the proxy registers its own copy and
 * answers with a virtual module id, which is the handle nvcc's code keeps.
 * Kernels and device variables are registered under the worker's host-stub
 * and host-shadow addresses, which the proxy's runtime uses only as keys.
 *
 * Launches: a kernel's parameter sizes come from the proxy (which asks its
 * runtime: the emulator reads them from the fatbinary's parameter layout,
 * emulator/cudart/fatbin.c) once per kernel; the arguments are copied by
 * size into the request.  The launch configuration stack of <<<...>>> is
 * per thread and never leaves the worker. */

#include <stdlib.h>
#include <string.h>

#include "remote.h"
#include "track.h"

/* ---- registration ------------------------------------------------------------ */

#define WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xba55ed50u

void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize);
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                       const char *deviceName, int ext, size_t size, int constant, int global);
char __cudaInitModule(void **fatCubinHandle);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);

/* The bytes of the fatbinary an nvcc wrapper points to, or 0 if it is not one
 * remote mode can send (relocatable device code links several: refused). */
static size_t fatbin_image(const void *wrapper, const unsigned char **data)
{
    const unsigned char *w = wrapper;
    uint32_t magic, version;
    memcpy(&magic, w, 4);
    memcpy(&version, w + 4, 4);
    if (magic != WRAPPER_MAGIC)
        return 0;
    memcpy(data, w + 8, sizeof *data);
    void *prelinked = NULL;
    if (version == 2)
        memcpy(&prelinked, w + 16, sizeof prelinked);
    if (prelinked != NULL || *data == NULL)
        return 0;
    uint32_t fmagic;
    uint16_t header;
    uint64_t size;
    memcpy(&fmagic, *data, 4);
    memcpy(&header, *data + 6, 2);
    memcpy(&size, *data + 8, 8);
    return fmagic == FATBIN_MAGIC ? header + (size_t)size : 0;
}

EXPORT void **__cudaRegisterFatBinary(void *fatCubin)
{
    const unsigned char *data = NULL;
    size_t n = fatbin_image(fatCubin, &data);
    if (n == 0) {
        remote_refuse("__cudaRegisterFatBinary", "relocatable device code (-rdc) or an unknown fatbinary "
                      "wrapper; its kernels will not launch");
        return NULL;
    }
    struct rcall c;
    void *handle = NULL;
    if (remote_begin(&c, RFN___cudaRegisterFatBinary) != 0)
        return NULL;
    rc_put_in(&c, data, n);
    if (remote_call(&c) == 0)
        rc_get_handle(&c, &handle);
    if (handle)
        remote_track_reg_fatbin((void **)handle, data, n);    /* for a proxy restart (restart.c) */
    remote_end(&c);
    return handle;
}

static void module_call(unsigned fn, void **handle)
{
    struct rcall c;
    if (handle == NULL || remote_begin(&c, fn) != 0)
        return;
    rc_put_handle(&c, handle);
    remote_call(&c);
    remote_track_reg_end(handle);
    remote_end(&c);
}

EXPORT void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
    module_call(RFN___cudaRegisterFatBinaryEnd, fatCubinHandle);
}

/* At exit the proxy is going away with its worker: nothing to tell it.  A
 * restart no longer re-registers the image (its library may be unloaded). */
EXPORT void __cudaUnregisterFatBinary(void **fatCubinHandle)
{
    struct rcall c;
    if (fatCubinHandle && remote_begin(&c, 0) == 0) {
        remote_track_reg_unregister(fatCubinHandle);
        remote_end(&c);
    }
}

EXPORT char __cudaInitModule(void **fatCubinHandle)
{
    struct rcall c;
    if (fatCubinHandle == NULL || remote_begin(&c, RFN___cudaInitModule) != 0)
        return 0;
    rc_put_handle(&c, fatCubinHandle);
    int32_t ok = remote_call(&c);
    remote_track_reg_init(fatCubinHandle);
    remote_end(&c);
    return (char)ok;
}

EXPORT void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                   const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                                   dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)tid; (void)bid; (void)bDim; (void)gDim; (void)wSize;    /* NULL from nvcc */
    struct rcall c;
    if (fatCubinHandle == NULL || remote_begin(&c, RFN___cudaRegisterFunction) != 0)
        return;
    rc_put_handle(&c, fatCubinHandle);
    rc_put(&c, &hostFun, sizeof hostFun);
    rc_put_string(&c, deviceFun);
    rc_put_string(&c, deviceName);
    rc_put(&c, &thread_limit, sizeof thread_limit);
    remote_call(&c);
    remote_track_reg_function(fatCubinHandle, hostFun, deviceFun, deviceName, thread_limit);
    remote_end(&c);
}

EXPORT void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                              const char *deviceName, int ext, size_t size, int constant, int global)
{
    struct rcall c;
    if (fatCubinHandle == NULL || remote_begin(&c, RFN___cudaRegisterVar) != 0)
        return;
    rc_put_handle(&c, fatCubinHandle);
    rc_put(&c, &hostVar, sizeof hostVar);
    rc_put_string(&c, deviceAddress);
    rc_put_string(&c, deviceName);
    rc_put(&c, &ext, sizeof ext);
    rc_put(&c, &size, sizeof size);
    rc_put(&c, &constant, sizeof constant);
    rc_put(&c, &global, sizeof global);
    remote_call(&c);
    remote_track_reg_var(fatCubinHandle, hostVar, deviceAddress, deviceName, ext, size, constant, global);
    remote_end(&c);
}

EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun)
{
    struct rcall c;
    if (remote_begin(&c, RFN___cudaGetKernel) != 0)
        return remote_unavailable();
    rc_put(&c, &hostFun, sizeof hostFun);
    cudaError_t err = (cudaError_t)remote_call(&c);
    if (err == cudaSuccess && kernel) {
        rc_get_handle(&c, (void **)kernel);
        remote_track_reg_kernel(*kernel, hostFun);
    }
    remote_end(&c);
    return err;
}

/* ---- the launch configuration of <<<...>>> (per thread, worker-local) ------------- */

#define CONFIG_DEPTH 64
struct call_config { dim3 grid, block; size_t shared_mem; cudaStream_t stream; };
static __thread struct call_config config_stack[CONFIG_DEPTH];
static __thread int config_depth;

EXPORT unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                            struct CUstream_st *stream)
{
    if (config_depth == CONFIG_DEPTH)
        return 1;
    config_stack[config_depth++] = (struct call_config){gridDim, blockDim, sharedMem, stream};
    return 0;
}

EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                              void *stream)
{
    if (config_depth == 0)
        return cudaErrorMissingConfiguration;
    struct call_config *c = &config_stack[--config_depth];
    *gridDim = c->grid;
    *blockDim = c->block;
    *sharedMem = c->shared_mem;
    *(cudaStream_t *)stream = c->stream;
    return cudaSuccess;
}

/* ---- launches ------------------------------------------------------------------- */

/* Parameter sizes per kernel (a host stub or a virtual kernel id), asked once. */
#define MAX_PARAMS 256
struct layout { struct layout *next; uint64_t key; int is_handle; uint32_t n; uint64_t size[]; };
static struct layout *layouts;            /* under the call lock */

static struct layout *layout_of(struct rcall *c, uint64_t key, int is_handle, cudaError_t *err)
{
    for (struct layout *l = layouts; l; l = l->next)
        if (l->key == key && l->is_handle == is_handle)
            return l;
    /* Ask the proxy inside the caller's lock: a call of its own on the same segment. */
    struct jitckpt_wire *w = c->w;
    uint32_t fn = w->fn;
    struct rcall q = *c;
    q.req = q.rep = q.arena_used = 0;
    w->fn = JITCKPT_RFN_PARAM_SIZES;
    rc_put(&q, &key, sizeof key);
    rc_put(&q, &is_handle, sizeof is_handle);
    *err = (cudaError_t)remote_call(&q);
    struct layout *l = NULL;
    uint32_t n = 0;
    if (*err == cudaSuccess && rc_get(&q, &n, sizeof n) == 0 && n <= MAX_PARAMS &&
        (l = malloc(sizeof *l + n * sizeof(uint64_t))) != NULL) {
        l->key = key;
        l->is_handle = is_handle;
        l->n = n;
        for (uint32_t i = 0; i < n; i++)
            rc_get(&q, &l->size[i], sizeof l->size[i]);
        l->next = layouts;
        layouts = l;
    } else if (*err == cudaSuccess) {
        *err = cudaErrorInvalidKernelImage;
    }
    w->fn = fn;
    return l;
}

static cudaError_t launch(uint64_t key, int is_handle, dim3 grid, dim3 block, void **args, size_t shmem,
                          cudaStream_t stream)
{
    stream = remote_stream(stream);            /* cudaStreamPerThread: this thread's own (ptds.c) */
    if (!is_handle && JITCKPT_VH_IS_VIRTUAL(key) && JITCKPT_VH_KIND(key) == VH_KERNEL)
        is_handle = 1;                         /* cudaLaunchKernel of a kernel handle (a library's) */
    struct rcall c;
    if (remote_begin(&c, is_handle ? RFN___cudaLaunchKernel : RFN_cudaLaunchKernel) != 0)
        return remote_unavailable();
    if (is_handle && remote_kernel_unloaded(key)) {
        remote_end(&c);
        return cudaErrorInvalidDeviceFunction;
    }
    cudaError_t err = cudaSuccess;
    struct layout *l = layout_of(&c, key, is_handle, &err);
    if (l != NULL) {
        c.req = 0;
        c.w->fn = is_handle ? RFN___cudaLaunchKernel : RFN_cudaLaunchKernel;
        rc_put(&c, &key, sizeof key);
        rc_put(&c, &grid, sizeof grid);
        rc_put(&c, &block, sizeof block);
        rc_put(&c, &shmem, sizeof shmem);
        rc_put_handle(&c, stream);
        rc_put(&c, &l->n, sizeof l->n);
        for (uint32_t i = 0; i < l->n; i++) {
            if (args == NULL || args[i] == NULL) {
                err = cudaErrorInvalidValue;
                break;
            }
            rc_put(&c, args[i], l->size[i]);
        }
        if (err == cudaSuccess)
            err = (cudaError_t)remote_call(&c);
    }
    remote_end(&c);
    return err;
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream)
{
    return launch((uint64_t)(uintptr_t)func, 0, gridDim, blockDim, args, sharedMem, stream);
}

EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                      size_t sharedMem, cudaStream_t stream)
{
    return launch((uint64_t)(uintptr_t)kernel, 1, gridDim, blockDim, args, sharedMem, stream);
}

/* cudaLaunchKernelExC: the configuration's launch, when it carries no attributes.
 * Attributes (clusters, cooperative launches, priorities, ...) would need their own
 * marshalling: such a launch is refused by name rather than run without them. */
static cudaError_t launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args, int ptsz)
{
    if (config == NULL)
        return cudaErrorInvalidValue;
    if (config->numAttrs != 0)
        return remote_refuse_call("cudaLaunchKernelExC", "config->numAttrs != 0 (launch attributes)");
    cudaStream_t stream = config->stream;
    if (ptsz && stream == NULL)
        stream = cudaStreamPerThread;
    uint64_t key = (uint64_t)(uintptr_t)func;
    /* func is a host stub, or a kernel handle (cudaGetKernel, a library's kernel) */
    return launch(key, JITCKPT_VH_IS_VIRTUAL(key) && JITCKPT_VH_KIND(key) == VH_KERNEL, config->gridDim,
                  config->blockDim, args, config->dynamicSmemBytes, stream);
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    return launch_ex(config, func, args, 0);
}

EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    return launch_ex(config, func, args, 1);
}

/* cudaGetKernel is the public name of __cudaGetKernel (tracked for a restart the same way). */
EXPORT cudaError_t cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr)
{
    if (kernelPtr == NULL)
        return cudaErrorInvalidValue;
    return __cudaGetKernel(kernelPtr, entryFuncAddr);
}

/* ---- the calling thread's capture mode ---------------------------------------------
 * Kept in the worker: the proxy's one thread keeps the mode each capture began
 * with (proxy_server/README.md, "API coverage"). */

static __thread enum cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (mode == NULL || (unsigned)*mode > cudaStreamCaptureModeRelaxed)
        return cudaErrorInvalidValue;
    enum cudaStreamCaptureMode old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return cudaSuccess;
}
