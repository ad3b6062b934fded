/* library.c -- cudaLibrary*: loading device code from memory or a file and
 * getting its kernels by name, without host stubs.
 *
 * This is how a process that did not compile the kernels (a device proxy
 * replaying a worker's launches, say) gets launchable cudaKernel_t handles:
 * cudaLibraryLoadData(fatbin or cubin or PTX) then cudaLibraryGetKernel(name)
 * then cudaLaunchKernel((const void *)kernel, ...).  On the emulator the
 * kernel still runs as its host twin NAME__host, which such a process finds
 * through JITCKPT_SIMDEV_KERNELS.  The code is copied, so the caller may free
 * its buffer after the call. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"

static int looks_like_ptx(const char *text)
{
    return strstr(text, ".version") != NULL && strstr(text, ".target") != NULL;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
                                enum cudaJitOption *jitOptions, void **jitOptionsValues,
                                unsigned int numJitOptions, enum cudaLibraryOption *libraryOptions,
                                void **libraryOptionValues, unsigned int numLibraryOptions)
{
    (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    cudaError_t err = simdev_enter("cudaLibraryLoadData", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!library || !code)
        return simdev_return(cudaErrorInvalidValue);
    const unsigned char *p = code;
    int binary = (p[0] == 0x7f && p[1] == 'E') || (p[0] == 0x50 && p[1] == 0xed);
    if (!binary && !looks_like_ptx(code)) {
        simdev_trace("cudaLibraryLoadData: code is neither a fatbinary, a cubin nor PTX");
        return simdev_return(cudaErrorInvalidPtx);
    }
    size_t size = simdev_code_size(code);
    void *copy = size ? malloc(size + 1) : NULL;
    if (!copy)
        return simdev_return(size ? cudaErrorMemoryAllocation : cudaErrorInvalidKernelImage);
    memcpy(copy, code, size);
    ((char *)copy)[size] = '\0';
    struct simdev_module *m = simdev_library_new(copy);
    if (!m) {
        free(copy);
        return simdev_return(cudaErrorMemoryAllocation);
    }
    *library = (cudaLibrary_t)m;
    return cudaSuccess;
}

cudaError_t cudaLibraryLoadFromFile(cudaLibrary_t *library, const char *fileName,
                                    enum cudaJitOption *jitOptions, void **jitOptionsValues,
                                    unsigned int numJitOptions,
                                    enum cudaLibraryOption *libraryOptions,
                                    void **libraryOptionValues, unsigned int numLibraryOptions)
{
    cudaError_t err = simdev_enter("cudaLibraryLoadFromFile", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    FILE *f = fileName ? fopen(fileName, "rb") : NULL;
    if (!f)
        return simdev_return(cudaErrorInvalidValue);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = (len + 65536 + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return simdev_return(cudaErrorMemoryAllocation);
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, 65536, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    err = len ? cudaLibraryLoadData(library, buf, jitOptions, jitOptionsValues, numJitOptions,
                                    libraryOptions, libraryOptionValues, numLibraryOptions)
              : cudaErrorInvalidValue;
    free(buf);
    return simdev_return(err);
}

cudaError_t cudaLibraryUnload(cudaLibrary_t library)
{
    cudaError_t err = simdev_enter("cudaLibraryUnload", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_module *m = simdev_library_check(library);
    if (!m)
        return simdev_return(cudaErrorInvalidResourceHandle);
    simdev_library_unload(m);
    return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library, const char *name)
{
    cudaError_t err = simdev_enter("cudaLibraryGetKernel", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!pKernel || !name)
        return simdev_return(cudaErrorInvalidValue);
    struct simdev_module *m = simdev_library_check(library);
    if (!m)
        return simdev_return(cudaErrorInvalidResourceHandle);
    struct simdev_kernel *k = simdev_library_kernel(m, name);
    if (!k) {
        simdev_trace("cudaLibraryGetKernel: the library has no kernel %s", name);
        return simdev_return(cudaErrorSymbolNotFound);
    }
    *pKernel = (cudaKernel_t)k;
    return cudaSuccess;
}

struct enum_ctx {
    struct simdev_module *m;
    cudaKernel_t *out;
    unsigned max, n;
};

static void collect(const char *name, void *p)
{
    struct enum_ctx *c = p;
    if (c->out && c->n < c->max)
        c->out[c->n] = (cudaKernel_t)simdev_library_kernel(c->m, name);
    c->n++;
}

cudaError_t cudaLibraryGetKernelCount(unsigned int *count, cudaLibrary_t lib)
{
    cudaError_t err = simdev_enter("cudaLibraryGetKernelCount", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_module *m = simdev_library_check(lib);
    if (!count)
        return simdev_return(cudaErrorInvalidValue);
    if (!m)
        return simdev_return(cudaErrorInvalidResourceHandle);
    struct enum_ctx c = { m, NULL, 0, 0 };
    simdev_fatbin_kernels(m->wrapper, collect, &c);
    *count = c.n;
    return cudaSuccess;
}

cudaError_t cudaLibraryEnumerateKernels(cudaKernel_t *kernels, unsigned int numKernels,
                                        cudaLibrary_t lib)
{
    cudaError_t err = simdev_enter("cudaLibraryEnumerateKernels", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_module *m = simdev_library_check(lib);
    if (!kernels)
        return simdev_return(cudaErrorInvalidValue);
    if (!m)
        return simdev_return(cudaErrorInvalidResourceHandle);
    struct enum_ctx c = { m, kernels, numKernels, 0 };
    simdev_fatbin_kernels(m->wrapper, collect, &c);
    return cudaSuccess;
}
