// passthrough.cu -- a small data-parallel "training" loop in the shape of
// DDP (paper Figure 3), used by tests/test_interpose.py to check that the
// passthrough interposer is transparent: the program prints the same bytes
// with and without LD_PRELOAD=libjitckpt_interpose.so.
//
// Per round: a kernel makes a "gradient" on the compute stream; the NCCL
// stream waits for it (event + cudaStreamWaitEvent), all-reduces it and
// records an event that the compute stream waits for before the "optimizer"
// kernel; the parameters are copied back and synchronised.  It also uses the
// other calls the interposer wraps (2-D copies, sets, event records with
// flags, cudaLaunchKernelExC, device and event synchronisation, an
// all-reduce on the legacy stream) and checks every value against a host
// reference.  Built twice: default and --default-stream per-thread (the
// _ptsz/_ptds entry points).
//
// Environment: RANK, WORLD_SIZE, JITCKPT_TEST_ID_FILE (rank 0 writes the
// ncclUniqueId there).  Prints "RESULT <fnv-1a hash of the parameters>".
#include "common.h"

extern "C" __global__ void make_grad(int n, const float *param, float *grad, float bias)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) grad[i] = 0.5f * param[i] + bias;
}

extern "C" __global__ void sgd_step(int n, float lr, const float *grad, float *param)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) param[i] = param[i] - lr * grad[i];
}

// Host twins (emulator/README.md, "Kernels run as host twins").
extern "C" void make_grad__host(dim3 grid, dim3 block, size_t, void **args)
{
    int n = *(int *)args[0];
    const float *param = *(const float **)args[1];
    float *grad = *(float **)args[2];
    float bias = *(float *)args[3];
    for (int i = 0; i < (int)(grid.x * block.x) && i < n; i++) grad[i] = 0.5f * param[i] + bias;
}

extern "C" void sgd_step__host(dim3 grid, dim3 block, size_t, void **args)
{
    int n = *(int *)args[0];
    float lr = *(float *)args[1];
    const float *grad = *(const float **)args[2];
    float *param = *(float **)args[3];
    for (int i = 0; i < (int)(grid.x * block.x) && i < n; i++) param[i] = param[i] - lr * grad[i];
}

int main()
{
    const int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1);
    const int n = 4096, rounds = env_int("ROUNDS", 6), threads = 128;
    const float lr = 0.01f;
    ncclUniqueId id = exchange_id(rank);
    ncclComm_t comm;
    NCHECK(ncclCommInitRank(&comm, world, id, rank));

    cudaStream_t nccl_stream, compute = 0;       // compute: the default stream, as in PyTorch
    CHECK(cudaStreamCreateWithFlags(&nccl_stream, cudaStreamNonBlocking));
    float *param, *grad, *host;
    CHECK(cudaMalloc(&param, n * sizeof(float)));
    CHECK(cudaMalloc(&grad, n * sizeof(float)));
    CHECK(cudaMallocHost(&host, n * sizeof(float)));
    std::vector<float> ref(n), g(n);
    for (int i = 0; i < n; i++) ref[i] = (float)(i % 97) * 0.25f;
    CHECK(cudaMemcpy(param, ref.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(grad, 0, n * sizeof(float)));

    cudaEvent_t reused;      // re-recorded every round, as PyTorch's event pools do
    CHECK(cudaEventCreateWithFlags(&reused, cudaEventDisableTiming));
    for (int r = 0; r < rounds; r++) {
        cudaEvent_t ready, done;
        CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        float bias = (float)(r + rank);
        make_grad<<<(n + threads - 1) / threads, threads, 0, compute>>>(n, param, grad, bias);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(ready, compute));
        CHECK(cudaStreamWaitEvent(nccl_stream, ready, 0));
        NCHECK(ncclAllReduce(grad, grad, n, ncclFloat, ncclSum, comm, nccl_stream));
        CHECK(r % 2 ? cudaEventRecordWithFlags(done, nccl_stream, cudaEventRecordDefault)
                    : cudaEventRecord(done, nccl_stream));
        CHECK(cudaStreamWaitEvent(compute, done, 0));
        CHECK(cudaEventRecord(reused, nccl_stream));
        CHECK(cudaStreamWaitEvent(compute, reused, 0));
        if (r % 2 == 0) {
            sgd_step<<<(n + threads - 1) / threads, threads, 0, compute>>>(n, lr, grad, param);
        } else {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((n + threads - 1) / threads);
            cfg.blockDim = dim3(threads);
            cfg.stream = compute;
            CHECK(cudaLaunchKernelEx(&cfg, sgd_step, n, lr, (const float *)grad, param));
        }
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(host, param, n * sizeof(float), cudaMemcpyDeviceToHost, compute));
        CHECK(cudaStreamSynchronize(compute));
        CHECK(cudaEventSynchronize(done));

        // Host reference: the all-reduce sums ranks 0..world-1 in order.
        for (int i = 0; i < n; i++) {
            float sum = 0.0f;
            for (int k = 0; k < world; k++) sum += 0.5f * ref[i] + (float)(r + k);
            g[i] = sum;
            ref[i] = ref[i] - lr * g[i];
        }
        for (int i = 0; i < n; i++)
            REQUIRE(std::fabs(host[i] - ref[i]) <= 1e-4f * (1.0f + std::fabs(ref[i])));
        CHECK(cudaEventDestroy(ready));
        CHECK(cudaEventDestroy(done));
    }

    // An all-reduce on the legacy stream, then 2-D copies and a device sync.
    NCHECK(ncclAllReduce(param, grad, n, ncclFloat, ncclMax, comm, 0));
    float *pitched;
    size_t pitch;
    CHECK(cudaMallocPitch(&pitched, &pitch, 64 * sizeof(float), 64));
    CHECK(cudaMemcpy2D(pitched, pitch, grad, 64 * sizeof(float), 64 * sizeof(float), 64,
                       cudaMemcpyDeviceToDevice));
    CHECK(cudaMemsetAsync(grad, 0, n * sizeof(float), compute));
    CHECK(cudaMemcpy2DAsync(grad, 64 * sizeof(float), pitched, pitch, 64 * sizeof(float), 64,
                            cudaMemcpyDeviceToDevice, compute));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host, grad, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) REQUIRE(host[i] == ref[i]);   // max of identical replicas

    uint64_t hash = 1469598103934665603ull;
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(host);
    for (size_t i = 0; i < n * sizeof(float); i++) hash = (hash ^ bytes[i]) * 1099511628211ull;
    std::printf("param[1]=%.6f param[%d]=%.6f\n", host[1], n - 1, host[n - 1]);
    std::printf("RESULT %016llx\n", (unsigned long long)hash);
    CHECK(cudaEventDestroy(reused));
    CHECK(cudaStreamDestroy(nccl_stream));
    NCHECK(ncclCommDestroy(comm));
    return 0;
}
