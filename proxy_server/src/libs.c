/* libs.c -- loading the CUDA runtime and NCCL the proxy executes calls with.
 *
 * Paths, first match wins: the command-line option (--cudart, --nccl), the
 * environment (JITCKPT_PROXY_CUDART, JITCKPT_PROXY_NCCL), the CPU device
 * emulator's libraries next to this executable (the source tree's
 * emulator/build/, or the wheel's _build/emulator/), and last the sonames
 * (libcudart.so.13, libnccl.so.2) through the ordinary search path: the
 * real libraries on a GPU host (unverified on GPU).  Both are loaded
 * RTLD_GLOBAL so that NCCL, and any kernel-twin library the emulator opens,
 * bind to this runtime. */

#include "proxy.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *cudart, *nccl;

/* The first of two paths relative to this executable's directory that exists, or NULL. */
const char *default_sibling(const char *rel1, const char *rel2)
{
    static char buf[2][PATH_MAX + 300];
    static int which;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    const char *rels[2] = {rel1, rel2};
    for (int i = 0; i < 2; i++) {
        char *out = buf[which];
        snprintf(out, sizeof buf[0], "%s/%s", exe, rels[i]);
        if (access(out, R_OK) == 0) {
            which ^= 1;
            return out;
        }
    }
    return NULL;
}

static const char *choose(const char *option, const char *env, const char *name, const char *soname)
{
    if (option)
        return option;
    const char *e = getenv(env);
    if (e && *e)
        return e;
    char rel1[256], rel2[256];
    snprintf(rel1, sizeof rel1, "../../emulator/build/%s", name);     /* the source tree */
    snprintf(rel2, sizeof rel2, "../emulator/%s", name);              /* a wheel's _build/ */
    const char *sibling = default_sibling(rel1, rel2);
    return sibling ? sibling : soname;
}

int libs_load(const struct proxy_options *o)
{
    const char *rt = choose(o->cudart_path, PROXY_ENV_CUDART, "libcudart.so.13", "libcudart.so.13");
    const char *nc = choose(o->nccl_path, PROXY_ENV_NCCL, "libnccl.so.2", "libnccl.so.2");
    cudart = dlopen(rt, RTLD_NOW | RTLD_GLOBAL);
    if (!cudart) {
        plog("cannot load the CUDA runtime %s: %s (set --cudart or " PROXY_ENV_CUDART ")", rt, dlerror());
        return -1;
    }
    nccl = dlopen(nc, RTLD_NOW | RTLD_GLOBAL);
    if (!nccl)
        plog("cannot load NCCL %s: %s (set --nccl or " PROXY_ENV_NCCL "); NCCL calls will fail", nc, dlerror());
    pdebug("CUDA runtime %s, NCCL %s", rt, nc);
    return 0;
}

void *proxy_sym(void *lib, const char *name)
{
    if (!lib)
        return NULL;
    void *fn = dlvsym(lib, name, "libcudart.so.13");      /* the runtime's symbols are versioned */
    return fn ? fn : dlsym(lib, name);
}
