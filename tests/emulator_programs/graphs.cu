// graphs.cu -- stream capture and CUDA graphs on the emulator: what a capture
// records, that nothing runs until the graph is launched, the fork/join
// pattern across streams, and the rules a watchdog must respect (an event
// recorded in a capture cannot be queried: doing so invalidates the capture).
//
// Usage: graphs <capture|captured_event|rules>
#include "common.h"

#include <vector>

// x[i] += v
extern "C" __global__ void add_to(int *x, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += v;
}

extern "C" void add_to__host(dim3 grid, dim3 block, size_t, void **args)
{
    int *x = *(int **)args[0];
    int n = *(int *)args[1], v = *(int *)args[2];
    for (int i = 0; i < (int)(grid.x * block.x) && i < n; i++)
        x[i] += v;
}

static void sleep_200ms(void *) { sleep_ms(200); }

static const int N = 256;

// A capture on s forks to s2 and joins back; the graph runs only when launched.
static int cmd_capture()
{
    cudaStream_t s, s2;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    int *d, *h;
    CHECK(cudaMalloc(&d, N * sizeof(int)));
    CHECK(cudaMallocHost(&h, N * sizeof(int)));
    std::memset(h, 0xff, N * sizeof(int));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    cudaGraph_t being_built = nullptr;
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id, &being_built));
    REQUIRE(st == cudaStreamCaptureStatusActive && id != 0 && being_built != nullptr);
    CHECK(cudaMemsetAsync(d, 0, N * sizeof(int), s));
    add_to<<<N / 64, 64, 0, s>>>(d, N, 1);               // x = 1
    CHECK(cudaEventRecord(fork, s));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));             // s2 joins the capture
    CHECK(cudaStreamIsCapturing(s2, &st));
    REQUIRE(st == cudaStreamCaptureStatusActive);
    add_to<<<N / 64, 64, 0, s2>>>(d, N, 2);              // x = 3
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s, join, 0));              // and joins back
    add_to<<<N / 64, 64, 0, s>>>(d, N, 4);               // x = 7
    CHECK(cudaMemcpyAsync(h, d, N * sizeof(int), cudaMemcpyDeviceToHost, s));
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph));
    REQUIRE(graph != nullptr);
    CHECK(cudaStreamIsCapturing(s, &st));
    REQUIRE(st == cudaStreamCaptureStatusNone);
    CHECK(cudaStreamIsCapturing(s2, &st));
    REQUIRE(st == cudaStreamCaptureStatusNone);
    CHECK(cudaDeviceSynchronize());
    REQUIRE(h[0] == -1 && h[N - 1] == -1);              // nothing ran during the capture
    std::printf("CAPTURED nothing ran\n");

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaStream_t launch;
    CHECK(cudaStreamCreate(&launch));
    for (int round = 0; round < 3; round++) {
        std::memset(h, 0xff, N * sizeof(int));
        CHECK(cudaGraphLaunch(exec, launch));
        CHECK(cudaStreamSynchronize(launch));
        for (int i = 0; i < N; i++)
            REQUIRE(h[i] == 7);
    }
    // The events recorded by the launched graph are ordinary events again.
    CHECK(cudaEventQuery(join));
    std::printf("LAUNCHED 3 times ok\n");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    std::printf("OK capture\n");
    return 0;
}

// Querying an event recorded in a capture, here from another thread as a
// watchdog would, fails and invalidates the capture.
static int cmd_captured_event()
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d;
    CHECK(cudaMalloc(&d, N * sizeof(int)));
    cudaEvent_t ev, plain;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
    CHECK(cudaEventRecord(plain, s));
    CHECK(cudaStreamSynchronize(s));

    // A query of an event recorded outside the capture does no harm.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add_to<<<N / 64, 64, 0, s>>>(d, N, 1);
    CHECK(cudaEventRecord(ev, s));
    cudaError_t from_thread = cudaSuccess;
    std::thread([&] { from_thread = cudaEventQuery(plain); }).join();
    REQUIRE(from_thread == cudaSuccess);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph));
    REQUIRE(graph != nullptr);
    CHECK(cudaGraphDestroy(graph));
    std::printf("UNRELATED_QUERY_OK\n");

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add_to<<<N / 64, 64, 0, s>>>(d, N, 1);
    CHECK(cudaEventRecord(ev, s));
    std::thread([&] { from_thread = cudaEventQuery(ev); }).join();
    EXPECT_ERR(from_thread, cudaErrorCapturedEvent);
    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st));
    REQUIRE(st == cudaStreamCaptureStatusInvalidated);
    EXPECT_ERR(cudaEventSynchronize(ev), cudaErrorCapturedEvent);
    graph = (cudaGraph_t)0x1;
    EXPECT_ERR(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    REQUIRE(graph == nullptr);
    CHECK(cudaStreamIsCapturing(s, &st));
    REQUIRE(st == cudaStreamCaptureStatusNone);
    (void)cudaGetLastError();
    // The stream works normally again.
    add_to<<<N / 64, 64, 0, s>>>(d, N, 1);
    CHECK(cudaStreamSynchronize(s));
    std::printf("OK captured_event\n");
    return 0;
}

static int cmd_rules()
{
    cudaStream_t s, other;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    EXPECT_ERR(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal),
               cudaErrorStreamCaptureUnsupported);
    EXPECT_ERR(cudaStreamEndCapture(s, &graph), cudaErrorIllegalState);

    // Synchronising a capturing stream invalidates the capture.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT_ERR(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    EXPECT_ERR(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    EXPECT_ERR(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);

    // A capture may not wait for unfinished work outside it.
    cudaEvent_t outside;
    CHECK(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming));
    CHECK(cudaLaunchHostFunc(other, sleep_200ms, nullptr));
    CHECK(cudaEventRecord(outside, other));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT_ERR(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureIsolation);
    EXPECT_ERR(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    CHECK(cudaStreamSynchronize(other));

    // A global-mode capture ends on the thread that began it; relaxed on any.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaError_t elsewhere = cudaSuccess;
    std::thread([&] { elsewhere = cudaStreamEndCapture(s, &graph); }).join();
    EXPECT_ERR(elsewhere, cudaErrorStreamCaptureWrongThread);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    std::thread([&] { elsewhere = cudaStreamEndCapture(s, &graph); }).join();
    CHECK(elsewhere);
    CHECK(cudaGraphDestroy(graph));

    // The thread's capture mode is swapped, and the old one handed back.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    REQUIRE(mode == cudaStreamCaptureModeGlobal);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    REQUIRE(mode == cudaStreamCaptureModeRelaxed);
    (void)cudaGetLastError();
    std::printf("OK rules\n");
    return 0;
}

int main(int argc, char **argv)
{
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "capture") return cmd_capture();
    if (cmd == "captured_event") return cmd_captured_event();
    if (cmd == "rules") return cmd_rules();
    std::fprintf(stderr, "usage: %s <capture|captured_event|rules>\n", argv[0]);
    return 2;
}
