/* library.c -- device code loaded at run time: cudaLibraryLoadData,
 * cudaLibraryLoadFromFile and cudaLibraryEnumerateKernels (the other library
 * calls are generated: api_facts.py).
 *
 * The image's bytes cross to the proxy, which loads its own copy; the program
 * holds a virtual library handle and virtual kernel handles, and launches a
 * kernel handle like nvcc's hidden entry point does (special.c).  The size of
 * an image is not an argument: a fatbinary's comes from its header, an ELF
 * cubin's from its section and program header tables, PTX is text up to its
 * NUL.  A file is read here and sent the same way, so the proxy never opens a
 * path the program names.  JIT and library options are refused by name.  A
 * proxy restart does not re-load libraries: it stops with the reason
 * (restart.c), and a minibatch that loads one cannot be replayed. */

#include "remote.h"
#include "track.h"

#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FATBIN_MAGIC 0xba55ed50u
#define MAX_IMAGE (1ull << 31)

static int live_libraries;       /* under the call lock */

/* Kernel handles and their library, so that a launch of a kernel whose library
 * is gone fails at once, as the runtime's does, and not at a later call. */
struct owner { uint64_t kernel, library; int unloaded; };
static struct owner *owners;
static size_t nowners, cap_owners;

static void own(uint64_t kernel, uint64_t library)
{
    for (size_t i = 0; i < nowners; i++)
        if (owners[i].kernel == kernel)
            return;
    if (nowners == cap_owners) {
        size_t n = cap_owners ? cap_owners * 2 : 16;
        struct owner *p = realloc(owners, n * sizeof *p);
        if (p == NULL)
            return;
        owners = p;
        cap_owners = n;
    }
    owners[nowners++] = (struct owner){kernel, library, 0};
}

int remote_kernel_unloaded(uint64_t kernel)
{
    for (size_t i = 0; i < nowners; i++)
        if (owners[i].kernel == kernel)
            return owners[i].unloaded;
    return 0;
}

void remote_track_cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library, const char *name)
{
    (void)name;
    if (pKernel)
        own((uint64_t)(uintptr_t)*pKernel, (uint64_t)(uintptr_t)library);
}

int remote_live_libraries(void) { return live_libraries; }

/* The image's size in bytes, or 0 if it is none of the three forms. */
static size_t image_size(const unsigned char *code)
{
    uint32_t magic;
    memcpy(&magic, code, 4);
    if (magic == FATBIN_MAGIC) {
        uint16_t header;
        uint64_t size;
        memcpy(&header, code + 6, 2);
        memcpy(&size, code + 8, 8);
        return size < MAX_IMAGE ? header + (size_t)size : 0;
    }
    if (memcmp(code, ELFMAG, SELFMAG) == 0 && code[EI_CLASS] == ELFCLASS64) {
        Elf64_Ehdr eh;
        memcpy(&eh, code, sizeof eh);
        uint64_t end = sizeof eh;
        uint64_t sh = eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize;
        uint64_t ph = eh.e_phoff + (uint64_t)eh.e_phnum * eh.e_phentsize;
        end = sh > end ? sh : end;
        end = ph > end ? ph : end;
        if (eh.e_shentsize != sizeof(Elf64_Shdr) || end >= MAX_IMAGE)
            return 0;
        for (unsigned i = 0; i < eh.e_shnum; i++) {
            Elf64_Shdr s;
            memcpy(&s, code + eh.e_shoff + (uint64_t)i * sizeof s, sizeof s);
            if (s.sh_type != SHT_NOBITS && s.sh_offset + s.sh_size > end)
                end = s.sh_offset + s.sh_size;
        }
        return end < MAX_IMAGE ? (size_t)end : 0;
    }
    size_t n = strnlen((const char *)code, MAX_IMAGE);       /* PTX: text */
    return n < MAX_IMAGE && (strstr((const char *)code, ".version") || strstr((const char *)code, ".target"))
               ? n + 1 : 0;
}

static cudaError_t load(cudaLibrary_t *library, const void *code, size_t n)
{
    struct rcall c;
    if (remote_begin(&c, RFN_cudaLibraryLoadData) != 0)
        return remote_unavailable();
    rc_put_in(&c, code, n);
    cudaError_t err = (cudaError_t)remote_call(&c);
    if (err == cudaSuccess) {
        rc_get_handle(&c, (void **)library);
        live_libraries++;
    }
    remote_end(&c);
    return err;
}

EXPORT cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, enum cudaJitOption *jitOptions,
                                       void **jitOptionsValues, unsigned int numJitOptions,
                                       enum cudaLibraryOption *libraryOptions, void **libraryOptionValues,
                                       unsigned int numLibraryOptions)
{
    (void)jitOptions; (void)jitOptionsValues; (void)libraryOptions; (void)libraryOptionValues;
    if (library == NULL || code == NULL)
        return cudaErrorInvalidValue;
    if (numJitOptions || numLibraryOptions)
        return remote_refuse_call("cudaLibraryLoadData", "numJitOptions != 0 || numLibraryOptions != 0");
    size_t n = image_size(code);
    if (n == 0)
        return remote_refuse_call("cudaLibraryLoadData", "an image that is neither a fatbinary, an ELF cubin nor "
                                  "PTX text (its size is unknown)");
    return load(library, code, n);
}

EXPORT cudaError_t cudaLibraryLoadFromFile(cudaLibrary_t *library, const char *fileName,
                                           enum cudaJitOption *jitOptions, void **jitOptionsValues,
                                           unsigned int numJitOptions, enum cudaLibraryOption *libraryOptions,
                                           void **libraryOptionValues, unsigned int numLibraryOptions)
{
    if (library == NULL || fileName == NULL)
        return cudaErrorInvalidValue;
    if (numJitOptions || numLibraryOptions)
        return remote_refuse_call("cudaLibraryLoadFromFile", "numJitOptions != 0 || numLibraryOptions != 0");
    FILE *f = fopen(fileName, "rb");
    if (f == NULL)
        return cudaErrorFileNotFound;
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            unsigned char *p = realloc(buf, cap = cap ? cap * 2 : 1 << 20);
            if (p == NULL) {
                free(buf);
                fclose(f);
                return cudaErrorMemoryAllocation;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, 65536, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    if (buf == NULL)
        return cudaErrorInvalidSource;
    buf[n] = '\0';                                   /* PTX from a file need not end with its NUL */
    cudaError_t err = cudaLibraryLoadData(library, buf, jitOptions, jitOptionsValues, 0, libraryOptions,
                                          libraryOptionValues, 0);
    free(buf);
    return err;
}

EXPORT cudaError_t cudaLibraryEnumerateKernels(cudaKernel_t *kernels, unsigned int numKernels, cudaLibrary_t lib)
{
    if (kernels == NULL || numKernels == 0)
        return cudaErrorInvalidValue;
    struct rcall c;
    if (remote_begin(&c, RFN_cudaLibraryEnumerateKernels) != 0)
        return remote_unavailable();
    rc_put(&c, &numKernels, sizeof numKernels);
    rc_put_handle(&c, lib);
    cudaError_t err = (cudaError_t)remote_call(&c);
    for (unsigned i = 0; err == cudaSuccess && i < numKernels; i++) {
        rc_get_handle(&c, (void **)&kernels[i]);
        own((uint64_t)(uintptr_t)kernels[i], (uint64_t)(uintptr_t)lib);
    }
    remote_end(&c);
    return err;
}

/* the generated cudaLibraryUnload's tracking (track.h) */
void remote_track_cudaLibraryUnload(cudaLibrary_t library)
{
    for (size_t i = 0; i < nowners; i++)
        if (owners[i].library == (uint64_t)(uintptr_t)library)
            owners[i].unloaded = 1;
    if (live_libraries > 0)
        live_libraries--;
}
