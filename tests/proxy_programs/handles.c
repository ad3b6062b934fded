/* handles.c -- what a program sees of its handles and of refused calls, for
 * tests/test_proxy.py.  Plain C against the CUDA runtime API (gcc, linked
 * with -lcudart): no kernels, so it needs no host twins.
 *
 * Usage: handles <show|refused|roundtrip|exit_early>
 *   show       prints a stream's, an event's and an allocation's value
 *   refused    calls cudaMallocArray (not marshalled; a weak import, as the
 *              emulator has none) and cudaMemcpy2D from host to host (a
 *              refused call), prints the errors; and cudaMemcpy with
 *              cudaMemcpyDefault (resolved by the worker), prints the value
 *   roundtrip  copies 1 MiB there and back through a stream, checks it
 *   exit_early exits in the middle, with work queued and memory allocated
 *   rate N     N asynchronous calls (cudaEventRecord), prints calls per second */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <time.h>

#include <cuda_runtime_api.h>

extern __typeof__(cudaMallocArray) cudaMallocArray __attribute__((weak));

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorName(e_)); return 1; } } while (0)

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "show") == 0) {
        cudaStream_t s;
        cudaEvent_t e;
        void *p;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaEventCreate(&e));
        CHECK(cudaMalloc(&p, 4096));
        CHECK(cudaEventRecord(e, s));
        CHECK(cudaEventSynchronize(e));
        printf("stream %p\nevent %p\nalloc %p\n", (void *)s, (void *)e, p);
        CHECK(cudaEventDestroy(e));
        CHECK(cudaStreamDestroy(s));
        /* A destroyed handle is an error, not another object. */
        printf("destroyed stream sync: %s\n", cudaGetErrorName(cudaStreamSynchronize(s)));
        CHECK(cudaFree(p));
        printf("OK show\n");
        return 0;
    }
    if (strcmp(cmd, "refused") == 0) {
        void *d = NULL;
        int h = 0, one = 1, rows[4] = {1, 2, 3, 4}, to[4] = {0};
        cudaArray_t array = NULL;
        struct cudaChannelFormatDesc desc = {32, 0, 0, 0, cudaChannelFormatKindFloat};
        printf("cudaMallocArray: %s\n", cudaMallocArray ? cudaGetErrorName(cudaMallocArray(&array, &desc, 4, 4, 0))
                                                        : "(not in this runtime)");
        printf("cudaMemcpy2D(HostToHost): %s\n",
               cudaGetErrorName(cudaMemcpy2D(to, 8, rows, 8, 4, 2, cudaMemcpyHostToHost)));
        CHECK(cudaMalloc(&d, 64));
        CHECK(cudaMemcpy(d, &one, sizeof one, cudaMemcpyDefault));
        CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDefault));
        printf("cudaMemcpy(Default) round trip: %d\n", h);
        printf("OK refused\n");
        return 0;
    }
    if (strcmp(cmd, "roundtrip") == 0) {
        size_t n = 1 << 20;
        unsigned char *a = malloc(n), *b = malloc(n);
        for (size_t i = 0; i < n; i++)
            a[i] = (unsigned char)(i * 131 + 7);
        void *d;
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CHECK(cudaMalloc(&d, n));
        CHECK(cudaMemcpyAsync(d, a, n, cudaMemcpyHostToDevice, s));
        CHECK(cudaMemsetAsync((char *)d + n / 2, 0x5a, 16, s));
        CHECK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        memset(a + n / 2, 0x5a, 16);
        printf("roundtrip %s\n", memcmp(a, b, n) == 0 ? "equal" : "DIFFERENT");
        CHECK(cudaFree(d));
        CHECK(cudaStreamDestroy(s));
        printf("OK roundtrip\n");
        return 0;
    }
    if (strcmp(cmd, "exit_early") == 0) {
        void *d;
        CHECK(cudaMalloc(&d, 1 << 20));
        CHECK(cudaMemsetAsync(d, 1, 1 << 20, 0));
        printf("OK exit_early\n");
        fflush(stdout);
        _exit(3);
    }
    if (strcmp(cmd, "rate") == 0 && argc > 2) {
        long n = atol(argv[2]);
        cudaStream_t s;
        cudaEvent_t e;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < n; i++)
            CHECK(cudaEventRecord(e, s));
        CHECK(cudaStreamSynchronize(s));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        printf("%ld async calls in %.3f s: %.0f calls/s\n", n, sec, (double)n / sec);
        return 0;
    }
    fprintf(stderr, "usage: %s <show|refused|roundtrip|exit_early|rate N>\n", argv[0]);
    return 2;
}
