/* bypass.c -- never a silent bypass of the device proxy (issue 19).
 *
 * In transparent mode the worker holds no device state: every CUDA runtime
 * and NCCL call goes to the device proxy.  Two doors would still lead from
 * the worker to the real GPU, and both are closed here, at the call, naming
 * the library that knocked and what it called:
 *
 *  - dlopen("libcuda.so.1") (or libcuda.so, by any path): what a library's
 *    own static copy of the CUDA runtime does when it first wakes up (cuBLAS,
 *    cuDNN, cuFFT, ... in a CUDA PyTorch), and what Triton and ctypes do to
 *    reach the driver;
 *  - a direct call of a driver function (cuInit, cuMemAlloc_v2, ...) by a
 *    library linked against libcuda.so.1: driver_guard.c, generated from
 *    cuda.h by tools/gen_driver_guard.py, exports every one of them and
 *    sends it here.
 *
 * Either stops the worker with exit status 77 (the status jitckpt gives a
 * stop that a restart would only meet again), after one line on stderr
 * naming the library and the call; torchrun then ends the job.  A library
 * that is linked but never calls the driver is not stopped: the refusal is
 * made when it calls, not when it is loaded.
 * dlopen with RTLD_NOLOAD (a probe whether the driver is loaded) is passed
 * on: it opens nothing.
 *
 * A third door is handed out rather than knocked on:
 * cudaGetDriverEntryPoint[ByVersion].  PyTorch fetches a table of driver
 * functions at start-up (c10's DriverAPI) and calls few of them, often none.
 * The worker answers with the fence's own stub of the function asked for
 * (its newest _vN in cuda.h): fetching it is harmless, calling it stops the
 * job as a direct call would, naming the function.  A name cuda.h does not
 * declare is answered as the runtime answers an unknown symbol (NULL,
 * cudaDriverEntryPointSymbolNotFound).
 *
 * The one exception: the pure functions the worker answers with the real
 * runtime in-process (cudaGetErrorString, cudaGetErrorName,
 * cudaCreateChannelDesc: remote_local_fn).  CUDA 13's runtime opens the
 * driver at its first call of any function, even these; inside them the
 * driver is not found (dlopen returns NULL), and the runtime answers from its
 * own tables, as on a host with no driver. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote.h"

#define EXIT_STOP_JOB 77 /* as jitckpt.config.RESUME_REFUSED_EXIT_CODE: a restart would meet the same */

static const char *caller_library(const void *address)
{
    Dl_info info;
    if (address != NULL && dladdr(address, &info) && info.dli_fname != NULL && info.dli_fname[0] != '\0') {
        const char *slash = strrchr(info.dli_fname, '/');
        return slash ? slash + 1 : info.dli_fname;
    }
    return "the program";
}

static void __attribute__((noreturn)) stop(const char *library, const char *what)
{
    char reason[768];
    snprintf(reason, sizeof reason, "%s %s: it would reach the CUDA driver in the worker, past the device proxy "
             "(transparent mode forwards the CUDA runtime and NCCL only; `jit-run doctor %s` says what it covers)",
             library, what, library);
    rlog("stopping the job: %s", reason);
    fflush(stdout);
    fflush(stderr);
    _exit(EXIT_STOP_JOB);
}

static int names_the_driver(const char *file)
{
    if (file == NULL)
        return 0;
    const char *slash = strrchr(file, '/');
    const char *base = slash ? slash + 1 : file;
    return strncmp(base, "libcuda.so", 10) == 0;
}

static __thread int pure_depth;

void remote_pure_call(int entering)
{
    pure_depth += entering ? 1 : -1;
}

EXPORT void *dlopen(const char *file, int flags)
{
    static void *(*real)(const char *, int);
    if (real == NULL)
        real = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
    if (names_the_driver(file) && pure_depth > 0)
        return NULL;  /* a pure function of the real runtime: answered without a driver (see above) */
    if (names_the_driver(file) && !(flags & RTLD_NOLOAD)) {
        char what[512];
        snprintf(what, sizeof what, "opened the CUDA driver (dlopen(\"%s\"): a static CUDA runtime waking up, or "
                 "direct driver calls)", file);
        stop(caller_library(__builtin_return_address(0)), what);
    }
    return real(file, flags);
}

void remote_driver_called(const char *function, const void *caller)
{
    char what[256];
    snprintf(what, sizeof what, "called the CUDA driver function %s", function);
    stop(caller_library(caller), what);
}

/* ---- driver entry points: the fence's stubs ---------------------------------------------------------- */

/* This library's stub for driver function `symbol` (its newest _vN first), or NULL. */
static void *guard_stub(const char *symbol)
{
    static void *self;
    if (self == NULL) {
        Dl_info info;
        if (!dladdr((void *)remote_driver_called, &info) || info.dli_fname == NULL)
            return NULL;
        self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (self == NULL)
            return NULL;
    }
    char name[160];
    for (int v = 9; v >= 1; v--) {
        if (snprintf(name, sizeof name, v > 1 ? "%s_v%d" : "%s", symbol, v) >= (int)sizeof name)
            return NULL;
        void *fn = dlsym(self, name);
        if (fn != NULL)
            return fn;
    }
    return NULL;
}

static cudaError_t entry_point(const char *symbol, void **funcPtr, enum cudaDriverEntryPointQueryResult *driverStatus)
{
    if (symbol == NULL || funcPtr == NULL)
        return cudaErrorInvalidValue;
    /* only driver functions: a cu* name (the stubs of this library are the driver's names alone) */
    *funcPtr = strncmp(symbol, "cu", 2) == 0 && strncmp(symbol, "cuda", 4) != 0 ? guard_stub(symbol) : NULL;
    if (driverStatus)
        *driverStatus = *funcPtr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    static int said;
    if (*funcPtr && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        rlog("driver entry points (first: %s) are handed out as stops: the driver is not forwarded, and calling "
             "one stops the job, naming it", symbol);
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, driverStatus);
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, driverStatus);
}

/* The per-thread default-stream twins: the same stubs (no stream is involved). */
EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                                enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, driverStatus);
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                         unsigned long long flags,
                                                         enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, driverStatus);
}
