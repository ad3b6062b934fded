// cudart_basic.cu -- device management, memory, copies, kernels with host
// twins, device variables and errors, checked against host references.
//
// Usage: cudart_basic <devices|saxpy|reduce|symbols|memcpy|staging|validation|
//                      missing_twin|external_twin|reset|library FILE>
#include "common.h"

#include <cmath>
#include <vector>

// ---- kernels and their host twins ------------------------------------------

__global__ void saxpy(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

// Twin of saxpy: nvcc registers it as _Z5saxpyifPKfPf.  The twin walks the
// same grid the GPU would.
extern "C" void _Z5saxpyifPKfPf__host(dim3 grid, dim3 block, size_t, void **args)
{
    int n = *(int *)args[0];
    float a = *(float *)args[1];
    const float *x = *(const float **)args[2];
    float *y = *(float **)args[3];
    for (unsigned b = 0; b < grid.x; b++)
        for (unsigned t = 0; t < block.x; t++) {
            int i = (int)(b * block.x + t);
            if (i < n)
                y[i] = a * x[i] + y[i];
        }
}

// A block-wise sum with a shared-memory tree, one partial sum per block.
extern "C" __global__ void block_sum(const double *in, double *partial, int n)
{
    extern __shared__ double buf[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? in[i] : 0.0;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partial[blockIdx.x] = buf[0];
}

extern "C" void block_sum__host(dim3 grid, dim3 block, size_t shared_mem, void **args)
{
    const double *in = *(const double **)args[0];
    double *partial = *(double **)args[1];
    int n = *(int *)args[2];
    if (shared_mem < block.x * sizeof(double))
        std::abort();                       // the GPU would fault: keep the twin honest
    for (unsigned b = 0; b < grid.x; b++) {
        double s = 0;
        for (unsigned t = 0; t < block.x; t++) {
            int i = (int)(b * block.x + t);
            s += i < n ? in[i] : 0.0;
        }
        partial[b] = s;
    }
}

__device__ int counter = 7;
__constant__ float coeffs[4] = {0.5f, 1.5f, 2.5f, 3.5f};

__global__ void bump(int by)
{
    atomicAdd(&counter, by);
}

// The twin reaches the __device__ variable through cudaGetSymbolAddress.
extern "C" void _Z4bumpi__host(dim3 grid, dim3 block, size_t, void **args)
{
    int by = *(int *)args[0];
    int *p = nullptr;
    if (cudaGetSymbolAddress((void **)&p, counter) != cudaSuccess)
        std::abort();
    *p += by * (int)(grid.x * block.x);
}

__global__ void no_twin_kernel(int *p)
{
    p[0] = 1;
}

// Its twin lives in a separate library (JITCKPT_SIMDEV_KERNELS).
__global__ void ext_scale(float *p, float s, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] *= s;
}

// ---- subcommands -------------------------------------------------------------

static int cmd_devices()
{
    int n = -1;
    CHECK(cudaGetDeviceCount(&n));
    std::printf("count %d\n", n);
    for (int d = 0; d < n; d++) {
        cudaDeviceProp p;
        CHECK(cudaGetDeviceProperties(&p, d));
        int major = 0, mps = 0;
        CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
        CHECK(cudaDeviceGetAttribute(&mps, cudaDevAttrMultiProcessorCount, d));
        REQUIRE(major == p.major && mps == p.multiProcessorCount && p.warpSize == 32);
        char bus[32];
        CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, d));
        int back = -1;
        CHECK(cudaDeviceGetByPCIBusId(&back, bus));
        REQUIRE(back == d);
        std::printf("device %d name=%s mem=%zu bus=%s\n", d, p.name, p.totalGlobalMem, bus);
    }
    CHECK(cudaSetDevice(n - 1));
    int cur = -1;
    CHECK(cudaGetDevice(&cur));
    REQUIRE(cur == n - 1);
    EXPECT_ERR(cudaSetDevice(n), cudaErrorInvalidDevice);
    // The failed call is the thread's last error until read once.
    EXPECT_ERR(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    EXPECT_ERR(cudaGetLastError(), cudaErrorInvalidDevice);
    EXPECT_ERR(cudaGetLastError(), cudaSuccess);
    // The current device is per thread.
    std::thread([&] {
        int d = -1;
        CHECK(cudaGetDevice(&d));
        REQUIRE(d == 0);
    }).join();

    size_t free0, total;
    CHECK(cudaMemGetInfo(&free0, &total));
    void *p;
    CHECK(cudaMalloc(&p, 64 << 20));
    size_t free1;
    CHECK(cudaMemGetInfo(&free1, &total));
    REQUIRE(free0 - free1 >= (size_t)64 << 20);
    void *huge = nullptr;
    EXPECT_ERR(cudaMalloc(&huge, total + 1), cudaErrorMemoryAllocation);
    EXPECT_ERR(cudaGetLastError(), cudaErrorMemoryAllocation);
    std::printf("total %zu\n", total);

    // Pointer attributes of each kind of memory.
    void *pinned, *managed;
    int pageable = 0;
    CHECK(cudaMallocHost(&pinned, 4096));
    CHECK(cudaMallocManaged(&managed, 4096, cudaMemAttachGlobal));
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, (char *)p + 100));
    REQUIRE(a.type == cudaMemoryTypeDevice && a.device == cur && a.devicePointer == (char *)p + 100);
    CHECK(cudaPointerGetAttributes(&a, pinned));
    REQUIRE(a.type == cudaMemoryTypeHost && a.hostPointer == pinned);
    CHECK(cudaPointerGetAttributes(&a, managed));
    REQUIRE(a.type == cudaMemoryTypeManaged);
    CHECK(cudaPointerGetAttributes(&a, &pageable));
    REQUIRE(a.type == cudaMemoryTypeUnregistered);
    CHECK(cudaFree(p));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(managed));
    EXPECT_ERR(cudaFree(&pageable), cudaErrorInvalidValue);
    cudaGetLastError();

    REQUIRE(std::strcmp(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress") == 0);
    REQUIRE(std::strcmp(cudaGetErrorString(cudaSuccess), "no error") == 0);
    int rt = 0;
    CHECK(cudaRuntimeGetVersion(&rt));
    REQUIRE(rt >= 13000);
    CHECK(cudaDeviceSynchronize());
    std::printf("OK devices\n");
    return 0;
}

static int cmd_saxpy()
{
    const int n = 100003;
    std::vector<float> x(n), y(n), ref(n);
    for (int i = 0; i < n; i++) {
        x[i] = (float)(i % 977) * 0.25f;
        y[i] = (float)(i % 13) - 6.0f;
        ref[i] = 3.0f * x[i] + y[i];
    }
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, n * sizeof(float)));
    CHECK(cudaMalloc(&dy, n * sizeof(float)));
    CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    saxpy<<<(n + 255) / 256, 256>>>(n, 3.0f, dx, dy);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (std::fabs(y[i] - ref[i]) > 1e-5f * (1.0f + std::fabs(ref[i]))) {
            std::fprintf(stderr, "y[%d] = %f, expected %f\n", i, y[i], ref[i]);
            return 1;
        }
    // The launch path through cudaLaunchKernel (the runtime API) as well.
    int nn = n;
    float a = 2.0f;
    void *args[] = {&nn, &a, &dx, &dy};
    CHECK(cudaLaunchKernel((const void *)saxpy, dim3((n + 127) / 128), dim3(128), args, 0, 0));
    CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        REQUIRE(std::fabs(y[i] - (2.0f * x[i] + ref[i])) <= 1e-4f * (1.0f + std::fabs(ref[i])));
    const char *name = nullptr;
    CHECK(cudaFuncGetName(&name, (const void *)saxpy));
    std::printf("kernel name %s\n", name);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    std::printf("OK saxpy\n");
    return 0;
}

static int cmd_reduce()
{
    const int n = 1 << 18, threads = 256, blocks = (n + threads - 1) / threads;
    std::vector<double> in(n);
    double ref = 0;
    for (int i = 0; i < n; i++) {
        in[i] = (double)((i * 7919) % 1000) - 500.0;
        ref += in[i];
    }
    double *din, *dpart;
    CHECK(cudaMalloc(&din, n * sizeof(double)));
    CHECK(cudaMalloc(&dpart, blocks * sizeof(double)));
    CHECK(cudaMemcpy(din, in.data(), n * sizeof(double), cudaMemcpyHostToDevice));
    block_sum<<<blocks, threads, threads * sizeof(double)>>>(din, dpart, n);
    CHECK(cudaGetLastError());
    std::vector<double> part(blocks);
    CHECK(cudaMemcpy(part.data(), dpart, blocks * sizeof(double), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (double v : part)
        sum += v;
    std::printf("sum %.1f ref %.1f\n", sum, ref);
    REQUIRE(sum == ref);            // integer-valued doubles: exact on any device
    std::printf("OK reduce\n");
    return 0;
}

static int cmd_symbols()
{
    int c = 0;
    CHECK(cudaMemcpyFromSymbol(&c, counter, sizeof c));
    REQUIRE(c == 7);                // initial value from the device image
    float k[4];
    CHECK(cudaMemcpyFromSymbol(k, coeffs, sizeof k));
    REQUIRE(k[0] == 0.5f && k[3] == 3.5f);
    size_t size = 0;
    CHECK(cudaGetSymbolSize(&size, coeffs));
    REQUIRE(size == sizeof k);
    bump<<<2, 4>>>(5);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyFromSymbol(&c, counter, sizeof c));
    REQUIRE(c == 7 + 5 * 8);
    float nk[2] = {10.0f, 20.0f};
    CHECK(cudaMemcpyToSymbol(coeffs, nk, sizeof nk, sizeof(float)));   // at offset 1
    CHECK(cudaMemcpyFromSymbol(k, coeffs, sizeof k));
    REQUIRE(k[0] == 0.5f && k[1] == 10.0f && k[2] == 20.0f && k[3] == 3.5f);
    EXPECT_ERR(cudaMemcpyToSymbol(coeffs, nk, sizeof nk, 3 * sizeof(float)), cudaErrorInvalidValue);
    cudaGetLastError();
    std::printf("OK symbols\n");
    return 0;
}

static int cmd_memcpy()
{
    const size_t n = 1 << 20;
    std::vector<unsigned char> h(n), back(n);
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(i * 31 + 7);
    unsigned char *d1, *d2, *pinned;
    CHECK(cudaMalloc(&d1, n));
    CHECK(cudaMalloc(&d2, n));
    CHECK(cudaMallocHost(&pinned, n));
    CHECK(cudaMemcpy(d1, h.data(), n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d2, d1, n, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(back.data(), d2, n, cudaMemcpyDeviceToHost));
    REQUIRE(back == h);
    CHECK(cudaMemset(d2 + 100, 0xab, 1000));
    CHECK(cudaMemcpy(back.data(), d2, n, cudaMemcpyDefault));      // ordered after the memset
    for (size_t i = 0; i < n; i++)
        REQUIRE(back[i] == (i >= 100 && i < 1100 ? 0xab : h[i]));

    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemsetAsync(d1, 0x11, n, s));
    CHECK(cudaMemcpyAsync(d1 + 10, h.data(), 20, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(pinned, d1, n, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; i++)
        REQUIRE(pinned[i] == (i >= 10 && i < 30 ? h[i - 10] : 0x11));

    // 2D: copy a 37x11 window with different pitches.
    size_t pitch = 0;
    unsigned char *img;
    CHECK(cudaMallocPitch((void **)&img, &pitch, 100, 20));
    REQUIRE(pitch >= 100);
    CHECK(cudaMemset2D(img, pitch, 0, 100, 20));
    CHECK(cudaMemcpy2D(img + pitch + 3, pitch, h.data(), 64, 37, 11, cudaMemcpyHostToDevice));
    std::vector<unsigned char> win(100 * 20);
    CHECK(cudaMemcpy2DAsync(win.data(), 100, img, pitch, 100, 20, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int r = 0; r < 20; r++)
        for (int c = 0; c < 100; c++) {
            bool inside = r >= 1 && r < 12 && c >= 3 && c < 40;
            REQUIRE(win[r * 100 + c] == (inside ? h[(r - 1) * 64 + (c - 3)] : 0));
        }
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(img));
    CHECK(cudaFree(d1));
    CHECK(cudaFree(d2));
    CHECK(cudaFreeHost(pinned));
    std::printf("OK memcpy\n");
    return 0;
}

// Host-side semantics of asynchronous copies with pageable host memory.
static int cmd_staging()
{
    const size_t n = 4096;
    unsigned char *d;
    CHECK(cudaMalloc(&d, n));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    Gate gate;
    CHECK(cudaLaunchHostFunc(s, gate_wait, &gate));
    std::vector<unsigned char> src(n, 1);
    // The copy is queued behind the gate; overwriting the pageable source
    // right after the call must not change what gets copied.
    CHECK(cudaMemcpyAsync(d, src.data(), n, cudaMemcpyHostToDevice, s));
    std::fill(src.begin(), src.end(), 2);
    REQUIRE(cudaStreamQuery(s) == cudaErrorNotReady);
    // A device-to-host copy into pageable memory returns only when done.
    std::thread opener([&] {
        sleep_ms(300);
        gate_open(gate);
    });
    std::vector<unsigned char> dst(n, 0);
    double t0 = now_ms();
    CHECK(cudaMemcpyAsync(dst.data(), d, n, cudaMemcpyDeviceToHost, s));
    double waited = now_ms() - t0;
    opener.join();
    std::printf("dtoh pageable returned after %.0f ms\n", waited);
    REQUIRE(waited >= 200);
    for (size_t i = 0; i < n; i++)
        REQUIRE(dst[i] == 1);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    std::printf("OK staging\n");
    return 0;
}

// What the emulator rejects that a GPU would also reject (or fault on).
static int cmd_validation()
{
    int host[4] = {0};
    int *d;
    CHECK(cudaMalloc(&d, 16));
    EXPECT_ERR(cudaMemcpy(host, d, 32, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);   // past the end
    EXPECT_ERR(cudaMemcpy(host, host + 1, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    EXPECT_ERR(cudaMemset(host, 0, 4), cudaErrorInvalidValue);
    EXPECT_ERR(cudaMemcpy(d, host, 4, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    saxpy<<<0, 1>>>(1, 1.0f, (float *)d, (float *)d);
    EXPECT_ERR(cudaGetLastError(), cudaErrorInvalidConfiguration);
    saxpy<<<1, 2048>>>(1, 1.0f, (float *)d, (float *)d);
    EXPECT_ERR(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_ERR(cudaStreamSynchronize((cudaStream_t)0x1234), cudaErrorInvalidResourceHandle);
    cudaEvent_t bogus = (cudaEvent_t)0x5678;
    EXPECT_ERR(cudaEventQuery(bogus), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    // occupancy: a query about a kernel (through the proxy: the kernel's host stub names it there too)
    int blocks = -1;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)saxpy, 256, 0));
    std::printf("occupancy saxpy 256 threads: %d blocks\n", blocks);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, (const void *)saxpy, 1000, 0,
                                                                 cudaOccupancyDisableCachingOverride));
    std::printf("occupancy saxpy 1000 threads: %d blocks\n", blocks);
    EXPECT_ERR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)saxpy, 0, 0), cudaErrorInvalidValue);
    EXPECT_ERR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)&cmd_validation, 128, 0),
               cudaErrorInvalidDeviceFunction);
    cudaGetLastError();
    CHECK(cudaFree(d));
    std::printf("OK validation\n");
    return 0;
}

static int cmd_missing_twin()
{
    int *d;
    CHECK(cudaMalloc(&d, 4));
    no_twin_kernel<<<1, 1>>>(d);
    cudaError_t e = cudaGetLastError();
    std::printf("launch result %s\n", cudaGetErrorName(e));
    REQUIRE(e == cudaErrorInvalidDeviceFunction);
    // Not sticky: the device keeps working.
    CHECK(cudaMemset(d, 0, 4));
    CHECK(cudaDeviceSynchronize());
    std::printf("OK missing_twin\n");
    return 0;
}

static int cmd_external_twin()
{
    const int n = 1000;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++)
        h[i] = (float)i;
    float *d;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    ext_scale<<<(n + 63) / 64, 64>>>(d, 0.5f, n);
    cudaError_t e = cudaGetLastError();
    std::printf("launch result %s\n", cudaGetErrorName(e));
    if (e != cudaSuccess)
        return 3;
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        REQUIRE(h[i] == 0.5f * (float)i);
    std::printf("OK external_twin\n");
    return 0;
}

// cudaDeviceReset drops the device's memory, streams and events.
static int cmd_reset()
{
    size_t free0, total;
    CHECK(cudaMemGetInfo(&free0, &total));
    float *d;
    CHECK(cudaMalloc(&d, 32 << 20));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    saxpy<<<4, 256, 0, s>>>(1024, 1.0f, d, d);
    CHECK(cudaEventRecord(ev, s));
    CHECK(cudaDeviceReset());
    size_t free1;
    CHECK(cudaMemGetInfo(&free1, &total));
    REQUIRE(free1 == free0);
    EXPECT_ERR(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
    EXPECT_ERR(cudaEventQuery(ev), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    CHECK(cudaMalloc(&d, 1024));            // the device is usable again
    CHECK(cudaMemset(d, 0, 1024));
    CHECK(cudaDeviceSynchronize());
    std::printf("OK reset\n");
    return 0;
}

// Device code loaded at run time (a fatbinary, cubin or PTX file), kernels
// looked up by name and launched through cudaKernel_t handles.
static int cmd_library(const char *path)
{
    cudaLibrary_t lib;
    CHECK(cudaLibraryLoadFromFile(&lib, path, nullptr, nullptr, 0, nullptr, nullptr, 0));
    unsigned count = 0;
    CHECK(cudaLibraryGetKernelCount(&count, lib));
    REQUIRE(count == 2);
    cudaKernel_t all[2];
    CHECK(cudaLibraryEnumerateKernels(all, 2, lib));
    cudaKernel_t scale, add;
    CHECK(cudaLibraryGetKernel(&scale, lib, "lib_scale"));
    CHECK(cudaLibraryGetKernel(&add, lib, "lib_add"));
    REQUIRE((all[0] == scale && all[1] == add) || (all[0] == add && all[1] == scale));
    cudaKernel_t none;
    EXPECT_ERR(cudaLibraryGetKernel(&none, lib, "no_such_kernel"), cudaErrorSymbolNotFound);
    cudaGetLastError();
    const int n = 300;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++)
        h[i] = (float)i;
    float *d;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    float s = 3.0f;
    double add_by = 0.5;
    int nn = n;
    void *scale_args[] = {&d, &s, &nn};
    void *add_args[] = {&d, &add_by, &nn};
    CHECK(cudaLaunchKernel((const void *)scale, dim3(3), dim3(128), scale_args, 0, 0));
    CHECK(cudaLaunchKernel((const void *)add, dim3(3), dim3(128), add_args, 0, 0));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        REQUIRE(h[i] == 3.0f * (float)i + 0.5f);
    size_t off = 0, size = 0;
    CHECK(cudaFuncGetParamInfo((const void *)add, 1, &off, &size));
    REQUIRE(off == 8 && size == 8);
    CHECK(cudaLibraryUnload(lib));
    EXPECT_ERR(cudaLaunchKernel((const void *)scale, dim3(1), dim3(1), scale_args, 0, 0),
               cudaErrorInvalidDeviceFunction);
    cudaGetLastError();
    std::printf("OK library\n");
    return 0;
}

int main(int argc, char **argv)
{
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "devices") return cmd_devices();
    if (cmd == "saxpy") return cmd_saxpy();
    if (cmd == "reduce") return cmd_reduce();
    if (cmd == "symbols") return cmd_symbols();
    if (cmd == "memcpy") return cmd_memcpy();
    if (cmd == "staging") return cmd_staging();
    if (cmd == "validation") return cmd_validation();
    if (cmd == "missing_twin") return cmd_missing_twin();
    if (cmd == "external_twin") return cmd_external_twin();
    if (cmd == "reset") return cmd_reset();
    if (cmd == "library" && argc > 2) return cmd_library(argv[2]);
    std::fprintf(stderr, "usage: %s <subcommand>\n", argv[0]);
    return 2;
}
