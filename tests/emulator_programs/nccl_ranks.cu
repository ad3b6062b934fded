// nccl_ranks.cu -- NCCL collectives and point-to-point between processes,
// checked element by element against a reference every rank computes on the
// host, plus hangs, dead peers and injected faults.
//
// Environment: RANK, WORLD_SIZE, and JITCKPT_TEST_ID_FILE (rank 0 writes the
// ncclUniqueId there, the others read it).
// Usage: nccl_ranks <collectives|determinism|hang|peer_exit|sticky|lost|
//                    mismatch|nonblocking|bad_args|initall|graph>
#include "common.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>

#include <cmath>
#include <fcntl.h>
#include <unistd.h>
#include <vector>

#define NCHECK(expr)                                                                        \
    do {                                                                                    \
        ncclResult_t r_ = (expr);                                                           \
        if (r_ != ncclSuccess) {                                                            \
            std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #expr,  \
                         ncclGetErrorString(r_), ncclGetLastError(nullptr));                \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

static int g_rank, g_world;

static ncclUniqueId exchange_id()
{
    ncclUniqueId id;
    const char *path = std::getenv("JITCKPT_TEST_ID_FILE");
    REQUIRE(path != nullptr);
    if (g_rank == 0) {
        NCHECK(ncclGetUniqueId(&id));
        std::string tmp = std::string(path) + ".tmp";
        FILE *f = std::fopen(tmp.c_str(), "wb");
        REQUIRE(f && std::fwrite(&id, sizeof id, 1, f) == 1);
        std::fclose(f);
        REQUIRE(std::rename(tmp.c_str(), path) == 0);
    } else {
        double deadline = now_ms() + 30000;
        for (;;) {
            FILE *f = std::fopen(path, "rb");
            if (f) {
                size_t got = std::fread(&id, sizeof id, 1, f);
                std::fclose(f);
                if (got == 1)
                    break;
            }
            REQUIRE(now_ms() < deadline);
            sleep_ms(10);
        }
    }
    return id;
}

static ncclComm_t init_comm()
{
    g_rank = env_int("RANK", 0);
    g_world = env_int("WORLD_SIZE", 1);
    ncclUniqueId id = exchange_id();
    ncclComm_t comm;
    NCHECK(ncclCommInitRank(&comm, g_world, id, g_rank));
    int n = 0, r = -1;
    NCHECK(ncclCommCount(comm, &n));
    NCHECK(ncclCommUserRank(comm, &r));
    REQUIRE(n == g_world && r == g_rank);
    return comm;
}

// Deterministic inputs: small integers, so sums and products are exact in
// every type and on any device, whatever the reduction order.
static double input(int rank, size_t i, int salt)
{
    return (double)((rank * 31 + (int)(i % 1009) * 7 + salt * 13) % 5 + 1);
}

template <typename T> struct Type;
template <> struct Type<float> { static constexpr ncclDataType_t id = ncclFloat32; };
template <> struct Type<double> { static constexpr ncclDataType_t id = ncclFloat64; };
template <> struct Type<int32_t> { static constexpr ncclDataType_t id = ncclInt32; };
template <> struct Type<int64_t> { static constexpr ncclDataType_t id = ncclInt64; };
template <> struct Type<uint8_t> { static constexpr ncclDataType_t id = ncclUint8; };
template <> struct Type<__half> { static constexpr ncclDataType_t id = ncclFloat16; };
template <> struct Type<__nv_bfloat16> { static constexpr ncclDataType_t id = ncclBfloat16; };

static double reduce_ref(ncclRedOp_t op, size_t i, int salt, int world)
{
    double acc = input(0, i, salt);
    for (int r = 1; r < world; r++) {
        double v = input(r, i, salt);
        switch (op) {
        case ncclSum: case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMax: acc = std::max(acc, v); break;
        case ncclMin: acc = std::min(acc, v); break;
        default: break;
        }
    }
    return op == ncclAvg ? acc / world : acc;
}

template <typename T>
static void check_allreduce(ncclComm_t comm, cudaStream_t s, size_t count, ncclRedOp_t op,
                            bool in_place, int salt)
{
    std::vector<T> h(count), out(count);
    for (size_t i = 0; i < count; i++)
        h[i] = (T)(float)input(g_rank, i, salt);
    T *send, *recv;
    CHECK(cudaMalloc(&send, count * sizeof(T)));
    CHECK(cudaMalloc(&recv, count * sizeof(T)));
    CHECK(cudaMemcpyAsync(send, h.data(), count * sizeof(T), cudaMemcpyHostToDevice, s));
    NCHECK(ncclAllReduce(send, in_place ? send : recv, count, Type<T>::id, op, comm, s));
    CHECK(cudaMemcpyAsync(out.data(), in_place ? send : recv, count * sizeof(T),
                          cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        double want = reduce_ref(op, i, salt, g_world);
        if (op == ncclAvg && Type<T>::id != ncclFloat32 && Type<T>::id != ncclFloat64) {
            double sum = reduce_ref(ncclSum, i, salt, g_world);
            want = (double)((long long)sum / g_world);
        }
        double got = (double)(float)out[i];
        if (std::fabs(got - want) > 1e-5 * (1 + std::fabs(want))) {
            std::fprintf(stderr, "allreduce type %d op %d in_place %d: [%zu] = %g, want %g\n",
                         (int)Type<T>::id, (int)op, (int)in_place, i, got, want);
            std::exit(1);
        }
    }
    CHECK(cudaFree(send));
    CHECK(cudaFree(recv));
}

static std::vector<float> download(const float *d, size_t n, cudaStream_t s)
{
    std::vector<float> h(n);
    CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    return h;
}

static float *upload_input(size_t n, int salt, cudaStream_t s, int rank = -1)
{
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)input(rank < 0 ? g_rank : rank, i, salt);
    float *d;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMemcpyAsync(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
    return d;
}

static int cmd_collectives()
{
    ncclComm_t comm = init_comm();
    const int n = g_world, me = g_rank;
    const size_t count = (size_t)env_int("COUNT", 5000);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
    for (ncclRedOp_t op : ops) {
        check_allreduce<float>(comm, s, count, op, false, (int)op);
        check_allreduce<double>(comm, s, count, op, true, (int)op + 1);
        check_allreduce<int32_t>(comm, s, count, op, false, (int)op + 2);
        check_allreduce<int64_t>(comm, s, count, op, true, (int)op + 3);
    }
    check_allreduce<uint8_t>(comm, s, count, ncclMax, false, 9);
    check_allreduce<__half>(comm, s, count, ncclSum, false, 11);       // small integers: exact
    check_allreduce<__nv_bfloat16>(comm, s, count, ncclMax, true, 12);
    check_allreduce<float>(comm, 0, count, ncclSum, false, 10);   // legacy default stream

    // Broadcast from the last rank, in place.
    float *b = upload_input(count, 20, s);
    NCHECK(ncclBcast(b, count, ncclFloat, n - 1, comm, s));
    std::vector<float> h = download(b, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == (float)input(n - 1, i, 20));

    // Reduce to root 0.
    float *x = upload_input(count, 21, s), *y;
    CHECK(cudaMalloc(&y, count * sizeof(float)));
    CHECK(cudaMemsetAsync(y, 0, count * sizeof(float), s));
    NCHECK(ncclReduce(x, y, count, ncclFloat, ncclSum, 0, comm, s));
    h = download(y, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == (me == 0 ? (float)reduce_ref(ncclSum, i, 21, n) : 0.0f));

    // AllGather, ReduceScatter, AlltoAll, Gather, Scatter.
    float *big;
    CHECK(cudaMalloc(&big, count * n * sizeof(float)));
    NCHECK(ncclAllGather(x, big, count, ncclFloat, comm, s));
    h = download(big, count * n, s);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            REQUIRE(h[r * count + i] == (float)input(r, i, 21));

    float *full = upload_input(count * n, 22, s);
    NCHECK(ncclReduceScatter(full, y, count, ncclFloat, ncclMax, comm, s));
    h = download(y, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == (float)reduce_ref(ncclMax, me * count + i, 22, n));

    NCHECK(ncclAlltoAll(full, big, count, ncclFloat, comm, s));
    h = download(big, count * n, s);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            REQUIRE(h[r * count + i] == (float)input(r, me * count + i, 22));

    int groot = 1 % n;
    CHECK(cudaMemsetAsync(big, 0, count * n * sizeof(float), s));
    NCHECK(ncclGather(x, big, count, ncclFloat, groot, comm, s));
    h = download(big, count * n, s);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            REQUIRE(h[r * count + i] == (me == groot ? (float)input(r, i, 21) : 0.0f));

    NCHECK(ncclScatter(full, y, count, ncclFloat, 0, comm, s));
    h = download(y, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == (float)input(0, me * count + i, 22));

    // PreMulSum: sum of 0.5 * x.
    ncclRedOp_t half_sum;
    float scalar = 0.5f;
    NCHECK(ncclRedOpCreatePreMulSum(&half_sum, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
    NCHECK(ncclAllReduce(x, y, count, ncclFloat, half_sum, comm, s));
    h = download(y, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == 0.5f * (float)reduce_ref(ncclSum, i, 21, n));
    NCHECK(ncclRedOpDestroy(half_sum, comm));

    // A group: two all-reduces, a ring exchange bigger than the p2p ring
    // buffer, two ordered messages to the same peer, and a send to self.
    const size_t ring = (size_t)env_int("P2P_COUNT", 3 << 18);   // 3 MiB of floats
    float *a1 = upload_input(count, 30, s), *a2 = upload_input(count, 31, s);
    float *a3 = upload_input(count, 35, s);
    float *ring_out = upload_input(ring, 32, s), *ring_in, *m1, *m2, *m1_in, *m2_in, *self_in;
    CHECK(cudaMalloc(&ring_in, ring * sizeof(float)));
    m1 = upload_input(7, 33, s);
    m2 = upload_input(1000, 34, s);
    CHECK(cudaMalloc(&m1_in, 7 * sizeof(float)));
    CHECK(cudaMalloc(&m2_in, 1000 * sizeof(float)));
    CHECK(cudaMalloc(&self_in, count * sizeof(float)));
    int right = (me + 1) % n, left = (me + n - 1) % n;
    NCHECK(ncclGroupStart());
    NCHECK(ncclAllReduce(a1, a1, count, ncclFloat, ncclSum, comm, s));
    NCHECK(ncclSend(ring_out, ring, ncclFloat, right, comm, s));
    NCHECK(ncclRecv(ring_in, ring, ncclFloat, left, comm, s));
    NCHECK(ncclSend(m1, 7, ncclFloat, right, comm, s));
    NCHECK(ncclSend(m2, 1000, ncclFloat, right, comm, s));
    NCHECK(ncclRecv(m1_in, 7, ncclFloat, left, comm, s));
    NCHECK(ncclRecv(m2_in, 1000, ncclFloat, left, comm, s));
    NCHECK(ncclSend(a3, count, ncclFloat, me, comm, s));
    NCHECK(ncclRecv(self_in, count, ncclFloat, me, comm, s));
    NCHECK(ncclAllReduce(a2, a2, count, ncclFloat, ncclMin, comm, s));
    NCHECK(ncclGroupEnd());
    h = download(a1, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == (float)reduce_ref(ncclSum, i, 30, n));
    h = download(a2, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == (float)reduce_ref(ncclMin, i, 31, n));
    h = download(self_in, count, s);
    for (size_t i = 0; i < count; i++)
        REQUIRE(h[i] == (float)input(me, i, 35));
    h = download(ring_in, ring, s);
    for (size_t i = 0; i < ring; i++)
        REQUIRE(h[i] == (float)input(left, i, 32));
    h = download(m1_in, 7, s);
    for (size_t i = 0; i < 7; i++)
        REQUIRE(h[i] == (float)input(left, i, 33));
    h = download(m2_in, 1000, s);
    for (size_t i = 0; i < 1000; i++)
        REQUIRE(h[i] == (float)input(left, i, 34));

    NCHECK(ncclCommFinalize(comm));
    NCHECK(ncclCommDestroy(comm));
    std::printf("OK collectives rank %d\n", me);
    return 0;
}

static int cmd_determinism()
{
    ncclComm_t comm = init_comm();
    const size_t count = 200000;
    std::vector<float> h(count);
    uint32_t x = 12345u + 977u * (uint32_t)g_rank;
    for (size_t i = 0; i < count; i++) {        // values whose sum depends on the order
        x = x * 1664525u + 1013904223u;
        h[i] = (float)((x >> 8) % 100000) * 1e-3f * ((x & 1) ? 1.0f : -1.0f) * (1 + (x % 7) * 1e-4f);
    }
    float *d;
    CHECK(cudaMalloc(&d, count * sizeof(float)));
    CHECK(cudaMemcpy(d, h.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    NCHECK(ncclAllReduce(d, d, count, ncclFloat, ncclSum, comm, 0));
    CHECK(cudaMemcpy(h.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost));
    uint64_t hash = 1469598103934665603ull;
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(h.data());
    for (size_t i = 0; i < count * sizeof(float); i++)
        hash = (hash ^ bytes[i]) * 1099511628211ull;
    std::printf("HASH %016llx\n", (unsigned long long)hash);
    NCHECK(ncclCommDestroy(comm));
    return 0;
}

// JITCKPT_SIMDEV_FAULT=rank=R,op=ncclAllReduce,call=3,kind=hang
static int cmd_hang()
{
    ncclComm_t comm = init_comm();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *d = upload_input(1000, 1, s);
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) {
        CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
        NCHECK(ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, comm, s));   // returns at once
        CHECK(cudaEventRecord(ev[i], s));
    }
    CHECK(cudaEventSynchronize(ev[1]));          // the first two complete everywhere
    REQUIRE(stays_not_ready(ev[2], 1000));       // the third never does, on every rank
    ncclResult_t async;
    NCHECK(ncclCommGetAsyncError(comm, &async));
    REQUIRE(async == ncclSuccess);               // every peer is alive: a plain hang
    std::printf("NOT_READY_OK rank %d\n", g_rank);
    std::fflush(stdout);
    NCHECK(ncclCommAbort(comm));                 // returns although the op is stuck
    double deadline = now_ms() + 3000;
    while (cudaEventQuery(ev[2]) == cudaErrorNotReady) {
        REQUIRE(now_ms() < deadline);
        sleep_ms(10);
    }
    CHECK(cudaStreamSynchronize(s));             // the stream moves on after the abort
    std::printf("ABORT_RELEASED rank %d\n", g_rank);
    return 0;
}

// The last rank dies after the first all-reduce; the others see it.
static int cmd_peer_exit()
{
    ncclComm_t comm = init_comm();
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    float *d = upload_input(1000, 1, s);
    NCHECK(ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, comm, s));
    CHECK(cudaStreamSynchronize(s));
    if (g_rank == g_world - 1) {
        std::printf("EXITING rank %d\n", g_rank);
        std::fflush(stdout);
        _exit(0);
    }
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    NCHECK(ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, comm, s));
    CHECK(cudaEventRecord(ev, s));
    double deadline = now_ms() + 5000;
    ncclResult_t async = ncclSuccess;
    while (async == ncclSuccess) {
        REQUIRE(now_ms() < deadline);
        REQUIRE(cudaEventQuery(ev) == cudaErrorNotReady);
        NCHECK(ncclCommGetAsyncError(comm, &async));
        sleep_ms(20);
    }
    std::printf("ASYNC %s rank %d\n", ncclGetErrorString(async), g_rank);
    REQUIRE(async == ncclRemoteError);
    REQUIRE(cudaEventQuery(ev) == cudaErrorNotReady);   // still stuck until aborted
    NCHECK(ncclCommAbort(comm));
    CHECK(cudaEventSynchronize(ev));
    std::printf("OK peer_exit rank %d\n", g_rank);
    return 0;
}

// JITCKPT_SIMDEV_FAULT=op=ncclAllReduce,call=2,kind=sticky (or kind=lost)
static int fault_common(cudaError_t want_cuda)
{
    ncclComm_t comm = init_comm();
    float *d = upload_input(100, 1, 0);
    NCHECK(ncclAllReduce(d, d, 100, ncclFloat, ncclSum, comm, 0));
    CHECK(cudaDeviceSynchronize());
    ncclResult_t r = ncclAllReduce(d, d, 100, ncclFloat, ncclSum, comm, 0);
    std::printf("second allreduce: %s\n", ncclGetErrorString(r));
    REQUIRE(r == ncclUnhandledCudaError);
    REQUIRE(ncclAllReduce(d, d, 100, ncclFloat, ncclSum, comm, 0) == ncclUnhandledCudaError);
    ncclResult_t async;
    NCHECK(ncclCommGetAsyncError(comm, &async));
    REQUIRE(async == ncclUnhandledCudaError);
    void *p;
    EXPECT_ERR(cudaMalloc(&p, 16), want_cuda);
    EXPECT_ERR(cudaDeviceSynchronize(), want_cuda);
    NCHECK(ncclCommAbort(comm));
    std::printf("OK fault rank %d\n", g_rank);
    return 0;
}

// Ranks disagree about the count: every rank gets ncclInvalidUsage.
static int cmd_mismatch()
{
    ncclComm_t comm = init_comm();
    float *d = upload_input(200, 1, 0);
    NCHECK(ncclAllReduce(d, d, 100 + g_rank, ncclFloat, ncclSum, comm, 0));
    CHECK(cudaDeviceSynchronize());
    ncclResult_t async;
    NCHECK(ncclCommGetAsyncError(comm, &async));
    std::printf("ASYNC %s rank %d\n", ncclGetErrorString(async), g_rank);
    REQUIRE(async == ncclInvalidUsage);
    NCHECK(ncclCommAbort(comm));
    return 0;
}

static int cmd_nonblocking()
{
    g_rank = env_int("RANK", 0);
    g_world = env_int("WORLD_SIZE", 1);
    ncclUniqueId id = exchange_id();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRankConfig(&comm, g_world, id, g_rank, &config);
    REQUIRE(r == ncclInProgress || r == ncclSuccess);
    ncclResult_t async = ncclInProgress;
    double deadline = now_ms() + 10000;
    while (async == ncclInProgress) {
        REQUIRE(now_ms() < deadline);
        NCHECK(ncclCommGetAsyncError(comm, &async));
        sleep_ms(5);
    }
    REQUIRE(async == ncclSuccess);
    float *d = upload_input(100, 3, 0);
    NCHECK(ncclAllReduce(d, d, 100, ncclFloat, ncclMax, comm, 0));
    std::vector<float> h = download(d, 100, 0);
    for (size_t i = 0; i < 100; i++)
        REQUIRE(h[i] == (float)reduce_ref(ncclMax, i, 3, g_world));
    NCHECK(ncclCommDestroy(comm));
    std::printf("OK nonblocking rank %d\n", g_rank);
    return 0;
}

static int cmd_bad_args()
{
    ncclComm_t comm = init_comm();
    std::vector<float> pageable(10);
    float *d;
    CHECK(cudaMalloc(&d, 10 * sizeof(float)));
    REQUIRE(ncclAllReduce(pageable.data(), d, 10, ncclFloat, ncclSum, comm, 0) == ncclInvalidArgument);
    REQUIRE(std::strstr(ncclGetLastError(comm), "sendbuff") != nullptr);
    REQUIRE(ncclAllReduce(d, d, 11, ncclFloat, ncclSum, comm, 0) == ncclInvalidArgument);
    REQUIRE(std::strstr(ncclGetLastError(comm), "past the end") != nullptr);
    REQUIRE(ncclBroadcast(d, d, 10, ncclFloat, g_world, comm, 0) == ncclInvalidArgument);
    REQUIRE(ncclAllReduce(d, d, 10, (ncclDataType_t)99, ncclSum, comm, 0) == ncclInvalidArgument);
    REQUIRE(ncclSend(d, 10, ncclFloat, -1, comm, 0) == ncclInvalidArgument);
    REQUIRE(ncclGroupEnd() == ncclInvalidUsage);
    REQUIRE(ncclAllReduce(d, d, 10, ncclFloat, ncclSum, comm, (cudaStream_t)0x4321) != ncclSuccess);
    int v = 0;
    NCHECK(ncclGetVersion(&v));
    REQUIRE(v == NCCL_VERSION_CODE);
    NCHECK(ncclCommDestroy(comm));
    REQUIRE(ncclCommCount(comm, &v) == ncclInvalidArgument);
    std::printf("OK bad_args\n");
    return 0;
}

// One process, two emulated devices, one communicator per device.
static int cmd_initall()
{
    int ndev = 0;
    CHECK(cudaGetDeviceCount(&ndev));
    REQUIRE(ndev >= 2);
    ncclComm_t comms[2];
    NCHECK(ncclCommInitAll(comms, 2, nullptr));
    g_world = 2;
    cudaStream_t s[2];
    float *buf[2], *got[2];
    for (int i = 0; i < 2; i++) {
        CHECK(cudaSetDevice(i));
        CHECK(cudaStreamCreate(&s[i]));
        buf[i] = upload_input(1000, 5, s[i], i);
        CHECK(cudaMalloc(&got[i], 1000 * sizeof(float)));
        int dev = -1;
        NCHECK(ncclCommCuDevice(comms[i], &dev));
        REQUIRE(dev == i);
    }
    NCHECK(ncclGroupStart());
    for (int i = 0; i < 2; i++)
        NCHECK(ncclAllReduce(buf[i], buf[i], 1000, ncclFloat, ncclSum, comms[i], s[i]));
    for (int i = 0; i < 2; i++) {
        NCHECK(ncclSend(buf[i], 1000, ncclFloat, 1 - i, comms[i], s[i]));
        NCHECK(ncclRecv(got[i], 1000, ncclFloat, 1 - i, comms[i], s[i]));
    }
    NCHECK(ncclGroupEnd());
    for (int i = 0; i < 2; i++) {
        CHECK(cudaSetDevice(i));
        std::vector<float> h = download(got[i], 1000, s[i]);
        for (size_t k = 0; k < 1000; k++)
            REQUIRE(h[k] == (float)reduce_ref(ncclSum, k, 5, 2));
        NCHECK(ncclCommDestroy(comms[i]));
    }
    std::printf("OK initall\n");
    return 0;
}

// An all-reduce captured into a CUDA graph (PyTorch's pattern: the NCCL
// stream forks from the capturing stream and joins back) runs at every
// launch of the graph, and only then.
static int cmd_graph()
{
    ncclComm_t comm = init_comm();
    cudaStream_t s, nccl;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&nccl, cudaStreamNonBlocking));
    float *d = upload_input(1000, 2, s);
    CHECK(cudaStreamSynchronize(s));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(fork, s));
    CHECK(cudaStreamWaitEvent(nccl, fork, 0));
    NCHECK(ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, comm, nccl));
    CHECK(cudaEventRecord(join, nccl));
    CHECK(cudaStreamWaitEvent(s, join, 0));
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(s, &graph));
    std::vector<float> h = download(d, 1000, s);
    for (size_t k = 0; k < 1000; k++)
        REQUIRE(h[k] == (float)input(g_rank, k, 2));      // nothing ran yet
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    const int launches = 3;
    for (int i = 0; i < launches; i++)
        CHECK(cudaGraphLaunch(exec, s));
    h = download(d, 1000, s);
    for (size_t k = 0; k < 1000; k++) {
        // Each launch sums every rank's value: after n launches, world^(n-1) * sum.
        double want = reduce_ref(ncclSum, k, 2, g_world);
        for (int i = 1; i < launches; i++)
            want *= g_world;
        REQUIRE(h[k] == (float)want);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));      // before the communicator: the graph holds its ops
    NCHECK(ncclCommDestroy(comm));
    std::printf("OK graph rank %d\n", g_rank);
    return 0;
}

int main(int argc, char **argv)
{
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "collectives") return cmd_collectives();
    if (cmd == "determinism") return cmd_determinism();
    if (cmd == "hang") return cmd_hang();
    if (cmd == "peer_exit") return cmd_peer_exit();
    if (cmd == "sticky") return fault_common(cudaErrorIllegalAddress);
    if (cmd == "lost") return fault_common(cudaErrorDevicesUnavailable);
    if (cmd == "mismatch") return cmd_mismatch();
    if (cmd == "nonblocking") return cmd_nonblocking();
    if (cmd == "bad_args") return cmd_bad_args();
    if (cmd == "initall") return cmd_initall();
    if (cmd == "graph") return cmd_graph();
    std::fprintf(stderr, "usage: %s <subcommand>\n", argv[0]);
    return 2;
}
