/* libs.c -- loading the CUDA runtime and NCCL the proxy executes calls with.
 *
 * Paths, first match wins: the command-line option (--cudart, --nccl,
 * --cublas, --cublaslt, --cudnn), the environment (JITCKPT_PROXY_CUDART, JITCKPT_PROXY_NCCL,
 * JITCKPT_PROXY_CUBLAS, JITCKPT_PROXY_CUBLASLT, JITCKPT_PROXY_CUDNN), and last the sonames (libcudart.so.13,
 * libnccl.so.2, libcublas.so.13, libcublasLt.so.13, libcudnn.so.9) through the ordinary search path
 * (LD_LIBRARY_PATH, ld.so.cache): what a program run in the same
 * environment would load.  The CPU device emulator is never a default
 * (DESIGN decision 7): it is loaded only when asked for, by its path or by
 * putting its directory on LD_LIBRARY_PATH (jit-run --emulated-gpus does;
 * jit-run --transparent passes the files the program itself would load and
 * says which).  Both are loaded RTLD_GLOBAL so that NCCL, and any
 * kernel-twin library the emulator opens, bind to this runtime. */

#include "proxy.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *cudart, *nccl, *cublas, *cublaslt, *cudnn;

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

/* The path to load: the option, else the environment variable, else the soname.
 * *chosen says whether the user named it (option or variable). */
static const char *choose(const char *option, const char *env, const char *soname, int *chosen)
{
    const char *e = getenv(env);
    *chosen = option != NULL || (e && *e);
    if (option)
        return option;
    return e && *e ? e : soname;
}

int libs_load(const struct proxy_options *o)
{
    int rt_chosen, nc_chosen;
    const char *rt = choose(o->cudart_path, PROXY_ENV_CUDART, "libcudart.so.13", &rt_chosen);
    const char *nc = choose(o->nccl_path, PROXY_ENV_NCCL, "libnccl.so.2", &nc_chosen);
    cudart = dlopen(rt, RTLD_NOW | RTLD_GLOBAL);
    if (!cudart) {
        plog("cannot load the CUDA runtime %s: %s (set --cudart or " PROXY_ENV_CUDART
             "%s)", rt, dlerror(), rt_chosen ? "" : "; the CPU device emulator is used only when named there or "
             "put on LD_LIBRARY_PATH, e.g. by jit-run --emulated-gpus N");
        return -1;
    }
    nccl = dlopen(nc, RTLD_NOW | RTLD_GLOBAL);
    if (!nccl && nc_chosen)
        plog("cannot load NCCL %s: %s (set --nccl or " PROXY_ENV_NCCL "); NCCL calls will fail", nc, dlerror());
    else if (!nccl)     /* none named and none on the search path: a program without NCCL needs none */
        pdebug("no NCCL (%s: %s); NCCL calls will fail", nc, dlerror());
    /* cuBLAS, cuBLASLt and cuDNN (issue 19: forwarded at the library level), loaded after the runtime so
     * that their libcudart.so.13 dependency is this one; a program that does not call one needs none. */
    struct { void **lib; const char *option, *env, *soname, *what, *flag; } libs[] = {
        {&cublas, o->cublas_path, PROXY_ENV_CUBLAS, "libcublas.so.13", "cuBLAS", "--cublas"},
        {&cublaslt, o->cublaslt_path, PROXY_ENV_CUBLASLT, "libcublasLt.so.13", "cuBLASLt", "--cublaslt"},
        {&cudnn, o->cudnn_path, PROXY_ENV_CUDNN, "libcudnn.so.9", "cuDNN", "--cudnn"},
    };
    const char *path[3];
    for (int i = 0; i < 3; i++) {
        int chosen;
        path[i] = choose(libs[i].option, libs[i].env, libs[i].soname, &chosen);
        *libs[i].lib = dlopen(path[i], RTLD_NOW | RTLD_GLOBAL);
        if (!*libs[i].lib && chosen)
            plog("cannot load %s %s: %s (set %s or %s); %s calls will fail", libs[i].what, path[i], dlerror(),
                 libs[i].flag, libs[i].env, libs[i].what);
        else if (!*libs[i].lib)
            pdebug("no %s (%s: %s); %s calls will fail", libs[i].what, path[i], dlerror(), libs[i].what);
    }
    pdebug("CUDA runtime %s, NCCL %s, cuBLAS %s, cuBLASLt %s, cuDNN %s", rt, nc, cublas ? path[0] : "none",
           cublaslt ? path[1] : "none", cudnn ? path[2] : "none");
    return 0;
}

void *proxy_sym(void *lib, const char *name)
{
    if (!lib)
        return NULL;
    void *fn = dlvsym(lib, name, "libcudart.so.13");      /* the runtime's symbols are versioned */
    return fn ? fn : dlsym(lib, name);
}
