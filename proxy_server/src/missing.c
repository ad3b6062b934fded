/* missing.c -- a function the loaded CUDA runtime or NCCL does not have.
 *
 * The proxy is built against one nccl.h (any from 2.27 on) and may load an
 * older NCCL, which lacks what newer versions added (ncclAlltoAll came with
 * 2.28).  Such a function is no reason to refuse the whole job at start:
 * the generated dispatch (proxy_dispatch.c) leaves it unresolved, and only
 * when the program calls it does the call fail, with a message naming it and
 * the library loaded (once per function). */

#define _GNU_SOURCE
#include "dispatch.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

/* "<path>, NCCL 2.27.7" (or the runtime's version) of a loaded library. */
static void describe(void *lib, int is_nccl, char *out, size_t n)
{
    struct link_map *map = NULL;
    const char *path = lib && dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name[0] ? map->l_name : "?";
    int version = 0;
    if (is_nccl) {
        __typeof__(ncclGetVersion) *get = (__typeof__(ncclGetVersion) *)proxy_sym(lib, "ncclGetVersion");
        if (get && get(&version) == ncclSuccess && version >= 10000)
            snprintf(out, n, "%s, NCCL %d.%d.%d", path, version / 10000, version / 100 % 100, version % 100);
        else
            snprintf(out, n, "%s", path);
    } else {
        __typeof__(cudaRuntimeGetVersion) *get =
            (__typeof__(cudaRuntimeGetVersion) *)proxy_sym(lib, "cudaRuntimeGetVersion");
        if (get && get(&version) == cudaSuccess && version > 0)
            snprintf(out, n, "%s, CUDA runtime %d.%d", path, version / 1000, version % 1000 / 10);
        else
            snprintf(out, n, "%s", path);
    }
}

int dispatch_note_missing(const char *name)
{
    pdebug("%s is not in the loaded %s: a call of it will fail", name,
           strncmp(name, "nccl", 4) == 0 ? "NCCL" : "CUDA runtime");
    return 1;
}

/* The names already reported (the proxy executes calls on one thread). */
#define SAID_MAX 64
static const char *said[SAID_MAX];

int32_t dispatch_missing(const char *name)
{
    int is_nccl = strncmp(name, "nccl", 4) == 0;
    int32_t err = is_nccl ? (int32_t)ncclSystemError : (int32_t)cudaErrorSharedObjectSymbolNotFound;
    for (int i = 0; i < SAID_MAX; i++) {
        if (said[i] && strcmp(said[i], name) == 0)
            return err;
        if (!said[i]) {
            said[i] = name;
            break;
        }
    }
    void *lib = is_nccl ? nccl : cudart;
    if (!lib) {
        plog("%s: no NCCL is loaded (see above), so the program's call of it fails with ncclSystemError", name);
        return err;
    }
    char what[1024];
    describe(lib, is_nccl, what, sizeof what);
    plog("%s is not in the loaded %s (%s): the program's call of it fails with %s; "
         "run the job with a%s that has it", name, is_nccl ? "NCCL" : "CUDA runtime", what,
         is_nccl ? "ncclSystemError" : "cudaErrorSharedObjectSymbolNotFound",
         is_nccl ? " newer NCCL" : " newer CUDA runtime");
    return err;
}
