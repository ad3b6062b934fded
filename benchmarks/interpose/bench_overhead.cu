// bench_overhead.cu -- time per call of the CUDA and NCCL calls that
// libjitckpt_interpose.so wraps (and one it does not), for run.py to compare
// with and without LD_PRELOAD.
//
// An ordinary CUDA program (nvcc -cudart shared, linked against NCCL).  It runs
// against whatever libcudart.so.13/libnccl.so.2 LD_LIBRARY_PATH finds: the do-
// nothing stubs of this folder (then the time per call is the interposer's
// own cost plus one call), the CPU device emulator, or, on a GPU host, the
// real libraries.  One process, one rank (ncclCommInitRank with nranks=1).
//
// Usage: bench_overhead [calls per measurement, default 200000]
// Prints one line per operation: "<op> <min> <median>", in ns per call over 11
// runs (the minimum is the intrinsic cost; the median shows the noise).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#define CHECK(expr)                                                                        \
    do {                                                                                   \
        cudaError_t e_ = (expr);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorName(e_));         \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)
#define NCHECK(expr)                                                                       \
    do {                                                                                   \
        ncclResult_t r_ = (expr);                                                          \
        if (r_ != ncclSuccess) {                                                           \
            std::fprintf(stderr, "%s failed: %s\n", #expr, ncclGetErrorString(r_));       \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

extern "C" __global__ void empty_kernel(int) {}
extern "C" void empty_kernel__host(dim3, dim3, size_t, void **) {}   // emulator twin

static double now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

template <typename F> static void measure(const char *name, long calls, F body)
{
    std::vector<double> runs;
    body(calls / 10);                         // warm up (first-call symbol resolution)
    for (int r = 0; r < 11; r++) {
        double t0 = now_ns();
        body(calls);
        runs.push_back((now_ns() - t0) / calls);
    }
    std::sort(runs.begin(), runs.end());
    std::printf("%s %.2f %.2f\n", name, runs[0], runs[5]);
    std::fflush(stdout);
}

int main(int argc, char **argv)
{
    const long calls = argc > 1 ? std::atol(argv[1]) : 200000;
    CHECK(cudaSetDevice(0));
    ncclUniqueId id;
    NCHECK(ncclGetUniqueId(&id));
    ncclComm_t comm;
    NCHECK(ncclCommInitRank(&comm, 1, id, 0));
    cudaStream_t compute, nccl_stream;
    CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&nccl_stream, cudaStreamNonBlocking));
    cudaEvent_t ev_compute, ev_nccl;
    CHECK(cudaEventCreateWithFlags(&ev_compute, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&ev_nccl, cudaEventDisableTiming));
    float *buf;
    CHECK(cudaMalloc(&buf, 1024 * sizeof(float)));
    NCHECK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, nccl_stream));  // an NCCL stream now
    CHECK(cudaStreamSynchronize(nccl_stream));

    measure("cudaEventRecord(compute_stream)", calls, [&](long n) {
        for (long i = 0; i < n; i++) cudaEventRecord(ev_compute, compute);
        CHECK(cudaStreamSynchronize(compute));
    });
    measure("cudaEventRecord(nccl_stream)+cudaStreamWaitEvent", calls, [&](long n) {
        for (long i = 0; i < n; i++) {
            cudaEventRecord(ev_nccl, nccl_stream);
            cudaStreamWaitEvent(compute, ev_nccl, 0);
        }
        CHECK(cudaStreamSynchronize(compute));
    });
    measure("cudaEventQuery(unwrapped)", calls, [&](long n) {
        for (long i = 0; i < n; i++) cudaEventQuery(ev_compute);
    });
    measure("cudaLaunchKernel", calls, [&](long n) {
        int arg = 0;
        void *args[] = {&arg};
        for (long i = 0; i < n; i++)
            cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(1), args, 0, compute);
        CHECK(cudaStreamSynchronize(compute));
    });
    measure("kernel<<<>>>(__cudaLaunchKernel)", calls, [&](long n) {
        for (long i = 0; i < n; i++) empty_kernel<<<1, 1, 0, compute>>>(0);
        CHECK(cudaStreamSynchronize(compute));
    });
    measure("ncclAllReduce(enqueue)", calls, [&](long n) {
        for (long i = 0; i < n; i++) ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, nccl_stream);
        CHECK(cudaStreamSynchronize(nccl_stream));
    });
    measure("cudaStreamSynchronize(idle)", calls, [&](long n) {
        for (long i = 0; i < n; i++) cudaStreamSynchronize(compute);
    });
    NCHECK(ncclCommDestroy(comm));
    return 0;
}
