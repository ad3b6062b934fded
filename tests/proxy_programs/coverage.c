/* coverage.c -- runtime calls the emulator's own test programs do not make,
 * checked directly and through the device proxy (tests/test_proxy_coverage.py).
 * Plain C against the runtime API: no kernels, so no host twins.
 *
 * Usage: coverage [restart]
 *   Each check prints one line; the program ends with "OK coverage".  With
 *   "restart", the device proxy is restarted (jitckpt_remote_restart_proxy(),
 *   looked up at run time: absent without transparent mode) after the state is
 *   set up, and the checks read it back afterwards: pitched and stream-ordered
 *   allocations keep their addresses and bytes, device settings stay set. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); return 1; } } while (0)
#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #c); \
    return 1; } } while (0)

static void CUDART_CB wait_for_main(void *arg)       /* a host function that waits for the program */
{
    volatile int *open = arg;
    while (!*open)
        usleep(1000);
}

static void restart_proxy(void)
{
    int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "jitckpt_remote_restart_proxy");
    if (fn) {
        int rc = fn();
        printf("proxy restarted: %s\n", rc == 0 ? "yes" : "FAILED");
    } else {
        printf("proxy restarted: yes\n");      /* directly: nothing to restart; the same output */
    }
}

int main(int argc, char **argv)
{
    int restart = argc > 1 && strcmp(argv[1], "restart") == 0;
    if (argc > 1 && strcmp(argv[1], "mapped") == 0) {      /* device access to the program's own memory */
        static char buf[4096];
        printf("cudaHostRegister(Mapped): %s\n", cudaGetErrorName(cudaHostRegister(buf, sizeof buf,
                                                                                     cudaHostRegisterMapped)));
        return 0;
    }

    /* a pitched allocation: rows of 5 ints at the runtime's pitch */
    int *pitched = NULL;
    size_t pitch = 0, width = 5 * sizeof(int), height = 3;
    CHECK(cudaMallocPitch((void **)&pitched, &pitch, width, height));
    REQUIRE(pitch >= width);
    int rows[3][8];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++)
            rows[r][c] = 100 * r + c;
    CHECK(cudaMemcpy2D(pitched, pitch, rows, sizeof rows[0], width, height, cudaMemcpyHostToDevice));
    CHECK(cudaMemset2D((char *)pitched + sizeof(int), pitch, 0, sizeof(int), height));   /* column 1 -> 0 */

    /* a stream-ordered allocation */
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    long long *pooled = NULL;
    CHECK(cudaMallocAsync((void **)&pooled, 16 * sizeof *pooled, s));
    long long seq[16];
    for (int i = 0; i < 16; i++)
        seq[i] = 1000 + i;
    CHECK(cudaMemcpyAsync(pooled, seq, sizeof seq, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));

    /* settings that outlive their call */
    size_t heap = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 48u << 20));
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));

    if (restart)
        restart_proxy();

    /* the 2D copy back into a host buffer with gaps: the gaps keep their bytes */
    int back[3][8];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++)
            back[r][c] = -1;
    CHECK(cudaMemcpy2D(back, sizeof back[0], pitched, pitch, width, height, cudaMemcpyDeviceToHost));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++)
            REQUIRE(back[r][c] == (c >= 5 ? -1 : c == 1 ? 0 : 100 * r + c));
    printf("pitched 2D copy: rows %d %d %d, gaps kept\n", back[0][4], back[1][4], back[2][4]);

    long long got[16] = {0};
    CHECK(cudaMemcpy(got, pooled, sizeof got, cudaMemcpyDefault));      /* direction from the pointers */
    REQUIRE(memcmp(got, seq, sizeof got) == 0);
    CHECK(cudaFreeAsync(pooled, s));
    CHECK(cudaStreamSynchronize(s));
    /* cudaFreeAsync returns while a host function holds its stream (one that waits
     * for this thread: waiting for the stream there would wait for ever) */
    static volatile int open;
    void *held = NULL;
    CHECK(cudaMallocAsync(&held, 256, s));
    CHECK(cudaLaunchHostFunc(s, wait_for_main, (void *)&open));
    CHECK(cudaFreeAsync(held, s));
    open = 1;
    CHECK(cudaStreamSynchronize(s));
    REQUIRE(cudaFreeAsync(pooled, s) != cudaSuccess);          /* freed already */
    cudaGetLastError();
    void *once = NULL;
    CHECK(cudaMallocAsync(&once, 64, s));
    CHECK(cudaFreeAsync(once, s));
    REQUIRE(cudaFree(once) != cudaSuccess);                    /* and not twice, another way */
    cudaGetLastError();
    /* a stream-ordered allocation captured in a graph (the graph's own memory, made at its launch),
     * freed after the launch */
    unsigned char *seen = NULL;
    CHECK(cudaMallocHost((void **)&seen, 256));
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void *scratch = NULL;
    CHECK(cudaMallocAsync(&scratch, 256, s));
    CHECK(cudaMemsetAsync(scratch, 7, 256, s));
    CHECK(cudaMemcpyAsync(seen, scratch, 256, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    memset(seen, 0, 256);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaFreeAsync(scratch, s));
    CHECK(cudaStreamSynchronize(s));
    REQUIRE(seen[0] == 7 && seen[255] == 7);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaFreeHost(seen));
    printf("a graph with a stream-ordered allocation: launched, then freed\n");
    printf("cudaFreeAsync behind a waiting host function: returned\n");
    printf("stream-ordered allocation: %lld .. %lld\n", got[0], got[15]);

    CHECK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
    enum cudaFuncCache cache;
    CHECK(cudaDeviceGetCacheConfig(&cache));
    printf("heap limit %zu MiB, cache config %d\n", heap >> 20, (int)cache);
    REQUIRE(heap == (48u << 20));           /* (the emulator keeps no cache configuration) */

    /* host-to-host through the runtime, and queries */
    char a[16] = "host to host", b[16] = {0};
    CHECK(cudaMemcpy(b, a, sizeof a, cudaMemcpyHostToHost));
    REQUIRE(strcmp(b, "host to host") == 0);
    int least = 0, greatest = 0, peer = -1, flags = -1;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK(cudaDeviceCanAccessPeer(&peer, 0, 0));
    CHECK(cudaGetDeviceFlags((unsigned *)&flags));
    char bus[32];
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    int dev = -1;
    CHECK(cudaDeviceGetByPCIBusId(&dev, bus));
    int sdev = -1;
    CHECK(cudaStreamGetDevice(s, &sdev));
    enum cudaStreamCaptureStatus cap;
    CHECK(cudaStreamIsCapturing(s, &cap));
    enum cudaStreamCaptureStatus cap2 = cudaStreamCaptureStatusActive;
    unsigned long long capture_id = 0;
    CHECK(cudaStreamGetCaptureInfo(s, &cap2, &capture_id, NULL, NULL, NULL, NULL));   /* what PyTorch asks */
    REQUIRE(cap2 == cudaStreamCaptureStatusNone);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    REQUIRE(mode == cudaStreamCaptureModeGlobal);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    REQUIRE(mode == cudaStreamCaptureModeRelaxed);
    struct cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, pitched));
    REQUIRE(attr.type == cudaMemoryTypeDevice && attr.devicePointer == pitched);
    CHECK(cudaPointerGetAttributes(&attr, a));                   /* the program's own (pageable) memory */
    REQUIRE(attr.type == cudaMemoryTypeUnregistered && attr.devicePointer == NULL);
    printf("priorities %d..%d, peer %d, bus %s -> device %d, stream device %d, capturing %d\n",
           least, greatest, peer, bus, dev, sdev, (int)cap);
    REQUIRE(cudaMemcpy2D(b, 4, a, 4, 4, 2, (enum cudaMemcpyKind)77) != cudaSuccess);   /* an invalid kind */
    cudaGetLastError();
    int ndev = 0;
    CHECK(cudaGetDeviceCount(&ndev));
    if (ndev >= 2) {        /* a peer copy from device 0 to device 1, and back on a stream */
        long long *other = NULL, again[16] = {0};
        CHECK(cudaSetDevice(1));
        CHECK(cudaMalloc((void **)&other, sizeof seq));
        CHECK(cudaSetDevice(0));
        long long *mine = NULL;
        CHECK(cudaMalloc((void **)&mine, sizeof seq));
        CHECK(cudaMemcpy(mine, seq, sizeof seq, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpyPeer(other, 1, mine, 0, sizeof seq));
        CHECK(cudaMemset(mine, 0, sizeof seq));
        CHECK(cudaMemcpyPeerAsync(mine, 0, other, 1, sizeof seq, s));
        CHECK(cudaMemcpyAsync(again, mine, sizeof again, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        REQUIRE(memcmp(again, seq, sizeof seq) == 0);
        printf("peer copies over %d devices: %lld .. %lld\n", ndev, again[0], again[15]);
    }
    /* the program's own memory, registered: async copies from and to it, flags, errors */
    size_t nreg = 1 << 16;
    unsigned char *own = malloc(nreg), *back2 = malloc(nreg);
    for (size_t i = 0; i < nreg; i++)
        own[i] = (unsigned char)(i * 7);
    CHECK(cudaHostRegister(own, nreg, cudaHostRegisterPortable));
    REQUIRE(cudaHostRegister(own + 100, 10, 0) == cudaErrorHostMemoryAlreadyRegistered);
    unsigned rflags = 99;
    REQUIRE(cudaHostGetFlags(&rflags, own) == cudaErrorInvalidValue);     /* not an allocation's */
    cudaGetLastError();
    unsigned char *dbuf = NULL;
    CHECK(cudaMalloc((void **)&dbuf, nreg));
    CHECK(cudaMemcpyAsync(dbuf, own, nreg, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(back2, dbuf, nreg, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    REQUIRE(memcmp(own, back2, nreg) == 0);
    CHECK(cudaPointerGetAttributes(&attr, own));
    REQUIRE(attr.type == cudaMemoryTypeHost);
    CHECK(cudaHostUnregister(own));
    REQUIRE(cudaHostUnregister(own) == cudaErrorHostMemoryNotRegistered);
    cudaGetLastError();
    void *pinned = NULL, *pdev = NULL;
    CHECK(cudaHostAlloc(&pinned, 4096, cudaHostAllocPortable));
    CHECK(cudaHostGetFlags(&rflags, pinned));
    printf("registered memory round trip; pinned memory flags %u", rflags);
    CHECK(cudaHostGetDevicePointer(&pdev, pinned, 0));
    printf(", device pointer %s\n", pdev == pinned ? "the same address" : "ANOTHER address");
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dbuf));
    free(own);
    free(back2);
    cudaFunction_t fn = NULL;
    printf("function of a host address that is no kernel: %s\n",
           cudaGetErrorName(cudaGetFuncBySymbol(&fn, (const void *)restart_proxy)));
    cudaGetLastError();
    CHECK(cudaFree(pitched));
    CHECK(cudaStreamDestroy(s));
    printf("OK coverage\n");
    return 0;
}
