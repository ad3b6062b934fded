// streams.cu -- stream ordering, events, the legacy default stream, the
// per-thread default stream, and injected faults.
//
// Usage: streams <ordering|events|legacy|nonblocking|per_thread|
//                 fault_sticky|fault_lost|fault_hang|fault_slow|async_alloc>
// Built twice by the tests: as is, and with --default-stream per-thread.
#include "common.h"

#include <atomic>
#include <vector>

// x[i] = x[i] * mul + add: not commutative across launches, so the final
// values reveal the order in which launches ran.
__global__ void affine(int *x, int n, int mul, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * mul + add;
}

extern "C" void _Z6affinePiiii__host(dim3 grid, dim3 block, size_t, void **args)
{
    int *x = *(int **)args[0];
    int n = *(int *)args[1], mul = *(int *)args[2], add = *(int *)args[3];
    for (unsigned i = 0; i < grid.x * block.x; i++)
        if ((int)i < n)
            x[i] = x[i] * mul + add;
}

// Spins for `ms` milliseconds (a long-running kernel).
__global__ void spin(long long ms)
{
    long long start = clock64();
    while (clock64() - start < ms * 1000000LL)
        ;
}

extern "C" void _Z4spinx__host(dim3, dim3, size_t, void **args)
{
    sleep_ms((int)*(long long *)args[0]);
}

// Appends its tag to a log: shows the order in which kernels ran.
__global__ void tag(int *log, int *count, int value)
{
    log[atomicAdd(count, 1)] = value;
}

extern "C" void _Z3tagPiS_i__host(dim3, dim3, size_t, void **args)
{
    int *log = *(int **)args[0];
    int *count = *(int **)args[1];
    log[(*count)++] = *(int *)args[2];
}

static int cmd_ordering()
{
    const int n = 4096, rounds = 200;
    std::vector<int> h(n, 1);
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyAsync(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
    long long ref = 1;
    for (int r = 0; r < rounds; r++) {
        int mul = 1 + r % 3, add = r % 7 - 3;
        affine<<<n / 256, 256, 0, s>>>(d, n, mul, add);
        ref = (ref * mul + add) % 1000003;
        if (r % 50 == 49) {          // interleave copies and sets
            CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
            CHECK(cudaMemsetAsync(d, 0, n * sizeof(int), s));
            CHECK(cudaMemcpyAsync(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
            CHECK(cudaMemsetAsync(d + n / 2, 0, 0, s));
        }
        if (r % 3 == 2) {            // keep values small, in order
            CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
            for (int i = 0; i < n; i++)
                h[i] %= 1000003;
            CHECK(cudaMemcpyAsync(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
        }
    }
    CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    REQUIRE(cudaStreamQuery(s) == cudaSuccess);
    for (int i = 0; i < n; i++)
        REQUIRE((h[i] % 1000003 + 1000003) % 1000003 == (int)((ref % 1000003 + 1000003) % 1000003));

    // Kernels on one stream run in issue order even when the first is slow.
    int *log, *count;
    CHECK(cudaMallocManaged(&log, 64 * sizeof(int)));
    CHECK(cudaMallocManaged(&count, sizeof(int)));
    *count = 0;
    spin<<<1, 1, 0, s>>>(50);
    for (int i = 0; i < 32; i++)
        tag<<<1, 1, 0, s>>>(log, count, i);
    CHECK(cudaStreamSynchronize(s));
    REQUIRE(*count == 32);
    for (int i = 0; i < 32; i++)
        REQUIRE(log[i] == i);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    std::printf("OK ordering\n");
    return 0;
}

static int cmd_events()
{
    cudaStream_t a, b;
    CHECK(cudaStreamCreate(&a));
    CHECK(cudaStreamCreateWithPriority(&b, cudaStreamNonBlocking, -1));
    int prio = 0;
    CHECK(cudaStreamGetPriority(b, &prio));
    REQUIRE(prio == -1);
    cudaEvent_t start, stop, never;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventCreateWithFlags(&never, cudaEventDisableTiming));
    REQUIRE(cudaEventQuery(never) == cudaSuccess);          // never recorded: complete

    // Elapsed time around a 100 ms kernel.
    CHECK(cudaEventRecord(start, a));
    spin<<<1, 1, 0, a>>>(100);
    CHECK(cudaEventRecord(stop, a));
    float early = 0;
    EXPECT_ERR(cudaEventElapsedTime(&early, start, stop), cudaErrorNotReady);
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("elapsed %.1f ms\n", ms);
    REQUIRE(ms >= 95.0f && ms < 5000.0f);
    EXPECT_ERR(cudaEventElapsedTime(&ms, start, never), cudaErrorInvalidResourceHandle);
    cudaGetLastError();

    // Query stays not-ready while the stream is blocked; the host is free.
    Gate gate;
    CHECK(cudaLaunchHostFunc(a, gate_wait, &gate));
    CHECK(cudaEventRecord(stop, a));
    REQUIRE(stays_not_ready(stop, 300));
    REQUIRE(cudaStreamQuery(a) == cudaErrorNotReady);

    // Stream b waits for the event on a: its work cannot start before it.
    int *flag;
    CHECK(cudaMallocManaged(&flag, 2 * sizeof(int)));
    flag[0] = flag[1] = 0;
    CHECK(cudaStreamWaitEvent(b, stop, 0));
    int *count;
    CHECK(cudaMallocManaged(&count, sizeof(int)));
    *count = 0;
    tag<<<1, 1, 0, b>>>(flag, count, 42);
    sleep_ms(200);
    REQUIRE(*count == 0 && cudaStreamQuery(b) == cudaErrorNotReady);
    gate_open(gate);
    CHECK(cudaStreamSynchronize(b));
    REQUIRE(*count == 1 && flag[0] == 42);
    REQUIRE(cudaEventQuery(stop) == cudaSuccess);

    // Re-recording makes the event pending again.
    Gate gate2;
    CHECK(cudaLaunchHostFunc(a, gate_wait, &gate2));
    CHECK(cudaEventRecord(stop, a));
    REQUIRE(cudaEventQuery(stop) == cudaErrorNotReady);
    gate_open(gate2);
    CHECK(cudaEventSynchronize(stop));

    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(never));
    EXPECT_ERR(cudaEventQuery(never), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
    std::printf("OK events\n");
    return 0;
}

// The legacy default stream waits for blocking streams, and they for it.
static int cmd_legacy()
{
    int *log, *count;
    CHECK(cudaMallocManaged(&log, 64 * sizeof(int)));
    CHECK(cudaMallocManaged(&count, sizeof(int)));
    *count = 0;
    cudaStream_t blocking;
    CHECK(cudaStreamCreate(&blocking));
    Gate gate;
    CHECK(cudaLaunchHostFunc(blocking, gate_wait, &gate));
    tag<<<1, 1, 0, blocking>>>(log, count, 1);
    tag<<<1, 1, 0, cudaStreamLegacy>>>(log, count, 2);  // waits for `blocking`
    tag<<<1, 1, 0, blocking>>>(log, count, 3);          // waits for the legacy stream
    sleep_ms(200);
    REQUIRE(*count == 0);
    REQUIRE(cudaStreamQuery(cudaStreamLegacy) == cudaErrorNotReady);
    gate_open(gate);
    CHECK(cudaDeviceSynchronize());
    REQUIRE(*count == 3 && log[0] == 1 && log[1] == 2 && log[2] == 3);

    // The other direction alone: a stalled legacy stream holds up later work
    // on a blocking stream, but not on a non-blocking one.
    cudaStream_t nb;
    CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    *count = 0;
    Gate legacy_gate;
    CHECK(cudaLaunchHostFunc(cudaStreamLegacy, gate_wait, &legacy_gate));
    tag<<<1, 1, 0, blocking>>>(log, count, 4);
    tag<<<1, 1, 0, nb>>>(log, count, 5);
    CHECK(cudaStreamSynchronize(nb));
    sleep_ms(100);
    REQUIRE(*count == 1 && log[0] == 5);
    REQUIRE(cudaStreamQuery(blocking) == cudaErrorNotReady);
    gate_open(legacy_gate);
    CHECK(cudaDeviceSynchronize());
    REQUIRE(*count == 2 && log[1] == 4);
    CHECK(cudaStreamDestroy(nb));
    CHECK(cudaStreamDestroy(blocking));
    std::printf("OK legacy\n");
    return 0;
}

// A non-blocking stream neither waits for nor holds up the legacy stream.
static int cmd_nonblocking()
{
    int *log, *count;
    CHECK(cudaMallocManaged(&log, 64 * sizeof(int)));
    CHECK(cudaMallocManaged(&count, sizeof(int)));
    *count = 0;
    cudaStream_t nb;
    CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    unsigned flags = 0;
    CHECK(cudaStreamGetFlags(nb, &flags));
    REQUIRE(flags == cudaStreamNonBlocking);
    Gate gate;
    CHECK(cudaLaunchHostFunc(nb, gate_wait, &gate));
    tag<<<1, 1, 0, nb>>>(log, count, 1);
    tag<<<1, 1, 0, cudaStreamLegacy>>>(log, count, 2);  // does not wait for nb
    CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    REQUIRE(*count == 1 && log[0] == 2);
    REQUIRE(cudaStreamQuery(nb) == cudaErrorNotReady);
    gate_open(gate);
    CHECK(cudaStreamSynchronize(nb));
    REQUIRE(*count == 2 && log[1] == 1);
    CHECK(cudaStreamDestroy(nb));
    std::printf("OK nonblocking\n");
    return 0;
}

// Stream 0 of two host threads.  Built with --default-stream per-thread the
// two are independent; built normally both are the legacy stream.
static int cmd_per_thread()
{
    int *log, *count;
    CHECK(cudaMallocManaged(&log, 64 * sizeof(int)));
    CHECK(cudaMallocManaged(&count, sizeof(int)));
    *count = 0;
    Gate gate;
    std::thread t([&] {
        CHECK(cudaLaunchHostFunc(0, gate_wait, &gate));
        tag<<<1, 1>>>(log, count, 1);
    });
    t.join();
    tag<<<1, 1>>>(log, count, 2);
    sleep_ms(200);
    int seen = *count;
#ifdef __CUDART_API_PER_THREAD_DEFAULT_STREAM
    std::printf("per-thread default stream\n");
    REQUIRE(seen == 1 && log[0] == 2);   // not held up by the other thread's gate
#else
    std::printf("legacy default stream\n");
    REQUIRE(seen == 0);                  // same stream: behind the gate
#endif
    gate_open(gate);
    CHECK(cudaDeviceSynchronize());
    REQUIRE(*count == 2);
    std::printf("OK per_thread\n");
    return 0;
}

// JITCKPT_SIMDEV_FAULT=op=cudaLaunchKernel,call=2,kind=sticky
static int cmd_fault_sticky()
{
    int *d;
    CHECK(cudaMalloc(&d, 64 * sizeof(int)));
    affine<<<1, 64>>>(d, 64, 1, 1);
    CHECK(cudaGetLastError());
    affine<<<1, 64>>>(d, 64, 1, 1);                   // the injected fault
    EXPECT_ERR(cudaGetLastError(), cudaErrorIllegalAddress);
    EXPECT_ERR(cudaGetLastError(), cudaErrorIllegalAddress);   // sticky: not cleared
    void *p;
    EXPECT_ERR(cudaMalloc(&p, 16), cudaErrorIllegalAddress);
    EXPECT_ERR(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    int h;
    EXPECT_ERR(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost), cudaErrorIllegalAddress);
    cudaStream_t s;
    EXPECT_ERR(cudaStreamCreate(&s), cudaErrorIllegalAddress);
    std::printf("OK fault_sticky\n");
    return 0;
}

// JITCKPT_SIMDEV_FAULT=op=cudaMemcpyAsync,call=1,kind=lost
static int cmd_fault_lost()
{
    int *d, h[4] = {0};
    CHECK(cudaMalloc(&d, 16));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    Gate gate;                       // never opened: work queued before the loss
    CHECK(cudaLaunchHostFunc(s, gate_wait, &gate));
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    CHECK(cudaEventRecord(ev, s));
    EXPECT_ERR(cudaMemcpyAsync(h, d, 16, cudaMemcpyDeviceToHost, s), cudaErrorDevicesUnavailable);
    EXPECT_ERR(cudaEventQuery(ev), cudaErrorDevicesUnavailable);   // not NotReady any more
    EXPECT_ERR(cudaStreamSynchronize(s), cudaErrorDevicesUnavailable);
    EXPECT_ERR(cudaDeviceSynchronize(), cudaErrorDevicesUnavailable);
    EXPECT_ERR(cudaMalloc((void **)&d, 16), cudaErrorDevicesUnavailable);
    EXPECT_ERR(cudaGetLastError(), cudaErrorDevicesUnavailable);
    gate_open(gate);
    std::printf("OK fault_lost\n");
    return 0;
}

// JITCKPT_SIMDEV_FAULT=op=cudaMemcpyAsync,call=2,kind=hang
static int cmd_fault_hang()
{
    int *d, h[4] = {1, 2, 3, 4};
    int *pinned;
    CHECK(cudaMalloc(&d, 16));
    CHECK(cudaMallocHost(&pinned, 16));
    cudaStream_t s, other;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CHECK(cudaMemcpyAsync(d, h, 16, cudaMemcpyHostToDevice, s));          // call 1
    CHECK(cudaMemcpyAsync(pinned, d, 16, cudaMemcpyDeviceToHost, s));     // call 2 hangs
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventRecord(ev, s));
    REQUIRE(stays_not_ready(ev, 1000));
    // Other streams keep working, and so does the host API.
    CHECK(cudaMemsetAsync(d, 0, 16, other));
    CHECK(cudaStreamSynchronize(other));
    REQUIRE(cudaStreamQuery(s) == cudaErrorNotReady);
    std::printf("OK fault_hang\n");
    return 0;                        // a process can exit with a hung stream
}

// JITCKPT_SIMDEV_FAULT=op=_Z4spinx,kind=slow,delay_ms=300
static int cmd_fault_slow()
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    double t0 = now_ms();
    CHECK(cudaEventRecord(a, s));
    spin<<<1, 1, 0, s>>>(0);          // delayed on the stream, not on the host
    CHECK(cudaEventRecord(b, s));
    double host = now_ms() - t0;
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    std::printf("host %.1f ms, stream %.1f ms\n", host, ms);
    REQUIRE(host < 100 && ms >= 290);
    std::printf("OK fault_slow\n");
    return 0;
}

static void CUDART_CB on_done(cudaStream_t, cudaError_t status, void *p)
{
    *static_cast<int *>(p) = status == cudaSuccess ? 1 : -1;
}

// Stream-ordered allocation and callbacks.
static int cmd_async_alloc()
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *d = nullptr;
    CHECK(cudaMallocAsync((void **)&d, 1024 * sizeof(int), s));
    CHECK(cudaMemsetAsync(d, 0, 1024 * sizeof(int), s));
    affine<<<4, 256, 0, s>>>(d, 1024, 1, 9);
    int *pinned;
    CHECK(cudaMallocHost(&pinned, 1024 * sizeof(int)));
    CHECK(cudaMemcpyAsync(pinned, d, 1024 * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(d, s));
    int done = 0;
    CHECK(cudaStreamAddCallback(s, on_done, &done, 0));
    CHECK(cudaStreamSynchronize(s));
    REQUIRE(done == 1);
    for (int i = 0; i < 1024; i++)
        REQUIRE(pinned[i] == 9);
    cudaStreamCaptureStatus cs;
    CHECK(cudaStreamIsCapturing(s, &cs));
    REQUIRE(cs == cudaStreamCaptureStatusNone);
    CHECK(cudaStreamDestroy(s));
    std::printf("OK async_alloc\n");
    return 0;
}

int main(int argc, char **argv)
{
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "ordering") return cmd_ordering();
    if (cmd == "events") return cmd_events();
    if (cmd == "legacy") return cmd_legacy();
    if (cmd == "nonblocking") return cmd_nonblocking();
    if (cmd == "per_thread") return cmd_per_thread();
    if (cmd == "fault_sticky") return cmd_fault_sticky();
    if (cmd == "fault_lost") return cmd_fault_lost();
    if (cmd == "fault_hang") return cmd_fault_hang();
    if (cmd == "fault_slow") return cmd_fault_slow();
    if (cmd == "async_alloc") return cmd_async_alloc();
    std::fprintf(stderr, "usage: %s <subcommand>\n", argv[0]);
    return 2;
}
