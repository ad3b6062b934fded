// bench_async.cu -- asynchronous calls per second, directly and through the
// device proxy of transparent mode (benchmarks/proxy/run.py).
//
// Usage: bench_async N
// Per operation: N asynchronous calls on one stream, then one
// cudaStreamSynchronize (counted in the time: the proxy must have executed
// all N by then); prints "<operation> <calls per second>".  The synchronous
// round trip is measured as N cudaStreamQuery calls.
//
// On the emulator the kernel's host twin must be in the proxy's process:
// the Makefile builds this file a second time as a shared library
// (build/libbench_twins.so) for JITCKPT_SIMDEV_KERNELS.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorName(e_)); std::exit(1); } } while (0)

extern "C" __global__ void bench_empty(int x) {}
extern "C" void bench_empty__host(dim3, dim3, size_t, void **) {}

static void measure(const char *name, long n, cudaStream_t s, const std::function<cudaError_t(long)> &call)
{
    CHECK(cudaStreamSynchronize(s));
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; i++)
        CHECK(call(i));
    CHECK(cudaStreamSynchronize(s));
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s %.0f\n", name, (double)n / sec);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? std::atol(argv[1]) : 200000;
    cudaStream_t s;
    cudaEvent_t e;
    void *d;
    static char host[64];
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CHECK(cudaMalloc(&d, 4096));
    measure("cudaEventRecord", n, s, [&](long) { return cudaEventRecord(e, s); });
    measure("cudaMemsetAsync(256 B)", n, s, [&](long i) { return cudaMemsetAsync(d, (int)(i & 0xff), 256, s); });
    measure("cudaMemcpyAsync(H2D 64 B, pageable)", n, s,
            [&](long) { return cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyHostToDevice, s); });
    measure("kernel launch <<<1,1>>>", n, s, [&](long i) {
        bench_empty<<<1, 1, 0, s>>>((int)i);          // its error, if any: cudaGetLastError below
        return cudaSuccess;
    });
    CHECK(cudaGetLastError());
    measure("cudaStreamQuery (synchronous)", n / 10, s, [&](long) {
        cudaError_t r = cudaStreamQuery(s);
        return r == cudaErrorNotReady ? cudaSuccess : r;
    });
    CHECK(cudaFree(d));
    return 0;
}
