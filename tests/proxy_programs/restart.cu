// restart.cu -- device pointers and handles across a restart of the device
// proxy, for tests/test_proxy_restart.py (transparent mode, milestone 2b).
// Ordinary CUDA C++ (nvcc -cudart shared); the host twins below run the
// kernels on the CPU emulator (built a second time as a library for the proxy).
//
// Usage: restart <addresses|pointer_table|train|killed>
//   addresses      allocations, a stream (flags, priority), an event and a
//                  device variable; a driver-suspect restart; then the same
//                  addresses hold the same bytes and the handles still work
//   pointer_table  a table of device pointers kept in device memory, used by a
//                  kernel before and after a restart
//   train STEPS [RESTART_AT]   an iterative computation whose state lives in
//                  device memory; prints a checksum (restart before step RESTART_AT)
//   killed         prints READY, waits for a line on stdin (the test SIGKILLs
//                  the proxy meanwhile), then makes a CUDA call and prints RESULT
//
// The restart is the remote library's control call jitckpt_remote_restart_proxy(),
// found with dlsym; without the library (a direct run) it is skipped, so the
// direct run is the uninterrupted reference.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(expr)                                                                                   \
    do {                                                                                              \
        cudaError_t e_ = (expr);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorName(e_)); \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)
#define REQUIRE(c)                                                                                    \
    do {                                                                                              \
        if (!(c)) {                                                                                   \
            std::fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #c);          \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)

__device__ float dev_scale;

extern "C" __global__ void fill(float *p, int n, float v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = v + (float)i;
}
extern "C" void fill__host(dim3 grid, dim3 block, size_t, void **args)
{
    float *p = *(float **)args[0];
    int n = *(int *)args[1];
    float v = *(float *)args[2];
    for (int i = 0; i < (int)(grid.x * block.x) && i < n; i++)
        p[i] = v + (float)i;
}

// out[j] = sum over b of table[b][j]: the pointers come from device memory.
extern "C" __global__ void gather(float **table, int nbuf, int len, float *out)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < len) {
        float s = 0;
        for (int b = 0; b < nbuf; b++)
            s += table[b][j];
        out[j] = s;
    }
}
extern "C" void gather__host(dim3 grid, dim3 block, size_t, void **args)
{
    float **table = *(float ***)args[0];
    int nbuf = *(int *)args[1], len = *(int *)args[2];
    float *out = *(float **)args[3];
    for (int j = 0; j < (int)(grid.x * block.x) && j < len; j++) {
        float s = 0;
        for (int b = 0; b < nbuf; b++)
            s += table[b][j];
        out[j] = s;
    }
}

// One step of a made-up recurrence through the pointer table.
extern "C" __global__ void step(float **table, int nbuf, int len, float *acc, int t)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < len)
        for (int b = 0; b < nbuf; b++) {
            float x = table[b][j];
            x = x * 0.75f + acc[j] * 0.125f + (float)((b + t) % 7);
            table[b][j] = x;
            acc[j] = acc[j] * 0.5f + x * 0.25f;
        }
}
extern "C" void step__host(dim3 grid, dim3 block, size_t, void **args)
{
    float **table = *(float ***)args[0];
    int nbuf = *(int *)args[1], len = *(int *)args[2];
    float *acc = *(float **)args[3];
    int t = *(int *)args[4];
    for (int j = 0; j < (int)(grid.x * block.x) && j < len; j++)
        for (int b = 0; b < nbuf; b++) {
            float x = table[b][j];
            x = x * 0.75f + acc[j] * 0.125f + (float)((b + t) % 7);
            table[b][j] = x;
            acc[j] = acc[j] * 0.5f + x * 0.25f;
        }
}

static int restart_proxy()
{
    typedef int fn_t(void);
    fn_t *fn = (fn_t *)dlsym(RTLD_DEFAULT, "jitckpt_remote_restart_proxy");
    if (!fn) {
        std::printf("restart: skipped (not in transparent mode)\n");
        return 0;
    }
    int r = fn();
    std::printf("restart: %d\n", r);
    return r;
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static const int kBuf = 5, kLen = 1000;

struct Table {
    float *bufs[kBuf];
    float **d_table;
    float *d_out;
};

static Table make_table()
{
    Table t;
    for (int b = 0; b < kBuf; b++) {
        CHECK(cudaMalloc(&t.bufs[b], kLen * sizeof(float) + (size_t)b * 4096));   // different sizes
        fill<<<(kLen + 127) / 128, 128>>>(t.bufs[b], kLen, 10.0f * (float)b);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaMalloc(&t.d_table, sizeof t.bufs));
    CHECK(cudaMemcpy(t.d_table, t.bufs, sizeof t.bufs, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&t.d_out, kLen * sizeof(float)));
    CHECK(cudaMemset(t.d_out, 0, kLen * sizeof(float)));
    CHECK(cudaDeviceSynchronize());            // before work on a non-blocking stream uses them
    return t;
}

static uint64_t checksum(const float *d, size_t n)
{
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return fnv(h.data(), n * sizeof(float));
}

static int cmd_addresses()
{
    void *a, *b, *c;
    CHECK(cudaMalloc(&a, 1000));
    CHECK(cudaMalloc(&b, 3 << 20));
    CHECK(cudaMalloc(&c, 64));
    CHECK(cudaFree(c));                        // freed: not re-created
    CHECK(cudaMalloc(&c, 5000));
    std::vector<unsigned char> pa(1000), pb(3 << 20), pc(5000);
    for (size_t i = 0; i < pb.size(); i++)
        pb[i] = (unsigned char)(i * 7 + 1);
    for (size_t i = 0; i < pa.size(); i++)
        pa[i] = (unsigned char)(i * 3 + 2);
    for (size_t i = 0; i < pc.size(); i++)
        pc[i] = (unsigned char)(i * 5 + 3);
    CHECK(cudaMemcpy(a, pa.data(), pa.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, pb.data(), pb.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(c, pc.data(), pc.size(), cudaMemcpyHostToDevice));
    const int hi = -3;                         // a priority other than the default (0)
    cudaStream_t s;
    cudaEvent_t e;
    CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    float scale = 42.5f;
    CHECK(cudaMemcpyToSymbol(dev_scale, &scale, sizeof scale));
    std::printf("before a %p b %p c %p stream %p event %p\n", a, b, c, (void *)s, (void *)e);
    if (restart_proxy() != 0)
        return 1;
    std::printf("after a %p b %p c %p stream %p event %p\n", a, b, c, (void *)s, (void *)e);
    std::vector<unsigned char> qa(pa.size()), qb(pb.size()), qc(pc.size());
    CHECK(cudaMemcpy(qa.data(), a, qa.size(), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyAsync(qb.data(), b, qb.size(), cudaMemcpyDeviceToHost, s));
    CHECK(cudaMemcpy(qc.data(), c, qc.size(), cudaMemcpyDeviceToHost));
    std::printf("bytes %s\n", qa == pa && qb == pb && qc == pc ? "same" : "DIFFERENT");
    unsigned flags = 0;
    int prio = 0;
    CHECK(cudaStreamGetFlags(s, &flags));
    CHECK(cudaStreamGetPriority(s, &prio));
    std::printf("stream flags %u priority %s\n", flags, prio == hi ? "kept" : "LOST");
    CHECK(cudaEventRecord(e, s));
    CHECK(cudaEventSynchronize(e));
    float back = 0;
    CHECK(cudaMemcpyFromSymbol(&back, dev_scale, sizeof back));
    std::printf("device variable %g\n", (double)back);
    // A new allocation does not land on a re-created one.
    void *d;
    CHECK(cudaMalloc(&d, 4096));
    uintptr_t x = (uintptr_t)d;
    bool apart = (x + 4096 <= (uintptr_t)a || x >= (uintptr_t)a + 1000) &&
                 (x + 4096 <= (uintptr_t)b || x >= (uintptr_t)b + (3 << 20)) &&
                 (x + 4096 <= (uintptr_t)c || x >= (uintptr_t)c + 5000);
    std::printf("new allocation %s\n", apart ? "apart" : "OVERLAPS");
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaEventDestroy(e));
    std::printf("OK addresses\n");
    return 0;
}

static int cmd_pointer_table()
{
    Table t = make_table();
    gather<<<(kLen + 127) / 128, 128>>>(t.d_table, kBuf, kLen, t.d_out);
    CHECK(cudaGetLastError());
    uint64_t before = checksum(t.d_out, kLen);
    CHECK(cudaMemset(t.d_out, 0, kLen * sizeof(float)));
    if (restart_proxy() != 0)
        return 1;
    gather<<<(kLen + 127) / 128, 128>>>(t.d_table, kBuf, kLen, t.d_out);
    CHECK(cudaGetLastError());
    uint64_t after = checksum(t.d_out, kLen);
    std::printf("gather before %016" PRIx64 " after %016" PRIx64 "\n", before, after);
    std::printf("OK pointer_table\n");
    return 0;
}

static int cmd_train(int steps, int restart_at)
{
    Table t = make_table();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    for (int i = 1; i <= steps; i++) {
        if (i == restart_at && restart_proxy() != 0)
            return 1;
        step<<<(kLen + 127) / 128, 128, 0, s>>>(t.d_table, kBuf, kLen, t.d_out, i);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(done, s));
        CHECK(cudaEventSynchronize(done));
    }
    uint64_t h = checksum(t.d_out, kLen);
    for (int b = 0; b < kBuf; b++)
        h ^= checksum(t.bufs[b], kLen) * (uint64_t)(2 * b + 3);
    std::printf("pid %d train checksum %016" PRIx64 "\n", (int)getpid(), h);
    std::printf("OK train\n");
    return 0;
}

static int cmd_killed()
{
    Table t = make_table();
    gather<<<(kLen + 127) / 128, 128>>>(t.d_table, kBuf, kLen, t.d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::printf("READY\n");
    std::fflush(stdout);
    char line[64];
    if (!std::fgets(line, sizeof line, stdin))
        return 2;
    uint64_t h = checksum(t.d_out, kLen);      // the proxy is dead by now
    std::printf("RESULT %016" PRIx64 "\n", h);
    return 0;
}

int main(int argc, char **argv)
{
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!std::strcmp(cmd, "addresses"))
        return cmd_addresses();
    if (!std::strcmp(cmd, "pointer_table"))
        return cmd_pointer_table();
    if (!std::strcmp(cmd, "train") && argc > 2)
        return cmd_train(std::atoi(argv[2]), argc > 3 ? std::atoi(argv[3]) : 0);
    if (!std::strcmp(cmd, "killed"))
        return cmd_killed();
    std::fprintf(stderr, "usage: restart <addresses|pointer_table|train STEPS [RESTART_AT]|killed>\n");
    return 2;
}
