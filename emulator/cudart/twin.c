/* twin.c -- finding the host twin of a kernel.
 *
 * A kernel registered under the device name NAME (the mangled name nvcc
 * registers, or the plain name of an extern "C" kernel) runs on the emulator
 * as the host function
 *
 *     extern "C" void NAME__host(dim3 grid, dim3 block, size_t shared_mem,
 *                                void **args);
 *
 * looked up, in this order, in
 *   1. the shared libraries listed in JITCKPT_SIMDEV_KERNELS (colon-separated
 *      paths, opened once with dlopen),
 *   2. the process's dynamic symbols (dlsym(RTLD_DEFAULT)): the program if it
 *      was linked with -rdynamic, and every library it loaded,
 *   3. the static symbol table (.symtab) of the executable or library that
 *      contains the kernel's host stub, so that a twin defined next to its
 *      kernel in an ordinary, unstripped executable is found without special
 *      link flags. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"

#define MAX_LIBS 32

static void *libs[MAX_LIBS];
static char *lib_paths[MAX_LIBS];
static int nlibs;
static pthread_once_t libs_once = PTHREAD_ONCE_INIT;

static void open_libs(void)
{
    const char *env = getenv("JITCKPT_SIMDEV_KERNELS");
    if (!env || !*env)
        return;
    char *buf = strdup(env), *save = NULL;
    for (char *path = strtok_r(buf, ":", &save); path && nlibs < MAX_LIBS;
         path = strtok_r(NULL, ":", &save)) {
        simdev_loading_twins = 1;      /* a twin library built by nvcc registers its own fatbinary */
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        simdev_loading_twins = 0;
        if (!h) {
            simdev_log("JITCKPT_SIMDEV_KERNELS: cannot load %s: %s", path, dlerror());
            continue;
        }
        libs[nlibs] = h;
        lib_paths[nlibs] = strdup(path);
        nlibs++;
    }
    free(buf);
}

struct find_object {
    uintptr_t addr;
    const char *name;
    uintptr_t bias;
    int found;
};

static int find_object_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct find_object *f = data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (f->addr >= lo && f->addr < lo + ph->p_memsz) {
            f->name = info->dlpi_name;
            f->bias = info->dlpi_addr;
            f->found = 1;
            return 1;
        }
    }
    return 0;
}

static void append(char *buf, size_t len, const char *text)
{
    size_t used = strlen(buf);
    if (used + 1 < len)
        snprintf(buf + used, len - used, "%s", text);
}

simdev_twin_fn simdev_twin_lookup(const char *kernel_name, const void *host_fun,
                                  char *searched, size_t searched_len)
{
    pthread_once(&libs_once, open_libs);
    char sym[1024];
    snprintf(sym, sizeof sym, "%s__host", kernel_name);
    searched[0] = '\0';

    if (nlibs == 0)
        append(searched, searched_len, "JITCKPT_SIMDEV_KERNELS (no libraries)");
    else
        append(searched, searched_len, "JITCKPT_SIMDEV_KERNELS libraries [");
    for (int i = 0; i < nlibs; i++) {
        void *f = dlsym(libs[i], sym);
        if (f)
            return (simdev_twin_fn)f;
        append(searched, searched_len, i ? ", " : "");
        append(searched, searched_len, lib_paths[i]);
    }
    append(searched, searched_len, nlibs ? "], the process's dynamic symbols"
                                         : ", the process's dynamic symbols");

    void *f = dlsym(RTLD_DEFAULT, sym);
    if (f)
        return (simdev_twin_fn)f;

    struct find_object obj = { (uintptr_t)host_fun, NULL, 0, 0 };
    dl_iterate_phdr(find_object_cb, &obj);
    if (obj.found) {
        const char *path = obj.name && obj.name[0] ? obj.name : "/proc/self/exe";
        append(searched, searched_len, ", the symbol table of ");
        append(searched, searched_len, path);
        f = simdev_elf_symbol(path, obj.bias, sym);
        if (f)
            return (simdev_twin_fn)f;
    }
    return NULL;
}
