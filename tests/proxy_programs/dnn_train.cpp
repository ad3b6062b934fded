// dnn_train.cpp -- a data-parallel training program whose computations are cuDNN calls made as PyTorch makes
// them (tests/test_proxy_cudnn.py: transparent recovery of cuDNN calls, issue 19).
//
// A BatchNorm followed by a 3x3 convolution, on each rank's own batch of 2-channel 6x6 images:
//   h   = BN(x; gamma, beta)          cudnnBatchNormalizationForwardTraining (legacy API, tensor
//                                     descriptors created and destroyed around the call, as PyTorch does;
//                                     with DNN_TRAIN_RUNNING=1 the running mean and variance updated too,
//                                     and a batch counter of each rank's own, += rank + 1 by a cublasSgemm:
//                                     PyTorch's num_batches_tracked, made per rank to tell ranks' state apart;
//                                     checked at the end: exit 1 if it is not steps * (rank + 1))
//   ncclBroadcast(stats, root 0)      rank 0's running statistics everywhere (DDP broadcasts its buffers)
//   err = conv(h, W) - y              backend API: a convolution-forward plan (beta = -1 over a copy of y)
//   dW  = conv_bwd_filter(h, err) / B backend API, with the workspace the plan asks for
//   dh  = conv_bwd_data(err, W) / B   backend API
//   dgamma, dbeta                     cudnnBatchNormalizationBackward
//   ncclAllReduce(g, sum)             on a stream of its own, ordered with events
//   P  -= lr / world * g              one cublasSgemm (P = W, gamma, beta), between
//                                     jitckpt_phase_optimizer_begin/end when they exist
// The three execution plans are built in the first minibatch and kept (PyTorch's plan cache): the chain
// tensors -> convolution -> operation -> operation graph -> heuristics -> engine configs -> plan; every
// execution makes, finalizes and destroys its variant pack.  No kernel of its own: g++ against the
// CUDA runtime, NCCL, cuBLAS and cuDNN; the job, the streams, the inputs and the checksum as blas_train.cpp's
// (train_common.h).  Prints, as blas_train does,
//   [rank R] final parameters checksum <FNV-1a 64 of P and the running statistics>
// and exits 1 at any failed call.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <cstdio>
#include <vector>

#define TRAIN_PROGRAM "dnn_train"
#include "train_common.h"

#define BLAS(x) do { cublasStatus_t s_ = (x); check(s_ == CUBLAS_STATUS_SUCCESS, #x, __LINE__, "cuBLAS error"); } while (0)
#define DNN(x) do { cudnnStatus_t d_ = (x); check(d_ == CUDNN_STATUS_SUCCESS, #x, __LINE__, cudnnGetErrorString(d_)); } while (0)

namespace {

using namespace train;

constexpr int kB = 4, kC = 2, kK = 3, kH = 6, kW = 6, kR = 3;
constexpr int kX = kB * kC * kH * kW, kY = kB * kK * kH * kW, kFilter = kK * kC * kR * kR;
constexpr int kParams = kFilter + 2 * kC;  // W, gamma, beta

using Desc = cudnnBackendDescriptor_t;

Desc make(cudnnBackendDescriptorType_t type)
{
    Desc d = nullptr;
    DNN(cudnnBackendCreateDescriptor(type, &d));
    return d;
}

void set(Desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n, const void *v)
{
    DNN(cudnnBackendSetAttribute(d, name, type, n, v));
}

// A packed NCHW float tensor with a unique id.
Desc tensor(int64_t uid, int64_t n, int64_t c, int64_t h, int64_t w)
{
    Desc t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const cudnnDataType_t type = CUDNN_DATA_FLOAT;
    const int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, h * w, w, 1}, align = 4;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    DNN(cudnnBackendFinalize(t));
    return t;
}

enum Uid : int64_t { kUidX = 1, kUidW = 2, kUidY = 3 };

struct Plan {
    Desc plan = nullptr;
    int64_t workspace = 0;
    std::vector<Desc> parts;   // what the plan was made from and keeps alive (destroy_plan)
};

// The plan and everything it was made from, destroyed (as cudnn_frontend drops a plan it no longer wants).
void destroy_plan(Plan &p)
{
    DNN(cudnnBackendDestroyDescriptor(p.plan));
    for (auto it = p.parts.rbegin(); it != p.parts.rend(); ++it)
        DNN(cudnnBackendDestroyDescriptor(*it));
    p = Plan();
}

// One convolution (3x3, padding 1, stride 1) as an execution plan: x (B,C,H,W), w (K,C,R,R), y (B,K,H,W).
Plan conv_plan(cudnnHandle_t handle, cudnnBackendDescriptorType_t op_type, float alpha, float beta)
{
    Desc x = tensor(kUidX, kB, kC, kH, kW), w = tensor(kUidW, kK, kC, kR, kR), y = tensor(kUidY, kB, kK, kH, kW);
    Desc conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2, one[2] = {1, 1}, pad[2] = {1, 1};
    set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
    set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one);
    set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, one);
    set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    DNN(cudnnBackendFinalize(conv));

    Desc op = make(op_type);
    cudnnBackendAttributeName_t a_alpha, a_beta, a_conv, a_x, a_w, a_y;
    if (op_type == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR) {
        a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA;
        a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA;
        a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC;
        a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X;
        a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W;
        a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y;
    } else if (op_type == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR) {
        a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA;
        a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA;
        a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC;
        a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X;
        a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW;
        a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY;
    } else {
        a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA;
        a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA;
        a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC;
        a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX;
        a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W;
        a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY;
    }
    set(op, a_alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
    set(op, a_beta, CUDNN_TYPE_FLOAT, 1, &beta);
    set(op, a_conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    set(op, a_x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, a_w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    set(op, a_y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    DNN(cudnnBackendFinalize(op));

    Desc graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
    DNN(cudnnBackendFinalize(graph));

    Desc heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_INSTANT;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
    DNN(cudnnBackendFinalize(heur));
    int64_t n_cfgs = 0;
    DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n_cfgs,
                                 nullptr));
    check(n_cfgs >= 1, "the heuristics", __LINE__, "no engine configuration");
    std::vector<Desc> cfgs((size_t)n_cfgs);
    for (auto &c : cfgs)
        c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_cfgs, &got,
                                 cfgs.data()));
    check(got >= 1, "the heuristics' results", __LINE__, "none");

    Plan p;
    p.parts = {x, w, y, conv, op, graph, cfgs[0]};
    p.plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(p.plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(p.plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[0]);
    DNN(cudnnBackendFinalize(p.plan));
    DNN(cudnnBackendGetAttribute(p.plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                 &p.workspace));
    // what the plan keeps alive stays; the rest goes, as cudnn_frontend lets it
    for (size_t i = 1; i < cfgs.size(); i++)
        DNN(cudnnBackendDestroyDescriptor(cfgs[i]));
    DNN(cudnnBackendDestroyDescriptor(heur));
    return p;
}

// One execution, its variant pack made and destroyed around it (as PyTorch does).
void run(cudnnHandle_t handle, const Plan &p, void *x, void *w, void *y, void *workspace)
{
    Desc pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    const int64_t uids[3] = {kUidX, kUidW, kUidY};
    void *ptrs[3] = {x, w, y};
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    DNN(cudnnBackendFinalize(pack));
    DNN(cudnnBackendExecute(handle, p.plan, pack));
    DNN(cudnnBackendDestroyDescriptor(pack));
}

// A legacy 4-d tensor descriptor, packed NCHW float.
cudnnTensorDescriptor_t tensor4d(int n, int c, int h, int w)
{
    cudnnTensorDescriptor_t t;
    DNN(cudnnCreateTensorDescriptor(&t));
    DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
    return t;
}

}  // namespace

int main(int argc, char **argv)
{
    // DNN_TRAIN_RUNNING=1: BatchNorm keeps running statistics (updated in place in the forward pass)
    const int running = env_int("DNN_TRAIN_RUNNING", 0);
    // DNN_TRAIN_REBUILD=1: every minibatch builds its plans and destroys them after use (PyTorch's trial plans,
    // an evicted plan-cache entry), and makes one execution that fails, whose status it ignores (as
    // cudnn_frontend's plan timing does)
    const int rebuild = env_int("DNN_TRAIN_REBUILD", 0);
    // DNN_TRAIN_MOVE_COUNTER_AT=N: minibatch N starts by moving the batch counter to a new allocation and
    // freeing the old one (memory holding state changed in place is freed)
    const int move_counter_at = env_int("DNN_TRAIN_MOVE_COUNTER_AT", 0);
    const Options opt = parse_options(argc, argv);
    const int steps = opt.steps;
    const Job job = join(opt.rendezvous_dir);
    const int rank = job.rank, world = job.world;
    const Streams streams = make_streams();
    cudaStream_t compute = streams.compute;

    // P = W, gamma, beta (the same on every rank); the running statistics start at 0 and 1 (each rank updates
    // its own from its batch, then takes rank 0's)
    std::vector<float> params(kParams), stats(2 * kC), batch(kX + kY);
    for (int i = 0; i < kFilter; i++)
        params[i] = 0.2f * uniform(1000 + i);
    for (int c = 0; c < kC; c++) {
        params[kFilter + c] = 1.0f;
        params[kFilter + kC + c] = 0.0f;
        stats[c] = 0.0f;
        stats[kC + c] = 1.0f;
    }
    float *d_p, *d_g, *d_batch, *d_h, *d_err, *d_dh, *d_dx, *d_stats, *d_save, *d_one, *d_count;
    void *d_workspace;
    CUDA(cudaMalloc((void **)&d_p, kParams * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_g, kParams * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_batch, (kX + kY) * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_h, kX * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_err, kY * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_dh, kX * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_dx, kX * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_stats, 2 * kC * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_save, 2 * kC * sizeof(float)));
    CUDA(cudaMalloc((void **)&d_one, sizeof(float)));
    CUDA(cudaMalloc((void **)&d_count, sizeof(float)));
    CUDA(cudaMemset(d_count, 0, sizeof(float)));
    CUDA(cudaMemcpy(d_p, params.data(), kParams * sizeof(float), cudaMemcpyHostToDevice));
    CUDA(cudaMemcpy(d_stats, stats.data(), 2 * kC * sizeof(float), cudaMemcpyHostToDevice));
    const float rank_step = (float)(rank + 1);
    const float one = 1.0f, zero = 0.0f, inv_b = 1.0f / kB, step_size = -0.05f / (float)world;
    CUDA(cudaMemcpy(d_one, &one, sizeof one, cudaMemcpyHostToDevice));
    float *d_x = d_batch, *d_y = d_batch + kX, *d_w = d_p, *d_gamma = d_p + kFilter, *d_beta = d_gamma + kC;

    cublasHandle_t blas;
    BLAS(cublasCreate(&blas));
    BLAS(cublasSetStream(blas, compute));
    cudnnHandle_t dnn;
    DNN(cudnnCreate(&dnn));

    const OptimizerPhase optimizer;
    Plan forward, filter, data;
    for (int step = 1; step <= steps; step++) {
        // this rank's batch: x in [-1, 1), y = a fixed function of x plus noise
        for (int i = 0; i < kX; i++)
            batch[i] = uniform(((uint64_t)(step - 1) * world + rank) * 100003 + i) + 0.5f * (i % 3);
        for (int n = 0; n < kB; n++)
            for (int k = 0; k < kK; k++)
                for (int p = 0; p < kH * kW; p++) {
                    float t = 0.01f * uniform(((uint64_t)(step - 1) * world + rank) * 100003 + 50000 + p);
                    for (int c = 0; c < kC; c++)
                        t += 0.3f * (float)((k + c) % 3 - 1) * batch[(n * kC + c) * kH * kW + p];
                    batch[kX + (n * kK + k) * kH * kW + p] = t;
                }
        if (step == move_counter_at) {
            float *moved;
            CUDA(cudaMalloc((void **)&moved, sizeof(float)));
            CUDA(cudaMemcpy(moved, d_count, sizeof(float), cudaMemcpyDeviceToDevice));
            CUDA(cudaFree(d_count));
            d_count = moved;
        }
        DNN(cudnnSetStream(dnn, compute));  // (PyTorch sets the handle's stream before every call)
        if (forward.plan == nullptr) {     // the first minibatch builds the plans; they are kept
            forward = conv_plan(dnn, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, 1.0f, -1.0f);
            filter = conv_plan(dnn, CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, inv_b, 0.0f);
            data = conv_plan(dnn, CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, inv_b, 0.0f);
            if (step == 1) {
                int64_t most = forward.workspace > filter.workspace ? forward.workspace : filter.workspace;
                most = most > data.workspace ? most : data.workspace;
                CUDA(cudaMalloc(&d_workspace, (size_t)(most > 0 ? most : 1)));
            }
        }
        if (rebuild)                      // a failed execution the program ignores
            (void)cudnnBackendExecute(dnn, nullptr, nullptr);
        CUDA(cudaMemcpyAsync(d_batch, batch.data(), batch.size() * sizeof(float), cudaMemcpyHostToDevice, compute));

        cudnnTensorDescriptor_t xd = tensor4d(kB, kC, kH, kW), bnd;
        DNN(cudnnCreateTensorDescriptor(&bnd));
        DNN(cudnnDeriveBNTensorDescriptor(bnd, xd, CUDNN_BATCHNORM_SPATIAL));
        DNN(cudnnBatchNormalizationForwardTraining(dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, d_x, xd, d_h, bnd,
                                                   d_gamma, d_beta, running ? 0.1 : 0.0, running ? d_stats : nullptr,
                                                   running ? d_stats + kC : nullptr, 1e-5, d_save, d_save + kC));
        DNN(cudnnDestroyTensorDescriptor(bnd));
        DNN(cudnnDestroyTensorDescriptor(xd));
        if (running)  // count += (rank + 1) * 1 * 1: a counter updated in place by another library's call
            BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &rank_step, d_one, 1, d_one, 1, &one, d_count,
                             1));
        // every rank takes rank 0's running statistics (DDP broadcasts its buffers): the same on every rank
        on_nccl_stream(streams, [&](cudaStream_t s) {
            NCCL(ncclBroadcast(d_stats, d_stats, 2 * kC, ncclFloat32, 0, job.comm, s));
        });

        CUDA(cudaMemcpyAsync(d_err, d_y, kY * sizeof(float), cudaMemcpyDeviceToDevice, compute));
        run(dnn, forward, d_h, d_w, d_err, d_workspace);          // err = conv(h, W) - y
        run(dnn, filter, d_h, d_g, d_err, d_workspace);           // dW = conv_bwd_filter(h, err) / B
        run(dnn, data, d_dh, d_w, d_err, d_workspace);            // dh = conv_bwd_data(err, W) / B
        if (rebuild) {
            destroy_plan(forward);
            destroy_plan(filter);
            destroy_plan(data);
        }

        xd = tensor4d(kB, kC, kH, kW);
        DNN(cudnnCreateTensorDescriptor(&bnd));
        DNN(cudnnDeriveBNTensorDescriptor(bnd, xd, CUDNN_BATCHNORM_SPATIAL));
        DNN(cudnnBatchNormalizationBackward(dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd, d_x, xd, d_dh,
                                            xd, d_dx, bnd, d_gamma, d_g + kFilter, d_g + kFilter + kC, 1e-5, d_save,
                                            d_save + kC));
        DNN(cudnnDestroyTensorDescriptor(bnd));
        DNN(cudnnDestroyTensorDescriptor(xd));

        on_nccl_stream(streams, [&](cudaStream_t s) {
            NCCL(ncclAllReduce(d_g, d_g, kParams, ncclFloat32, ncclSum, job.comm, s));
        });
        optimizer.begin();
        BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kParams, 1, 1, &step_size, d_g, kParams, d_one, 1, &one,
                         d_p, kParams));
        optimizer.end();  // minibatch `step` ends, step + 1 begins
        if (rank == 0 && step % 5 == 0) {   // (flushed: a test kills a proxy when it sees step 10)
            std::printf("[rank 0] step %d done\n", step);
            std::fflush(stdout);
        }
    }
    CUDA(cudaStreamSynchronize(compute));
    CUDA(cudaMemcpy(params.data(), d_p, kParams * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA(cudaMemcpy(stats.data(), d_stats, 2 * kC * sizeof(float), cudaMemcpyDeviceToHost));
    float count = 0.0f;
    CUDA(cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost));
    if (running && count != (float)steps * rank_step)
        check(false, "the batch counter", __LINE__, "counted another number of batches than were run");
    const uint64_t sum = fnv1a64(stats.data(), stats.size() * sizeof(float),
                                 fnv1a64(params.data(), params.size() * sizeof(float)));
    print_checksum(rank, sum);
    DNN(cudnnDestroy(dnn));
    BLAS(cublasDestroy(blas));
    NCCL(ncclCommDestroy(job.comm));
    return 0;
}
