/* forward.c -- finds the next definition of every function the library wraps.
 *
 * A wrapper calls forward_fn(&next_X); after the first call that is one
 * atomic load.  The next_X themselves are generated from the facts table
 * (tools/api_facts.py) into build/gen/next_syms.c.  The first call looks the
 * function up:
 *
 *  1. dlvsym(RTLD_NEXT, name, "libcudart.so.13") for the CUDA runtime (CUDA 13
 *     binaries import versioned symbols such as cudaMalloc@libcudart.so.13, and
 *     the real runtime defines all of its functions in that node), and
 *     dlsym(RTLD_NEXT, name) for NCCL (unversioned).  This finds the next
 *     library in the global search order: the real runtime when the program
 *     was linked against it, or when it was dlopen'ed with RTLD_GLOBAL.
 *  2. The same lookup in the already-loaded library named by its soname
 *     (dlopen(soname, RTLD_NOLOAD)).  A runtime dlopen'ed with RTLD_LOCAL (by a
 *     Python extension module, say) is not in the global search order, yet the
 *     code linked against it still binds to this library first, because an
 *     LD_PRELOAD library precedes every other in every lookup scope.
 *
 * Neither lookup can return our own definition: RTLD_NEXT starts after this
 * library, and a soname handle searches only that library and its
 * dependencies.  A function found nowhere is reported once on stderr, by
 * name, when the program first calls it (never at load: an NCCL older than
 * the nccl.h this library was built against lacks what later versions
 * added, and the program may never call that), and the wrapper returns
 * cudaErrorSharedObjectSymbolNotFound or ncclSystemError. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>

#include "interpose.h"

static void *lookup_in_loaded_library(struct next_sym *sym)
{
    const char *soname = sym->lib == NEXT_CUDART ? JITCKPT_CUDART_SONAME : JITCKPT_NCCL_SONAME;
    void *handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        return NULL;
    /* The handle stays open: the library is in use by the process anyway. */
    if (sym->lib == NEXT_CUDART)
        return dlvsym(handle, sym->name, JITCKPT_CUDART_SONAME);
    return dlsym(handle, sym->name);
}

/* "<path>, NCCL 2.27.7" of the loaded library, or "" if none is loaded. */
static void describe_loaded(enum next_lib lib, char *out, size_t n)
{
    const char *soname = lib == NEXT_CUDART ? JITCKPT_CUDART_SONAME : JITCKPT_NCCL_SONAME;
    void *handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    struct link_map *map = NULL;
    out[0] = '\0';
    if (handle == NULL)
        return;
    const char *path = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name[0] ? map->l_name : soname;
    int v = 0;
    if (lib == NEXT_NCCL) {
        int (*get)(int *) = (int (*)(int *))dlsym(handle, "ncclGetVersion");
        if (get && get(&v) == 0 && v >= 10000) {
            snprintf(out, n, "%s, NCCL %d.%d.%d", path, v / 10000, v / 100 % 100, v % 100);
            return;
        }
    } else {
        int (*get)(int *) = (int (*)(int *))dlvsym(handle, "cudaRuntimeGetVersion", JITCKPT_CUDART_SONAME);
        if (get && get(&v) == 0 && v > 0) {
            snprintf(out, n, "%s, CUDA runtime %d.%d", path, v / 1000, v % 1000 / 10);
            return;
        }
    }
    snprintf(out, n, "%s", path);
}

void *forward_resolve(struct next_sym *sym)
{
    void *fn;
    if (sym->lib == NEXT_CUDART)
        fn = dlvsym(RTLD_NEXT, sym->name, JITCKPT_CUDART_SONAME);
    else
        fn = dlsym(RTLD_NEXT, sym->name);
    if (fn == NULL)
        fn = lookup_in_loaded_library(sym);
    if (fn == NULL) {
        if (atomic_exchange(&sym->reported, 1))
            return NULL;
        char loaded[1024];
        const char *what = sym->lib == NEXT_CUDART ? "CUDA runtime" : "NCCL library";
        const char *err = sym->lib == NEXT_CUDART ? "cudaErrorSharedObjectSymbolNotFound" : "ncclSystemError";
        describe_loaded(sym->lib, loaded, sizeof loaded);
        if (loaded[0])
            ilog("cannot forward %s: the loaded %s (%s) does not have it; the call fails with %s "
                 "(the program needs a newer %s)", sym->name, what, loaded, err, what);
        else
            ilog("cannot forward %s: no %s%s%s is loaded after this library (is the %s loaded?); "
                 "the call fails with %s", sym->name, sym->name, sym->lib == NEXT_CUDART ? "@" : "",
                 sym->lib == NEXT_CUDART ? JITCKPT_CUDART_SONAME : "", what, err);
        return NULL;
    }
    atomic_store_explicit(&sym->fn, fn, memory_order_release);
    return fn;
}
