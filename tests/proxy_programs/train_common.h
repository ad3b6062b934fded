// train_common.h -- shared by the data-parallel training programs of the device proxy's library tests
// (blas_train.cpp for tests/test_proxy_cublas.py, dnn_train.cpp for tests/test_proxy_cudnn.py): the failure
// check, the seeded inputs and the checksum, joining the job (device, NCCL communicator through
// examples/cuda_mlp/rendezvous.cpp), the compute and NCCL streams and their ordering, and jitckpt's
// optimizer-phase hooks.
//
// Header-only (inline functions), C++17, g++ against the CUDA runtime and NCCL: no kernel, no nvcc.  A program
// defines TRAIN_PROGRAM (its name, for the failure messages) before including it; rendezvous.h comes from
// examples/cuda_mlp (-I) and this file from beside the program.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rendezvous.h"

#ifndef TRAIN_PROGRAM
#error "define TRAIN_PROGRAM (the program's name, for its failure messages) before including train_common.h"
#endif

namespace train {

// Exits 1 with "<program>: line <line>: <what> failed: <detail>" unless ok.
inline void check(bool ok, const char *what, int line, const char *detail)
{
    if (!ok) {
        std::fprintf(stderr, TRAIN_PROGRAM ": line %d: %s failed: %s\n", line, what, detail);
        std::exit(1);
    }
}

}  // namespace train

#define CUDA(x) do { cudaError_t e_ = (x); train::check(e_ == cudaSuccess, #x, __LINE__, cudaGetErrorName(e_)); } while (0)
#define NCCL(x) do { ncclResult_t r_ = (x); train::check(r_ == ncclSuccess, #x, __LINE__, ncclGetErrorString(r_)); } while (0)

namespace train {

// ---- inputs and the checksum ---------------------------------------------------------------------------------

// splitmix64's finalizer: a well-mixed 64-bit value for every key.
inline uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// In [-1, 1): the same value for the same key on every rank and in every run.
inline float uniform(uint64_t key)
{
    return (float)((double)(mix(key) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

// FNV-1a 64 of n bytes, continuing from h.
inline uint64_t fnv1a64(const void *p, size_t n, uint64_t h = 1469598103934665603ull)
{
    for (size_t i = 0; i < n; i++) {
        h ^= ((const unsigned char *)p)[i];
        h *= 1099511628211ull;
    }
    return h;
}

// The line the recovery tests compare (tests/test_proxy_recovery.py's CHECKSUM), as cuda_mlp prints it.
inline void print_checksum(int rank, uint64_t sum)
{
    std::printf("[rank %d] final parameters checksum %016" PRIx64 "\n", rank, sum);
}

// ---- the job -------------------------------------------------------------------------------------------------

// An environment variable as an int; dflt when it is not set.
inline int env_int(const char *name, int dflt)
{
    const char *s = std::getenv(name);
    return s ? std::atoi(s) : dflt;
}

// The options both programs take (any other pair is passed to `other`; one it does not know is ignored).
struct Options {
    int steps = 13;              // --steps N
    std::string rendezvous_dir;  // --rendezvous-dir DIR
};

template <class Other>
inline Options parse_options(int argc, char **argv, Other &&other)
{
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--steps"))
            o.steps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--rendezvous-dir"))
            o.rendezvous_dir = argv[i + 1];
        else
            other(argv[i], argv[i + 1]);
    }
    return o;
}

inline Options parse_options(int argc, char **argv)
{
    return parse_options(argc, argv, [](const char *, const char *) {});
}

// This process's place in the torchrun job and its NCCL communicator over every rank.
struct Job {
    int rank = 0, world = 1, local = 0;
    ncclComm_t comm = nullptr;
};

// Reads RANK, WORLD_SIZE and LOCAL_RANK, selects device LOCAL_RANK (modulo the devices there are), and creates
// the communicator: rank 0's ncclUniqueId reaches the others through a file in rendezvous_dir
// (examples/cuda_mlp/rendezvous.cpp; empty: over TCP).
inline Job join(const std::string &rendezvous_dir)
{
    Job job;
    job.rank = env_int("RANK", 0);
    job.world = env_int("WORLD_SIZE", 1);
    job.local = env_int("LOCAL_RANK", 0);
    int ndev = 0;
    CUDA(cudaGetDeviceCount(&ndev));
    CUDA(cudaSetDevice(job.local % ndev));

    RendezvousConfig rc;
    rc.rank = job.rank;
    rc.world = job.world;
    rc.dir = rendezvous_dir;
    rc.job_key = job_key_from_env(job.world, &rc.job_desc);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (job.rank == 0)
        NCCL(ncclGetUniqueId(&id));
    try {
        share_unique_id(rc, &id);
    } catch (const RendezvousError &e) {
        check(false, "the NCCL id rendezvous", __LINE__, e.what());
    }
    NCCL(ncclCommInitRank(&job.comm, job.world, id, job.rank));
    rendezvous_cleanup(rc);
    return job;
}

// The compute stream, a stream of NCCL's own, and the events that order them.
struct Streams {
    cudaStream_t compute = nullptr, nccl = nullptr;
    cudaEvent_t ready = nullptr, done = nullptr;
    std::vector<cudaEvent_t> spare;  // TRAIN_SPARE_EVENTS=N: recorded after each collective, never waited on
    // TRAIN_OTHER_DEVICE_STREAM=1: a stream of the next device, as a program that touches a second GPU has; this
    // device's events cannot be recorded on it (cudaErrorInvalidResourceHandle)
    cudaStream_t other_device = nullptr;
};

inline Streams make_streams()
{
    Streams s;
    CUDA(cudaStreamCreate(&s.compute));
    CUDA(cudaStreamCreate(&s.nccl));
    CUDA(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
    CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    s.spare.resize(env_int("TRAIN_SPARE_EVENTS", 0));
    for (cudaEvent_t &e : s.spare)
        CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (env_int("TRAIN_OTHER_DEVICE_STREAM", 0)) {
        int device = 0, n = 0;
        CUDA(cudaGetDevice(&device));
        CUDA(cudaGetDeviceCount(&n));
        check(n > 1, "TRAIN_OTHER_DEVICE_STREAM", __LINE__, "needs a second device");
        CUDA(cudaSetDevice((device + 1) % n));
        CUDA(cudaStreamCreate(&s.other_device));
        CUDA(cudaSetDevice(device));
    }
    return s;
}

// Runs collective(nccl stream) after the work queued on the compute stream, and the compute stream's later
// work after it (as DDP orders its all-reduce).
template <class Collective>
inline void on_nccl_stream(const Streams &s, Collective &&collective)
{
    if (s.other_device)  // as PyTorch checks after every kernel launch: nothing the proxy did is the program's error
        CUDA(cudaGetLastError());
    CUDA(cudaEventRecord(s.ready, s.compute));
    CUDA(cudaStreamWaitEvent(s.nccl, s.ready, 0));
    collective(s.nccl);
    CUDA(cudaEventRecord(s.done, s.nccl));
    for (cudaEvent_t e : s.spare)  // (the proxy must still know, after all of them, what s.done waits for)
        CUDA(cudaEventRecord(e, s.nccl));
    CUDA(cudaStreamWaitEvent(s.compute, s.done, 0));
}

// jitckpt's optimizer-phase hooks (jitckpt_phase_optimizer_begin/end), where the program runs under jitckpt.
struct OptimizerPhase {
    using Fn = void (*)();
    Fn begin_fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "jitckpt_phase_optimizer_begin"));
    Fn end_fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "jitckpt_phase_optimizer_end"));

    void begin() const
    {
        if (begin_fn)
            begin_fn();
    }
    void end() const  // minibatch `step` ends, step + 1 begins
    {
        if (end_fn)
            end_fn();
    }
};

// TRAIN_TIME_STEP=R:N: rank R times step N with a pair of CUDA events that it creates and destroys in that step,
// as a script that measures one step on rank 0 does.  A minibatch that creates events cannot be replayed on that
// rank alone (tests/test_proxy_recovery.py: replay validation is agreed by every rank).
struct StepTimer {
    int rank = -1, step = -1;
    cudaEvent_t started = nullptr;

    StepTimer(int this_rank)
    {
        const char *s = std::getenv("TRAIN_TIME_STEP");
        if (s && std::sscanf(s, "%d:%d", &rank, &step) == 2 && rank != this_rank)
            rank = step = -1;
    }
    void before(int now, cudaStream_t stream)  // before the step's work
    {
        if (now != step)
            return;
        CUDA(cudaEventCreate(&started));
        CUDA(cudaEventRecord(started, stream));
    }
    void after(int now, cudaStream_t stream)   // after it
    {
        if (now != step)
            return;
        cudaEvent_t stopped = nullptr;
        CUDA(cudaEventCreate(&stopped));
        CUDA(cudaEventRecord(stopped, stream));
        CUDA(cudaEventSynchronize(stopped));
        float ms = 0;
        CUDA(cudaEventElapsedTime(&ms, started, stopped));
        std::printf("[rank %d] step %d took %.3f ms on the device\n", rank, step, ms);
        CUDA(cudaEventDestroy(started));
        CUDA(cudaEventDestroy(stopped));
    }
};

}  // namespace train
