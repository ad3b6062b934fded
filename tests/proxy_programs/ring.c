/* ring.c -- the request ring of transparent mode (milestone 2a), for
 * tests/test_proxy_ring.py.  Plain C against the CUDA runtime API (gcc,
 * linked with -lcudart): no kernels, so it needs no host twins.
 *
 * Usage: ring <async_error|burst COUNT|threads N|until_gone|fork>
 *   async_error  an asynchronous call that fails (cudaMemsetAsync on a host
 *                pointer), then two synchronous calls: prints each result
 *   burst COUNT  COUNT rounds of asynchronous work on two streams ordered by
 *                events (H2D copies from one pageable buffer rewritten after
 *                every call, memsets, D2D copies), then a checksum of the
 *                device buffers: the same directly and through the proxy,
 *                whatever the ring's and the arena's sizes
 *   threads N    N threads, each with its own stream, buffer and pageable
 *                source, doing the same; prints one checksum per thread
 *   until_gone   asynchronous and synchronous calls in a loop until one
 *                fails (the proxy was killed): prints that error
 *   fork         forks after a burst of asynchronous calls; the child makes a
 *                CUDA call and prints its result, the parent goes on */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorName(e_)); exit(1); } } while (0)

#define CHUNK (48 * 1024 + 8)          /* not a power of two: the arena's wrap falls mid-way */
#define SLOTS 37

static uint64_t fnv(const unsigned char *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void fill(unsigned char *p, size_t n, long round)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 7 + (size_t)round * 13 + 1);
}

/* One worker's rounds on its own streams; returns the checksum of its buffers. */
static uint64_t rounds(long count, int seed)
{
    unsigned char *d, *d2, *host = malloc(CHUNK), *back = malloc((size_t)CHUNK * SLOTS);
    cudaStream_t s, s2;
    cudaEvent_t e;
    CHECK(cudaMalloc((void **)&d, (size_t)CHUNK * SLOTS));
    CHECK(cudaMalloc((void **)&d2, (size_t)CHUNK * SLOTS));
    CHECK(cudaMemset(d, 0, (size_t)CHUNK * SLOTS));
    CHECK(cudaMemset(d2, 0, (size_t)CHUNK * SLOTS));
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (long i = 0; i < count; i++) {
        size_t slot = (size_t)((i * 5 + seed) % SLOTS) * CHUNK;
        fill(host, CHUNK, i + seed);                       /* rewritten at once: copied at call time */
        CHECK(cudaMemcpyAsync(d + slot, host, CHUNK, cudaMemcpyHostToDevice, s));
        if (i % 3 == 0)
            CHECK(cudaMemsetAsync(d + slot + 100, (int)(i & 0xff), 1000, s));
        CHECK(cudaEventRecord(e, s));
        CHECK(cudaStreamWaitEvent(s2, e, 0));              /* s2 copies what s wrote */
        CHECK(cudaMemcpyAsync(d2 + slot, d + slot, CHUNK, cudaMemcpyDeviceToDevice, s2));
        if (i % 7 == 0) {                                  /* and s overwrites it only after s2 copied */
            CHECK(cudaEventRecord(e, s2));
            CHECK(cudaStreamWaitEvent(s, e, 0));
            CHECK(cudaMemsetAsync(d + slot, 0xee, 64, s));
        }
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamSynchronize(s2));
    uint64_t h = 0xcbf29ce484222325ull;
    CHECK(cudaMemcpy(back, d, (size_t)CHUNK * SLOTS, cudaMemcpyDeviceToHost));
    h = fnv(back, (size_t)CHUNK * SLOTS, h);
    CHECK(cudaMemcpy(back, d2, (size_t)CHUNK * SLOTS, cudaMemcpyDeviceToHost));
    h = fnv(back, (size_t)CHUNK * SLOTS, h);
    CHECK(cudaEventDestroy(e));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFree(d));
    CHECK(cudaFree(d2));
    free(host);
    free(back);
    return h;
}

struct job { long count; int seed; uint64_t sum; };

static void *thread_main(void *arg)
{
    struct job *j = arg;
    j->sum = rounds(j->count, j->seed);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "async_error") == 0) {
        int host[4];
        void *d;
        cudaStream_t s;
        CHECK(cudaMalloc(&d, 16));
        CHECK(cudaStreamCreate(&s));
        printf("cudaMemsetAsync(host pointer): %s\n", cudaGetErrorName(cudaMemsetAsync(host, 0, 4, s)));
        printf("cudaStreamSynchronize: %s\n", cudaGetErrorName(cudaStreamSynchronize(s)));
        printf("cudaStreamSynchronize again: %s\n", cudaGetErrorName(cudaStreamSynchronize(s)));
        cudaGetLastError();
        CHECK(cudaMemsetAsync(d, 0, 16, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaFree(d));
        printf("OK async_error\n");
        return 0;
    }
    if (strcmp(cmd, "burst") == 0 && argc > 2) {
        printf("burst checksum %016llx\n", (unsigned long long)rounds(atol(argv[2]), 0));
        printf("OK burst\n");
        return 0;
    }
    if (strcmp(cmd, "threads") == 0 && argc > 2) {
        int n = atoi(argv[2]);
        struct job jobs[16];
        pthread_t t[16];
        if (n < 1 || n > 16)
            return 2;
        for (int i = 0; i < n; i++) {
            jobs[i] = (struct job){300, i * 11, 0};
            pthread_create(&t[i], NULL, thread_main, &jobs[i]);
        }
        for (int i = 0; i < n; i++) {
            pthread_join(t[i], NULL);
            printf("thread %d checksum %016llx\n", i, (unsigned long long)jobs[i].sum);
        }
        printf("OK threads\n");
        return 0;
    }
    if (strcmp(cmd, "fork") == 0) {
        void *d;
        CHECK(cudaMalloc(&d, 4096));
        for (int i = 0; i < 1000; i++)
            CHECK(cudaMemsetAsync(d, i & 0xff, 4096, 0));
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            void *c = NULL;
            printf("child cudaMalloc: %s\n", cudaGetErrorName(cudaMalloc(&c, 64)));
            fflush(stdout);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        unsigned char back[4096];
        CHECK(cudaMemsetAsync(d, 7, 4096, 0));
        CHECK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
        printf("parent after fork: %d\n", back[4095]);
        CHECK(cudaFree(d));
        printf("OK fork\n");
        return 0;
    }
    if (strcmp(cmd, "until_gone") == 0) {
        void *d;
        CHECK(cudaMalloc(&d, 4096));
        printf("started\n");
        fflush(stdout);
        cudaError_t e = cudaSuccess;
        for (long i = 0; e == cudaSuccess; i++) {
            e = cudaMemsetAsync(d, (int)(i & 0xff), 4096, 0);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(0);
        }
        printf("until_gone: %s\n", cudaGetErrorName(e));
        return 0;
    }
    fprintf(stderr, "usage: %s <async_error|burst COUNT|threads N|until_gone|fork>\n", argv[0]);
    return 2;
}
