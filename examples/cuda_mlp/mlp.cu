// mlp.cu -- a data-parallel training program in CUDA C++ with NCCL.
//
// Every rank trains the same 2-layer MLP (32 -> 64 -> 1, softsign, MSE,
// Adam) on its own slice of a deterministic data stream; gradients are
// summed with ncclAllReduce.  Ranks come from torchrun's environment:
//
//     torchrun --standalone --no-python --nproc_per_node 4 build/mlp --steps 200
//
// The step follows the pattern of the JIT checkpointing paper's Figure 3:
//
//   compute stream: H2D copy, forward, backward --record(grads_ready)-->
//                   wait(allreduce_done) --> Adam
//   NCCL stream:    wait(grads_ready) --> ncclAllReduce --record(allreduce_done)
//
// so the optimizer never reads a gradient before its all-reduce finished,
// and a watchdog can tell a hung collective by polling allreduce_done.
//
// The kernels call the per-thread functions of mlp_math.h; mlp_twins.cpp
// runs the same functions as host twins on the jitckpt CPU emulator.  See
// README.md for flags, output and what is verified where.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mlp_math.h"
#include "rendezvous.h"

// ---- kernels: one thread per output element -----------------------------

#include "mlp_kernels.cuh"

// ---- errors ----------------------------------------------------------------

static int g_rank = 0;
static ncclComm_t g_comm = nullptr;

[[noreturn]] static void die(const char *f, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] static void die(const char *f, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    std::fprintf(stderr, "mlp[rank %d]: error: %s\n", g_rank, buf);
    std::fflush(stdout);
    std::exit(1);
}

#define CUDA_CHECK(expr)                                                                                 \
    do {                                                                                                 \
        cudaError_t e_ = (expr);                                                                         \
        if (e_ != cudaSuccess)                                                                           \
            die("%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, #expr, cudaGetErrorName(e_),            \
                cudaGetErrorString(e_));                                                                 \
    } while (0)

#define NCCL_CHECK(expr)                                                                                 \
    do {                                                                                                 \
        ncclResult_t r_ = (expr);                                                                        \
        if (r_ != ncclSuccess && r_ != ncclInProgress)                                                   \
            die("%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, #expr, ncclGetErrorString(r_),          \
                ncclGetLastError(g_comm));                                                               \
    } while (0)

// A kernel launch reports configuration errors (and, on the emulator, a
// missing twin) through cudaGetLastError.
#define LAUNCH(kernel, n, stream, ...)                                                                   \
    do {                                                                                                 \
        kernel<<<((n) + kBlock - 1) / kBlock, kBlock, 0, (stream)>>>(__VA_ARGS__);                        \
        cudaError_t e_ = cudaGetLastError();                                                             \
        if (e_ != cudaSuccess)                                                                           \
            die("%s:%d: launch of %s failed: %s (%s)", __FILE__, __LINE__, #kernel, cudaGetErrorName(e_), \
                cudaGetErrorString(e_));                                                                 \
    } while (0)

constexpr int kBlock = 128;

// ---- options ---------------------------------------------------------------

struct Options {
    int steps = 200;
    uint64_t seed = 1;
    int batch = 32;           // samples per rank per step
    float lr = 0.01f;
    int log_every = 10;
    std::string out;
    bool legacy_stream = false;
    std::string rendezvous_dir;
    int rendezvous_port = 0;  // 0: MASTER_PORT + 1
    double rendezvous_timeout = 300;
    double stall_report = 60;
};

static const char kUsage[] =
    "usage: mlp [options]   (ranks from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)\n"
    "  --steps N               optimizer steps (default 200)\n"
    "  --seed S                seed of the initial parameters and the data (default 1)\n"
    "  --batch B               samples per rank per step (default 32)\n"
    "  --lr LR                 Adam learning rate (default 0.01)\n"
    "  --log-every K           rank 0 prints the loss at step 1, every K steps and at the end (0: never)\n"
    "  --out FILE              rank 0 writes the final parameters there, raw float32 (layout: README.md)\n"
    "  --compute-stream KIND   'created' (default): a stream of its own; 'legacy': the legacy default\n"
    "                          stream 0, as PyTorch computes\n"
    "  --rendezvous-dir DIR    share the NCCL id through a file in DIR instead of TCP\n"
    "  --rendezvous-port P     TCP port of rank 0's id server (default MASTER_PORT + 1)\n"
    "  --rendezvous-timeout S  seconds to wait for the id exchange (default 300)\n"
    "  --stall-report S        report a host wait longer than S seconds, naming the all-reduce it is\n"
    "                          stuck behind; keeps waiting (default 60, 0: off)\n";

static double parse_number(const char *flag, const char *value, double lo, double hi)
{
    char *end = nullptr;
    errno = 0;
    double v = std::strtod(value, &end);
    if (errno || end == value || *end || !(v >= lo && v <= hi))
        die("bad value '%s' for %s (expected a number in [%g, %g])\n%s", value, flag, lo, hi, kUsage);
    return v;
}

static Options parse_options(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        }
        if (a.rfind("--", 0) != 0)
            die("unexpected argument '%s'\n%s", argv[i], kUsage);
        std::string value;
        const size_t eq = a.find('=');
        if (eq != std::string::npos) {          // --flag=value
            value = a.substr(eq + 1);
            a = a.substr(0, eq);
        } else if (i + 1 < argc) {              // --flag value
            value = argv[++i];
        } else {
            die("%s needs a value\n%s", a.c_str(), kUsage);
        }
        const char *v = value.c_str();
        if (a == "--steps")
            o.steps = (int)parse_number("--steps", v, 0, 1e9);
        else if (a == "--seed")
            o.seed = (uint64_t)parse_number("--seed", v, 0, 9e15);
        else if (a == "--batch")
            o.batch = (int)parse_number("--batch", v, 1, 1 << 20);
        else if (a == "--lr")
            o.lr = (float)parse_number("--lr", v, 0, 1e3);
        else if (a == "--log-every")
            o.log_every = (int)parse_number("--log-every", v, 0, 1e9);
        else if (a == "--out")
            o.out = value;
        else if (a == "--compute-stream") {
            if (value != "created" && value != "legacy")
                die("--compute-stream must be 'created' or 'legacy', not '%s'", v);
            o.legacy_stream = value == "legacy";
        } else if (a == "--rendezvous-dir")
            o.rendezvous_dir = value;
        else if (a == "--rendezvous-port")
            o.rendezvous_port = (int)parse_number("--rendezvous-port", v, 1, 65535);
        else if (a == "--rendezvous-timeout")
            o.rendezvous_timeout = parse_number("--rendezvous-timeout", v, 0.1, 1e7);
        else if (a == "--stall-report")
            o.stall_report = parse_number("--stall-report", v, 0, 1e7);
        else
            die("unknown option '%s'\n%s", a.c_str(), kUsage);
    }
    if (o.steps > 0 && (uint64_t)o.batch * (uint64_t)o.steps > (1ULL << 40))
        die("--steps x --batch is too large");
    return o;
}

static int env_int(const char *name, int dflt, int lo, int hi)
{
    const char *s = std::getenv(name);
    if (!s || !*s)
        return dflt;
    char *end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (*end || v < lo || v > hi)
        die("environment variable %s='%s' is not an integer in [%d, %d]", name, s, lo, hi);
    return (int)v;
}

// ---- helpers ---------------------------------------------------------------

static double now_s()
{
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

static uint64_t fnv1a64(const void *data, size_t n)
{
    const unsigned char *p = static_cast<const unsigned char *>(data);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

// The all-reduces in flight: the host runs at most three steps ahead of the
// last finished all-reduce (it waits for the input copy of step s-2 before
// it reuses that staging buffer), so a ring of four events names each one.
constexpr int kRing = 4;
struct InFlight {
    cudaEvent_t done[kRing];
    int step[kRing] = {0, 0, 0, 0};
};

// Waits for `ev` by polling, so that the host can notice an asynchronous
// NCCL error (a dead peer) and report a stall.  A stall is only reported: the
// program keeps waiting, as a training job blocked in a collective does.
static void wait_event(cudaEvent_t ev, const char *what, int step, const InFlight &fl, double stall_report)
{
    const double start = now_s();
    double next_check = start + 0.1;
    bool reported = false;
    int spins = 0;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            die("waiting for %s of step %d: cudaEventQuery failed: %s (%s)", what, step, cudaGetErrorName(e),
                cudaGetErrorString(e));
        const double t = now_s();
        if (t >= next_check) {
            next_check = t + 0.1;
            ncclResult_t async = ncclSuccess;
            NCCL_CHECK(ncclCommGetAsyncError(g_comm, &async));
            if (async != ncclSuccess && async != ncclInProgress) {
                std::fprintf(stderr, "mlp[rank %d]: error: NCCL reports %s (%s) while step %d waits for %s; "
                                     "aborting the communicator\n",
                             g_rank, ncclGetErrorString(async), ncclGetLastError(g_comm), step, what);
                ncclCommAbort(g_comm);
                std::exit(1);
            }
            if (stall_report > 0 && !reported && t - start >= stall_report) {
                reported = true;
                int oldest = 0;
                for (int i = 0; i < kRing; i++)
                    if (fl.step[i] > 0 && cudaEventQuery(fl.done[i]) == cudaErrorNotReady &&
                        (oldest == 0 || fl.step[i] < oldest))
                        oldest = fl.step[i];
                if (oldest)
                    std::fprintf(stderr, "mlp[rank %d]: stalled %.1f s waiting for %s of step %d: the all-reduce "
                                         "of step %d has not completed (still waiting)\n",
                                 g_rank, t - start, what, step, oldest);
                else
                    std::fprintf(stderr, "mlp[rank %d]: stalled %.1f s waiting for %s of step %d (still "
                                         "waiting)\n",
                                 g_rank, t - start, what, step);
            }
        }
        // Back off from a busy poll to 1 ms sleeps.
        if (++spins > 100)
            std::this_thread::sleep_for(std::chrono::microseconds(spins > 1000 ? 1000 : 50));
    }
}

static void write_params(const std::string &path, const std::vector<float> &params)
{
    const std::string tmp = path + ".tmp";
    FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f)
        die("cannot write --out %s: %s", tmp.c_str(), std::strerror(errno));
    const bool ok = std::fwrite(params.data(), sizeof(float), params.size(), f) == params.size();
    if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0)
        die("cannot write --out %s: %s", path.c_str(), std::strerror(errno));
}

// ---- main ------------------------------------------------------------------

int main(int argc, char **argv)
{
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    g_rank = env_int("RANK", 0, 0, 1 << 20);
    const Options opt = parse_options(argc, argv);
    const int world = env_int("WORLD_SIZE", 1, 1, 1 << 20);
    const int local_rank = env_int("LOCAL_RANK", 0, 0, 1 << 20);
    const int rank = g_rank;
    if (rank >= world)
        die("RANK=%d is not below WORLD_SIZE=%d", rank, world);

    // ---- device, streams, events
    int ndev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ndev));
    const int device = local_rank % ndev;
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));

    cudaStream_t compute = nullptr, comm_stream = nullptr;
    if (!opt.legacy_stream)
        CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    cudaEvent_t grads_ready, copied[2], loss_ready, finished;
    InFlight fl;
    CUDA_CHECK(cudaEventCreateWithFlags(&grads_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&loss_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&finished, cudaEventDisableTiming));
    for (auto &e : copied)
        CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (auto &e : fl.done)
        CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    // ---- NCCL communicator: rank 0's id reaches the others (rendezvous.cpp)
    RendezvousConfig rc;
    rc.rank = rank;
    rc.world = world;
    rc.dir = opt.rendezvous_dir;
    rc.timeout_s = opt.rendezvous_timeout;
    rc.job_key = job_key_from_env(world, &rc.job_desc);
    if (world > 1 && rc.dir.empty()) {
        const char *addr = std::getenv("MASTER_ADDR");
        if (!addr || !*addr)
            die("WORLD_SIZE=%d but MASTER_ADDR is not set: start the ranks with torchrun, set MASTER_ADDR and "
                "MASTER_PORT, or pass --rendezvous-dir DIR",
                world);
        rc.master_addr = addr;
        rc.port = opt.rendezvous_port ? opt.rendezvous_port : env_int("MASTER_PORT", -1, 0, 65534) + 1;
        if (rc.port <= 0)
            die("MASTER_PORT is not set: set it, or pass --rendezvous-port PORT or --rendezvous-dir DIR");
    }
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank == 0)
        NCCL_CHECK(ncclGetUniqueId(&id));
    try {
        share_unique_id(rc, &id);
    } catch (const RendezvousError &e) {
        die("%s", e.what());
    }
    NCCL_CHECK(ncclCommInitRank(&g_comm, world, id, rank));
    rendezvous_cleanup(rc);

    if (rank == 0)
        std::printf("mlp: %d ranks, %d samples per rank per step, %d steps, seed %" PRIu64 ", lr %g, %s compute "
                    "stream, device %d of %d (%s)\n",
                    world, opt.batch, opt.steps, opt.seed, (double)opt.lr, opt.legacy_stream ? "legacy" : "created",
                    device, ndev, prop.name);

    // ---- memory
    const int B = opt.batch;
    const int batch_floats = B * mlp::kIn + B;  // x then y
    float *d_params, *d_grad, *d_m, *d_v, *d_batch, *d_act, *d_err, *d_delta;
    CUDA_CHECK(cudaMalloc(&d_params, mlp::kParams * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_grad, mlp::kGradLen * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_m, mlp::kParams * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_v, mlp::kParams * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_batch, (size_t)batch_floats * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_act, (size_t)B * mlp::kHidden * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_err, (size_t)B * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_delta, (size_t)B * mlp::kHidden * sizeof(float)));
    const float *d_x = d_batch, *d_y = d_batch + B * mlp::kIn;
    float *h_staging[2], *h_loss;  // pinned, so the copies are truly asynchronous
    for (auto &h : h_staging)
        CUDA_CHECK(cudaMallocHost(&h, (size_t)batch_floats * sizeof(float)));
    CUDA_CHECK(cudaMallocHost(&h_loss, sizeof(float)));

    // ---- initial state: every rank builds it, rank 0's copy is broadcast (as DDP does)
    {
        std::vector<float> init(mlp::kParams);
        mlp::init_params(opt.seed, init.data());
        CUDA_CHECK(cudaMemcpy(d_params, init.data(), init.size() * sizeof(float), cudaMemcpyHostToDevice));
        NCCL_CHECK(ncclBroadcast(d_params, d_params, mlp::kParams, ncclFloat32, 0, g_comm, comm_stream));
        cudaEvent_t bcast;
        CUDA_CHECK(cudaEventCreateWithFlags(&bcast, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(bcast, comm_stream));
        CUDA_CHECK(cudaStreamWaitEvent(compute, bcast, 0));
        CUDA_CHECK(cudaEventDestroy(bcast));
    }
    CUDA_CHECK(cudaMemsetAsync(d_m, 0, mlp::kParams * sizeof(float), compute));
    CUDA_CHECK(cudaMemsetAsync(d_v, 0, mlp::kParams * sizeof(float), compute));
    for (auto &e : copied)
        CUDA_CHECK(cudaEventRecord(e, compute));

    // ---- training
    const float inv_n = 1.0f / (float)((double)B * world);
    const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    const double t0 = now_s();
    float first_loss = NAN, last_loss = NAN;
    // Minibatch boundaries for jitckpt's transparent mode (its call log): looked up at run time, so
    // the program links and runs without jitckpt too (then both are null and nothing is called).
    using PhaseFn = void (*)();
    const auto optimizer_begin = reinterpret_cast<PhaseFn>(dlsym(RTLD_DEFAULT, "jitckpt_phase_optimizer_begin"));
    const auto optimizer_end = reinterpret_cast<PhaseFn>(dlsym(RTLD_DEFAULT, "jitckpt_phase_optimizer_end"));
    for (int step = 1; step <= opt.steps; step++) {
        const int slot = step % 2;
        // The staging buffer of step-2 is free once its copy is done.
        wait_event(copied[slot], "the input copy", step, fl, opt.stall_report);
        float *h = h_staging[slot];
        const uint64_t first = ((uint64_t)(step - 1) * world + rank) * B;
        for (int b = 0; b < B; b++)
            mlp::sample(opt.seed, first + b, h + b * mlp::kIn, h + B * mlp::kIn + b);
        CUDA_CHECK(cudaMemcpyAsync(d_batch, h, (size_t)batch_floats * sizeof(float), cudaMemcpyHostToDevice,
                                   compute));
        CUDA_CHECK(cudaEventRecord(copied[slot], compute));

        LAUNCH(mlp_forward_hidden, B * mlp::kHidden, compute, B, d_params, d_x, d_act);
        LAUNCH(mlp_forward_output, B, compute, B, d_params, d_act, d_y, d_err);
        LAUNCH(mlp_backward_output, mlp::kHidden + 1, compute, B, inv_n, d_act, d_err, d_grad);
        LAUNCH(mlp_backward_delta, B * mlp::kHidden, compute, B, inv_n, d_params, d_act, d_err, d_delta);
        LAUNCH(mlp_backward_hidden, mlp::kHidden * (mlp::kIn + 1), compute, B, d_x, d_delta, d_grad);

        // Figure 3: the NCCL stream waits for the gradients, the optimizer for the all-reduce.
        cudaEvent_t done = fl.done[step % kRing];
        CUDA_CHECK(cudaEventRecord(grads_ready, compute));
        CUDA_CHECK(cudaStreamWaitEvent(comm_stream, grads_ready, 0));
        NCCL_CHECK(ncclAllReduce(d_grad, d_grad, mlp::kGradLen, ncclFloat32, ncclSum, g_comm, comm_stream));
        CUDA_CHECK(cudaEventRecord(done, comm_stream));
        fl.step[step % kRing] = step;
        CUDA_CHECK(cudaStreamWaitEvent(compute, done, 0));

        const bool log = opt.log_every > 0 && (step == 1 || step % opt.log_every == 0 || step == opt.steps);
        if (log || step == 1 || step == opt.steps) {
            CUDA_CHECK(cudaMemcpyAsync(h_loss, d_grad + mlp::kLossSlot, sizeof(float), cudaMemcpyDeviceToHost,
                                       compute));
            CUDA_CHECK(cudaEventRecord(loss_ready, compute));
        }

        const double bias1 = 1.0 - std::pow((double)beta1, step), bias2 = 1.0 - std::pow((double)beta2, step);
        if (optimizer_begin)
            optimizer_begin();
        LAUNCH(mlp_adam, mlp::kParams, compute, mlp::kParams, opt.lr, beta1, beta2, eps, (float)bias1, (float)bias2,
               d_params, d_grad, d_m, d_v);
        if (optimizer_end)
            optimizer_end();  // minibatch `step` ends, step+1 begins

        if (log || step == 1 || step == opt.steps) {
            wait_event(loss_ready, "the loss", step, fl, opt.stall_report);
            last_loss = *h_loss;
            if (step == 1)
                first_loss = last_loss;
            if (log && rank == 0)
                std::printf("[rank 0] step %d loss %.8g\n", step, (double)last_loss);
        }
    }

    // ---- result
    CUDA_CHECK(cudaEventRecord(finished, compute));
    wait_event(finished, "the last step", opt.steps, fl, opt.stall_report);
    std::vector<float> params(mlp::kParams);
    CUDA_CHECK(cudaMemcpy(params.data(), d_params, params.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const uint64_t sum = fnv1a64(params.data(), params.size() * sizeof(float));
    for (float p : params)
        if (!std::isfinite(p))
            die("the final parameters are not finite (lr %g too large?)", (double)opt.lr);
    if (rank == 0 && !opt.out.empty())
        write_params(opt.out, params);
    if (rank == 0)
        std::printf("mlp: %d steps in %.2f s, loss %.6g -> %.6g\n", opt.steps, now_s() - t0, (double)first_loss,
                    (double)last_loss);
    std::printf("[rank %d] final parameters checksum %016" PRIx64 "\n", rank, sum);

    // ---- teardown: every queued operation has finished, so destroy does not wait
    NCCL_CHECK(ncclCommDestroy(g_comm));
    g_comm = nullptr;
    for (auto &h : h_staging)
        CUDA_CHECK(cudaFreeHost(h));
    CUDA_CHECK(cudaFreeHost(h_loss));
    for (float *d : {d_params, d_grad, d_m, d_v, d_batch, d_act, d_err, d_delta})
        CUDA_CHECK(cudaFree(d));
    for (auto &e : copied)
        CUDA_CHECK(cudaEventDestroy(e));
    for (auto &e : fl.done)
        CUDA_CHECK(cudaEventDestroy(e));
    for (cudaEvent_t e : {grads_ready, loss_ready, finished})
        CUDA_CHECK(cudaEventDestroy(e));
    if (compute)
        CUDA_CHECK(cudaStreamDestroy(compute));
    CUDA_CHECK(cudaStreamDestroy(comm_stream));
    return 0;
}
