// capture.cu -- an all-reduce captured into a CUDA graph, the way PyTorch
// captures NCCL collectives (torch.cuda.graph with DDP): the NCCL stream
// forks from the capturing stream, all-reduces, records an event and the
// capturing stream waits for it.  Used by tests/test_interpose.py.
//
// During the capture the interposer sees an event recorded on an NCCL stream
// and waited for by another stream, the pattern it watches; but that event is
// a graph node, and a cudaEventQuery on it would invalidate the capture (on a
// GPU and on the emulator).  The program holds the capture open for a while,
// so that a watchdog that queried it would be caught: cudaStreamEndCapture
// then fails.  It then launches the graph LAUNCHES times and checks the
// results.
//
// Environment: RANK, WORLD_SIZE, JITCKPT_TEST_ID_FILE; WITHHOLD_LAUNCH=k makes
// rank 1 never issue its k-th launch (1-based), so that the other ranks'
// k-th launch never completes: the collective inside the graph hangs.
#include "common.h"

static const int N = 1024, LAUNCHES = 4;

int main()
{
    int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1);
    int withhold = env_int("WITHHOLD_LAUNCH", 0);
    CHECK(cudaSetDevice(0));
    ncclComm_t comm;
    NCHECK(ncclCommInitRank(&comm, world, exchange_id(rank), rank));
    cudaStream_t compute, nccl;
    CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&nccl, cudaStreamNonBlocking));
    float *grad, *host;
    CHECK(cudaMalloc(&grad, N * sizeof(float)));
    CHECK(cudaMallocHost(&host, N * sizeof(float)));
    std::vector<float> ones(N, 1.0f);
    CHECK(cudaMemcpy(grad, ones.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    // One eager step first: the NCCL stream is known and the watchdog runs.
    CHECK(cudaEventRecord(fork, compute));
    CHECK(cudaStreamWaitEvent(nccl, fork, 0));
    NCHECK(ncclAllReduce(grad, grad, N, ncclFloat, ncclSum, comm, nccl));
    CHECK(cudaEventRecord(join, nccl));
    CHECK(cudaStreamWaitEvent(compute, join, 0));
    CHECK(cudaStreamSynchronize(compute));

    // The same step, captured.
    CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(fork, compute));
    CHECK(cudaStreamWaitEvent(nccl, fork, 0));
    NCHECK(ncclAllReduce(grad, grad, N, ncclFloat, ncclSum, comm, nccl));
    CHECK(cudaEventRecord(join, nccl));
    CHECK(cudaStreamWaitEvent(compute, join, 0));
    CHECK(cudaMemcpyAsync(host, grad, N * sizeof(float), cudaMemcpyDeviceToHost, compute));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));   // many watchdog polls
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(compute, &graph));
    std::printf("rank %d: captured\n", rank);
    std::fflush(stdout);

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    float want = (float)world;                 // after the eager step
    for (int launch = 1; launch <= LAUNCHES; launch++) {
        if (rank == 1 && launch == withhold) {
            std::printf("rank %d: withholding launch %d\n", rank, launch);
            std::fflush(stdout);
            for (;;)
                std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        CHECK(cudaGraphLaunch(exec, compute));
        CHECK(cudaStreamSynchronize(compute));
        want *= (float)world;
        for (int i = 0; i < N; i++)
            REQUIRE(host[i] == want);
        std::printf("rank %d: launch %d ok\n", rank, launch);
        std::fflush(stdout);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    NCHECK(ncclCommDestroy(comm));
    std::printf("rank %d: RESULT %g\n", rank, (double)want);
    return 0;
}
