/* stub_cudart.c -- a CUDA runtime that does nothing, for bench_overhead.
 *
 * Same soname and version node as the real libcudart.so.13 (stub_cudart.map),
 * so bench_overhead binds to it through LD_LIBRARY_PATH.  Every function
 * returns at once: with it behind the interposer, the time per call *is*
 * the interposer's added cost (plus one indirect call), free of the noise of
 * a real runtime or of the emulator.  Only the functions the benchmark and
 * the interposer call are defined. */
#include <cuda_runtime_api.h>
#include <stdint.h>

static uintptr_t next_handle = 0x10000;

cudaError_t cudaSetDevice(int device) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *device) { *device = 0; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    *s = (cudaStream_t)(next_handle += 0x100);
    return cudaSuccess;
}
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags) { *flags = 1; return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    *e = (cudaEvent_t)(next_handle += 0x100);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n)
{
    static char arena[1 << 20];
    *p = arena;
    return n <= sizeof arena ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) { return cudaMalloc(p, n); }
cudaError_t cudaFree(void *p) { return cudaSuccess; }
cudaError_t cudaFreeHost(void *p) { return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { return "stub"; }
const char *cudaGetErrorString(cudaError_t e) { return "stub"; }
cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s)
{
    return cudaSuccess;
}

/* nvcc's hidden entry points (registration at start-up, <<<>>> launches). */
static void *fatbin_handle[4];
void **__cudaRegisterFatBinary(void *fatbin) { return fatbin_handle; }
void __cudaRegisterFatBinaryEnd(void **h) {}
void __cudaUnregisterFatBinary(void **h) {}
void __cudaRegisterFunction(void **h, const char *hostFun, char *deviceFun, const char *deviceName,
                            int threadLimit, void *tid, void *bid, void *bDim, void *gDim,
                            int *wSize) {}
void __cudaRegisterVar(void **h, char *hostVar, char *deviceAddress, const char *deviceName,
                       int ext, size_t size, int constant, int global) {}
char __cudaInitModule(void **h) { return 0; }
static dim3 cfg_grid, cfg_block;
static size_t cfg_shmem;
static void *cfg_stream;
unsigned __cudaPushCallConfiguration(dim3 g, dim3 b, size_t sh, void *st)
{
    cfg_grid = g, cfg_block = b, cfg_shmem = sh, cfg_stream = st;
    return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3 *g, dim3 *b, size_t *sh, void *st)
{
    *g = cfg_grid, *b = cfg_block, *sh = cfg_shmem, *(void **)st = cfg_stream;
    return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *stub)
{
    *k = (cudaKernel_t)stub;
    return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s)
{
    return cudaSuccess;
}
