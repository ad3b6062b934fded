// kernel_time.cu -- how long each kernel of examples/cuda_mlp takes at a given batch.
//
//     build/kernel_time BATCH [REPS]
//
// The six kernels are declared exactly as in examples/cuda_mlp/mlp.cu (the same
// one-line extern "C" wrappers around mlp_math.h, the same 128-thread blocks and
// grid sizes), so on the CPU device emulator they run the same host twins
// (examples/cuda_mlp/build/libmlp_twins.so through JITCKPT_SIMDEV_KERNELS, whose
// names match), and on a GPU the same device code.  Buffers hold the program's
// initial parameters and the data of its first step.
//
// Per kernel, REPS times (after 5 warm-up launches):
//   record(start); launch; record(stop); cudaStreamSynchronize
// and prints two medians:
//   event_us  cudaEventElapsedTime(start, stop): the time the stream spent on the
//             kernel (on the emulator the events are stamped by the stream's
//             worker thread when it reaches them, so this is the twin's run time
//             plus the emulator's per-operation cost, without the host side of
//             the launch);
//   sync_us   host wall time from before the launch to after the synchronisation
//             returned (the launch's host cost and the wake-up included).
// One line per kernel:  KERNEL event_us sync_us
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "mlp_math.h"

#include "mlp_kernels.cuh"

#define CHECK(call)                                                                                      \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            std::fprintf(stderr, "kernel_time: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,         \
                         cudaGetErrorName(e_));                                                          \
            std::exit(1);                                                                                \
        }                                                                                                \
    } while (0)

constexpr int kBlock = 128;  // as in mlp.cu

static double now_us()
{
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        std::fprintf(stderr, "usage: kernel_time BATCH [REPS]\n");
        return 2;
    }
    const int B = std::atoi(argv[1]);
    const int reps = argc > 2 ? std::atoi(argv[2]) : 50;
    if (B < 1 || reps < 1) {
        std::fprintf(stderr, "kernel_time: BATCH and REPS must be positive\n");
        return 2;
    }
    std::vector<float> params(mlp::kParams), batch((size_t)B * mlp::kIn + B);
    mlp::init_params(1, params.data());
    for (int b = 0; b < B; b++)
        mlp::sample(1, (uint64_t)b, batch.data() + (size_t)b * mlp::kIn, batch.data() + (size_t)B * mlp::kIn + b);

    float *d_params, *d_grad, *d_m, *d_v, *d_batch, *d_act, *d_err, *d_delta;
    CHECK(cudaMalloc(&d_params, mlp::kParams * sizeof(float)));
    CHECK(cudaMalloc(&d_grad, mlp::kGradLen * sizeof(float)));
    CHECK(cudaMalloc(&d_m, mlp::kParams * sizeof(float)));
    CHECK(cudaMalloc(&d_v, mlp::kParams * sizeof(float)));
    CHECK(cudaMalloc(&d_batch, batch.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_act, (size_t)B * mlp::kHidden * sizeof(float)));
    CHECK(cudaMalloc(&d_err, (size_t)B * sizeof(float)));
    CHECK(cudaMalloc(&d_delta, (size_t)B * mlp::kHidden * sizeof(float)));
    CHECK(cudaMemcpy(d_params, params.data(), params.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_batch, batch.data(), batch.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_grad, 0, mlp::kGradLen * sizeof(float)));
    CHECK(cudaMemset(d_m, 0, mlp::kParams * sizeof(float)));
    CHECK(cudaMemset(d_v, 0, mlp::kParams * sizeof(float)));
    const float *d_x = d_batch, *d_y = d_batch + (size_t)B * mlp::kIn;
    const float inv_n = 1.0f / (float)B;

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));

    auto grid = [](int n) { return (unsigned)((n + kBlock - 1) / kBlock); };
    // The step's order, so that each kernel reads what the previous one wrote.
    const char *names[] = {"mlp_forward_hidden", "mlp_forward_output", "mlp_backward_output",
                           "mlp_backward_delta", "mlp_backward_hidden", "mlp_adam"};
    auto launch = [&](int k) {
        switch (k) {
        case 0: mlp_forward_hidden<<<grid(B * mlp::kHidden), kBlock, 0, s>>>(B, d_params, d_x, d_act); break;
        case 1: mlp_forward_output<<<grid(B), kBlock, 0, s>>>(B, d_params, d_act, d_y, d_err); break;
        case 2:
            mlp_backward_output<<<grid(mlp::kHidden + 1), kBlock, 0, s>>>(B, inv_n, d_act, d_err, d_grad);
            break;
        case 3:
            mlp_backward_delta<<<grid(B * mlp::kHidden), kBlock, 0, s>>>(B, inv_n, d_params, d_act, d_err, d_delta);
            break;
        case 4:
            mlp_backward_hidden<<<grid(mlp::kHidden * (mlp::kIn + 1)), kBlock, 0, s>>>(B, d_x, d_delta, d_grad);
            break;
        default:  // Adam with lr 0: the parameters stay the step's, whatever the repetitions
            mlp_adam<<<grid(mlp::kParams), kBlock, 0, s>>>(mlp::kParams, 0.0f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.001f,
                                                          d_params, d_grad, d_m, d_v);
        }
        CHECK(cudaGetLastError());
    };
    for (int k = 0; k < 6; k++) {
        for (int w = 0; w < 5; w++)
            launch(k);
        CHECK(cudaStreamSynchronize(s));
        std::vector<double> ev(reps), wall(reps);
        for (int r = 0; r < reps; r++) {
            const double t0 = now_us();
            CHECK(cudaEventRecord(start, s));
            launch(k);
            CHECK(cudaEventRecord(stop, s));
            CHECK(cudaStreamSynchronize(s));
            wall[r] = now_us() - t0;
            float ms = 0;
            CHECK(cudaEventElapsedTime(&ms, start, stop));
            ev[r] = 1000.0 * ms;
        }
        std::printf("%s %.1f %.1f\n", names[k], median(ev), median(wall));
    }
    return 0;
}
