/* library.c -- the proxy's half of run-time loaded device code
 * (interpose/remote/library.c): cudaLibraryLoadData (the image through the
 * arena, loaded from the proxy's own copy -> a virtual library id) and
 * cudaLibraryEnumerateKernels (u32 n, library id -> n virtual kernel ids). */

#include "dispatch.h"

#include <stdlib.h>

static __typeof__(cudaLibraryLoadData) *real_load;
static __typeof__(cudaLibraryEnumerateKernels) *real_enumerate;

int32_t dispatch_library(unsigned fn, struct rdisp *d)
{
    if (!real_load) {
        real_load = (__typeof__(cudaLibraryLoadData) *)proxy_sym(cudart, "cudaLibraryLoadData");
        real_enumerate = (__typeof__(cudaLibraryEnumerateKernels) *)proxy_sym(cudart, "cudaLibraryEnumerateKernels");
        if (!real_load || !real_enumerate)
            return cudaErrorSymbolNotFound;
    }
    if (fn == RFN_cudaLibraryLoadData) {
        const void *image = NULL;
        if (rd_host_in(d, &image) != 0 || image == NULL)
            return RD_BAD;
        cudaLibrary_t lib = NULL;
        cudaError_t err = real_load(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
        if (err == cudaSuccess)
            rd_put_new_handle(d, VH_MODULE, lib);
        return err;
    }
    uint32_t n;
    uint64_t vid;
    void *lib;
    if (rd_get(d, &n, sizeof n) || n == 0 || n > 4096)
        return RD_BAD;
    if (rd_get_handle(d, VH_MODULE, &vid, &lib))
        return cudaErrorInvalidResourceHandle;
    cudaKernel_t *k = calloc(n, sizeof *k);
    if (!k)
        return cudaErrorMemoryAllocation;
    cudaError_t err = real_enumerate(k, n, (cudaLibrary_t)lib);
    for (uint32_t i = 0; err == cudaSuccess && i < n; i++)
        rd_put_new_handle(d, VH_KERNEL, k[i]);
    free(k);
    return err;
}
