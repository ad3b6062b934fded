/* pinned.c -- pinned host memory shared with the device proxy (transparent
 * mode), for tests/test_proxy_pinned.py.  Plain C against the CUDA runtime
 * API (gcc, linked with -lcudart): no kernels, so it needs no host twins.
 *
 * Usage: pinned <copies N|pageable|early|show|fork>
 *   copies N  N rounds on two streams: fill a pinned source (double-buffered,
 *             reused once its copy's event completed), async H2D from it, a
 *             memset and a D2D copy, async D2H into a pinned destination,
 *             synchronise, fold it into a checksum; prints the checksum (the
 *             same directly and through the proxy)
 *   pageable  one async H2D copy of the same size from pageable memory:
 *             prints its result (through a proxy with a 1 MiB arena it is
 *             refused: the copies above never cross the arena)
 *   early     an async D2H copy queued behind a slow memset (run with
 *             JITCKPT_SIMDEV_FAULT=op=cudaMemsetAsync,kind=slow,...): into
 *             pinned memory the call returns before the copy (the byte at
 *             return is still the old one), into pageable memory after it;
 *             prints what it saw
 *   show      allocates pinned memory, prints its address, waits for a line on
 *             stdin, frees it, prints "freed", waits for another line
 *   fork      fills pinned memory, forks: the child writes into it and makes a
 *             CUDA call; the parent's bytes are unchanged and its copies from
 *             and to the pinned memory still work */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorName(e_)); exit(1); } } while (0)

#define SIZE (1536 * 1024 + 24)       /* more than a 1 MiB arena could carry */

static uint64_t fnv(const unsigned char *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static void copies(long n)
{
    unsigned char *src[2], *dst, *d, *d2;
    cudaStream_t s, s2;
    cudaEvent_t copied[2], ready;
    CHECK(cudaMalloc((void **)&d, SIZE));
    CHECK(cudaMalloc((void **)&d2, SIZE));
    CHECK(cudaMallocHost((void **)&src[0], SIZE));
    CHECK(cudaHostAlloc((void **)&src[1], SIZE, cudaHostAllocPortable));
    CHECK(cudaMallocHost((void **)&dst, SIZE));
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        CHECK(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming));
        CHECK(cudaEventRecord(copied[i], s));
    }
    CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    uint64_t h = 1469598103934665603ull;
    for (long r = 0; r < n; r++) {
        int slot = (int)(r % 2);
        CHECK(cudaEventSynchronize(copied[slot]));          /* its last copy is done: reuse it */
        for (size_t i = 0; i < SIZE; i++)
            src[slot][i] = (unsigned char)(i * 11 + (size_t)r * 29 + 3);
        CHECK(cudaMemcpyAsync(d, src[slot], SIZE, cudaMemcpyHostToDevice, s));
        CHECK(cudaEventRecord(copied[slot], s));
        CHECK(cudaMemsetAsync(d + (r % 97), (int)(r & 0xff), 1000, s));
        CHECK(cudaEventRecord(ready, s));
        CHECK(cudaStreamWaitEvent(s2, ready, 0));
        CHECK(cudaMemcpyAsync(d2, d, SIZE, cudaMemcpyDeviceToDevice, s2));
        CHECK(cudaMemcpyAsync(dst, d2, SIZE, cudaMemcpyDeviceToHost, s2));
        CHECK(cudaStreamSynchronize(s2));
        h = fnv(dst, SIZE, h);
    }
    /* and the synchronous copy into pinned memory */
    memset(dst, 0, SIZE);
    CHECK(cudaMemcpy(dst, d, SIZE, cudaMemcpyDeviceToHost));
    h = fnv(dst, SIZE, h);
    printf("copies %ld checksum %016llx\n", n, (unsigned long long)h);
    for (int i = 0; i < 2; i++)
        CHECK(cudaFreeHost(src[i]));
    CHECK(cudaFreeHost(dst));
    CHECK(cudaFree(d));
    CHECK(cudaFree(d2));
}

/* One D2H copy queued behind a slow memset: did the call return before the copy? */
static void early_one(const char *what, unsigned char *host, unsigned char *d, cudaStream_t s)
{
    memset(host, 0, 4096);
    CHECK(cudaMemsetAsync(d, 0x77, 4096, s));               /* slow (JITCKPT_SIMDEV_FAULT) */
    double t0 = now_ms();
    CHECK(cudaMemcpyAsync(host, d, 4096, cudaMemcpyDeviceToHost, s));
    double took = now_ms() - t0;
    unsigned char at_return = *(volatile unsigned char *)host;
    CHECK(cudaStreamSynchronize(s));
    printf("%s: returned %s the copy (byte at return 0x%02x, after synchronising 0x%02x)\n", what,
           at_return == 0 && took < 150 ? "before" : "after", at_return, host[0]);
    fprintf(stderr, "%s: cudaMemcpyAsync took %.1f ms\n", what, took);
}

static void early(void)
{
    unsigned char *pinned, *pageable = malloc(4096), *d;
    cudaStream_t s;
    CHECK(cudaMallocHost((void **)&pinned, 4096));
    CHECK(cudaMalloc((void **)&d, 4096));
    CHECK(cudaStreamCreate(&s));
    early_one("pinned", pinned, d, s);
    early_one("pageable", pageable, d, s);
    CHECK(cudaFreeHost(pinned));
    free(pageable);
}

static void wait_line(void)
{
    char line[64];
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        exit(2);
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    long n = argc > 2 ? atol(argv[2]) : 0;
    if (strcmp(cmd, "copies") == 0) {
        copies(n);
    } else if (strcmp(cmd, "pageable") == 0) {
        unsigned char *host = calloc(1, SIZE), *d;
        CHECK(cudaMalloc((void **)&d, SIZE));
        printf("pageable copy: %s\n", cudaGetErrorName(cudaMemcpyAsync(d, host, SIZE, cudaMemcpyHostToDevice, 0)));
    } else if (strcmp(cmd, "early") == 0) {
        early();
    } else if (strcmp(cmd, "show") == 0) {
        void *p, *d;
        CHECK(cudaMalloc(&d, 4096));
        CHECK(cudaMallocHost(&p, 3 * 4096 + 1));
        CHECK(cudaMemcpy(d, p, 4096, cudaMemcpyHostToDevice));
        printf("pinned %p\n", p);
        wait_line();
        CHECK(cudaFreeHost(p));
        printf("freed\n");
        wait_line();
    } else if (strcmp(cmd, "fork") == 0) {
        unsigned char *p, *back, *d;
        CHECK(cudaMallocHost((void **)&p, 4096));
        CHECK(cudaMallocHost((void **)&back, 4096));
        CHECK(cudaMalloc((void **)&d, 4096));
        memset(p, 1, 4096);
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            memset(p, 2, 4096);
            cudaError_t e = cudaMemcpy(d, p, 4096, cudaMemcpyHostToDevice);
            printf("child: cudaMemcpy %s\n", cudaGetErrorName(e));
            fflush(stdout);
            _exit(0);
        }
        int status;
        waitpid(child, &status, 0);
        printf("parent: byte after the child wrote %d\n", p[0]);
        CHECK(cudaMemcpyAsync(d, p, 4096, cudaMemcpyHostToDevice, 0));
        CHECK(cudaMemcpyAsync(back, d, 4096, cudaMemcpyDeviceToHost, 0));
        CHECK(cudaDeviceSynchronize());
        printf("parent: round trip %s\n", memcmp(p, back, 4096) == 0 ? "equal" : "DIFFERENT");
    } else {
        fprintf(stderr, "usage: pinned <copies N|pageable|early|show|fork>\n");
        return 2;
    }
    printf("OK %s\n", cmd);
    return 0;
}
