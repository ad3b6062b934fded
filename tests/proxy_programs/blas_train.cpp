// blas_train.cpp -- a data-parallel training program whose every computation is a cuBLAS GEMM
// (tests/test_proxy_cublas.py: transparent recovery of cuBLAS calls, issue 19).
//
// Linear regression of W (kOut x kIn), column-major as cuBLAS wants, on each rank's own batch:
//   err = W x - y              cublasSgemm (beta = -1 over a copy of y)
//   g   = err x^T / B          cublasSgemm (N, T)
//   ncclAllReduce(g, sum)      on a stream of its own, ordered with events
//   W  -= lr / world * g       cublasSgemm with an identity matrix (beta = 1), between
//                              jitckpt_phase_optimizer_begin/end when they exist
// With --lt 1 (or BLAS_TRAIN_LT=1) the forward GEMM is a cublasLtMatmul instead, called as PyTorch calls it: the cuBLAS
// handle cast to a cuBLASLt handle, a matmul descriptor, four layouts and a preference created, set
// and destroyed around every call, the algorithm from cublasLtMatmulAlgoGetHeuristic, the workspace,
// and a fixed bias b through the BIAS epilogue (err = W x + b - y).
// The handle works on a created stream with the device pointer mode for the optimizer's
// scalars (in device memory) and the host mode for the others, and a workspace: what a
// recovery must give back to a new proxy.  No kernel of its own, so no nvcc and no
// kernel twins: g++ against the CUDA runtime, NCCL and cuBLAS.  Ranks share the NCCL id
// through --rendezvous-dir (examples/cuda_mlp/rendezvous.cpp); what dnn_train.cpp does the same way (the job,
// the streams, the inputs, the checksum) is in train_common.h.  Prints, as cuda_mlp does,
//   [rank R] final parameters checksum <FNV-1a 64 of W>
// and exits 1 at any failed call.  TRAIN_TIME_STEP=R:N: rank R times step N with CUDA events (train_common.h);
// BLAS_TRAIN_MANAGED=1: the program allocates managed memory, which turns its transparent recovery off.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define TRAIN_PROGRAM "blas_train"
#include "train_common.h"

#define BLAS(x) do { cublasStatus_t s_ = (x); check(s_ == CUBLAS_STATUS_SUCCESS, #x, __LINE__, cublasGetStatusName(s_)); } while (0)

namespace {

using namespace train;

constexpr int kIn = 24, kOut = 8, kBatch = 16;

// err = W x + b - y as PyTorch's addmm does it through cuBLASLt (everything created per call).
void lt_forward(cublasLtHandle_t lt, const float *w, const float *x, const float *b, float *err, void *workspace,
                size_t workspace_bytes, cudaStream_t stream)
{
    cublasLtMatmulDesc_t desc;
    BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_n = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_n, sizeof op_n));
    BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
    BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
    cublasLtMatrixLayout_t a_l, b_l, c_l;
    BLAS(cublasLtMatrixLayoutCreate(&a_l, CUDA_R_32F, kOut, kIn, kOut));
    BLAS(cublasLtMatrixLayoutCreate(&b_l, CUDA_R_32F, kIn, kBatch, kIn));
    BLAS(cublasLtMatrixLayoutCreate(&c_l, CUDA_R_32F, kOut, kBatch, kOut));
    cublasLtMatmulPreference_t pref;
    BLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes;
    BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t found = {};
    int n = 0;
    BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, a_l, b_l, c_l, c_l, pref, 1, &found, &n));
    check(n == 1, "cublasLtMatmulAlgoGetHeuristic", __LINE__, "no algorithm");
    int32_t scale_type = -1;
    size_t written = 0;  // an attribute never set: the library's default, the creation's scale type
    BLAS(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &scale_type, sizeof scale_type,
                                        &written));
    check(scale_type == CUDA_R_32F && written == sizeof scale_type, "the scale type", __LINE__, "not CUDA_R_32F");
    const float one = 1.0f, minus_one = -1.0f;
    BLAS(cublasLtMatmul(lt, desc, &one, w, a_l, x, b_l, &minus_one, err, c_l, err, c_l, &found.algo, workspace,
                        workspace_bytes, stream));
    BLAS(cublasLtMatmulPreferenceDestroy(pref));
    BLAS(cublasLtMatrixLayoutDestroy(c_l));
    BLAS(cublasLtMatrixLayoutDestroy(b_l));
    BLAS(cublasLtMatrixLayoutDestroy(a_l));
    BLAS(cublasLtMatmulDescDestroy(desc));
}

}  // namespace

int main(int argc, char **argv)
{
    int lt = env_int("BLAS_TRAIN_LT", 0);
    const Options opt = parse_options(argc, argv, [&](const char *name, const char *value) {
        if (!std::strcmp(name, "--lt"))
            lt = std::atoi(value);
    });
    const int steps = opt.steps;
    const Job job = join(opt.rendezvous_dir);
    const int rank = job.rank, world = job.world;
    const Streams streams = make_streams();
    cudaStream_t compute = streams.compute;

    std::vector<float> w(kOut * kIn), ident(kOut * kOut, 0.0f), batch((kIn + kOut) * kBatch);
    for (int i = 0; i < kOut * kIn; i++)
        w[i] = 0.1f * uniform(1000 + i);  // the same initial W on every rank
    for (int i = 0; i < kOut; i++)
        ident[i * kOut + i] = 1.0f;
    std::vector<float> bias(kOut);
    for (int i = 0; i < kOut; i++)
        bias[i] = 0.05f * uniform(5000 + i);
    float *d_w, *d_ident, *d_batch, *d_err, *d_g, *d_scalars, *d_bias;
    void *d_workspace;
    CUDA(cudaMalloc((void **)&d_w, w.size() * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_ident, ident.size() * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_batch, batch.size() * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_err, kOut * kBatch * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_g, kOut * kIn * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_scalars, 2 * sizeof(float)));
    CUDA(cudaMalloc(&d_workspace, 1 << 16));
    CUDA(cudaMalloc((void **)&d_bias, kOut * sizeof(float)));
    CUDA(cudaMemcpy(d_bias, bias.data(), kOut * sizeof(float), cudaMemcpyHostToDevice));
    const float lr = 0.05f, scalars[2] = {-lr / (float)world, 1.0f};  // the optimizer's alpha and beta
    CUDA(cudaMemcpy(d_w, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA(cudaMemcpy(d_ident, ident.data(), ident.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA(cudaMemcpy(d_scalars, scalars, sizeof scalars, cudaMemcpyHostToDevice));
    float *d_x = d_batch, *d_y = d_batch + kIn * kBatch;

    if (env_int("BLAS_TRAIN_MANAGED", 0)) {    // a managed buffer, never used: no replay can reset managed memory
        void *managed = nullptr;
        CUDA(cudaMallocManaged(&managed, 256));
    }
    // BLAS_TRAIN_SPARE_HANDLES=N: N handles given the compute stream first and never used (the proxy's table
    // of handles' streams must hold the training handle whatever number came before it)
    std::vector<cublasHandle_t> spare(env_int("BLAS_TRAIN_SPARE_HANDLES", 0));
    for (cublasHandle_t &h : spare) {
        BLAS(cublasCreate(&h));
        BLAS(cublasSetStream(h, compute));
    }
    cublasHandle_t blas;
    BLAS(cublasCreate(&blas));
    BLAS(cublasSetStream(blas, compute));
    BLAS(cublasSetWorkspace(blas, d_workspace, 1 << 16));
    BLAS(cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH));

    // BLAS_TRAIN_COUNTER=1: a counter in device memory that every forward pass adds 1 to in place, through a
    // 1x1 GEMM (count = 1 * 1 + 1 * count), as PyTorch's BatchNorm adds to num_batches_tracked; in the checksum
    const int counter = env_int("BLAS_TRAIN_COUNTER", 0);
    float *d_count = nullptr;
    if (counter) {
        CUDA(cudaMalloc((void **)&d_count, sizeof(float)));
        CUDA(cudaMemcpy(d_count, &ident[0], sizeof(float), cudaMemcpyHostToDevice));  // 1.0: one start
    }
    const OptimizerPhase optimizer;
    StepTimer timer(rank);
    const float one = 1.0f, minus_one = -1.0f, inv_b = 1.0f / kBatch, zero = 0.0f;
    for (int step = 1; step <= steps; step++) {
        timer.before(step, compute);
        // this rank's batch: x in [-1, 1), y = a fixed linear map of x plus noise
        for (int b = 0; b < kBatch; b++) {
            const uint64_t sample = ((uint64_t)(step - 1) * world + rank) * kBatch + b;
            for (int i = 0; i < kIn; i++)
                batch[b * kIn + i] = uniform(sample * 131 + i);
            for (int o = 0; o < kOut; o++) {
                float t = 0.01f * uniform(sample * 131 + 100 + o);
                for (int i = 0; i < kIn; i++)
                    t += 0.05f * (float)((o + i) % 5 - 2) * batch[b * kIn + i];
                batch[kIn * kBatch + b * kOut + o] = t;
            }
        }
        CUDA(cudaMemcpyAsync(d_batch, batch.data(), batch.size() * sizeof(float), cudaMemcpyHostToDevice, compute));
        CUDA(cudaMemcpyAsync(d_err, d_y, kOut * kBatch * sizeof(float), cudaMemcpyDeviceToDevice, compute));
        if (lt)
            lt_forward(reinterpret_cast<cublasLtHandle_t>(blas), d_w, d_x, d_bias, d_err, d_workspace, 1 << 16,
                       compute);
        else
            BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kOut, kBatch, kIn, &one, d_w, kOut, d_x, kIn,
                             &minus_one, d_err, kOut));
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, kOut, kIn, kBatch, &inv_b, d_err, kOut, d_x, kIn, &zero,
                         d_g, kOut));
        if (counter)
            BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, d_ident, 1, d_ident, 1, &one, d_count, 1));
        on_nccl_stream(streams, [&](cudaStream_t s) {
            NCCL(ncclAllReduce(d_g, d_g, kOut * kIn, ncclFloat32, ncclSum, job.comm, s));
        });
        optimizer.begin();
        BLAS(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_DEVICE));
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kOut, kIn, kOut, d_scalars, d_ident, kOut, d_g, kOut,
                         d_scalars + 1, d_w, kOut));
        BLAS(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
        timer.after(step, compute);
        optimizer.end();  // minibatch `step` ends, step + 1 begins
        if (rank == 0 && step % 5 == 0)
            std::printf("[rank 0] step %d\n", step);
    }
    CUDA(cudaStreamSynchronize(compute));
    CUDA(cudaMemcpy(w.data(), d_w, w.size() * sizeof(float), cudaMemcpyDeviceToHost));
    if (counter) {  // the counter's bytes after the parameters'
        float count = 0;
        CUDA(cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost));
        w.push_back(count);
    }
    print_checksum(rank, fnv1a64(w.data(), w.size() * sizeof(float)));
    BLAS(cublasDestroy(blas));
    NCCL(ncclCommDestroy(job.comm));
    return 0;
}
