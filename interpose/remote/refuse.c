/* refuse.c -- what remote mode does not cover, said by name.
 *
 * A function the generator cannot marshal yet is exported anyway, as a
 * refusal: it says on stderr, once per function, that transparent mode does
 * not support it and why, and returns cudaErrorNotSupported (ncclInvalidUsage
 * for NCCL).  It is never forwarded to a runtime in the worker, which holds
 * no device state.  Also the library's stderr messages and local.c's lookup
 * of pure functions. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote.h"

void rlog(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(buf, sizeof buf, "jitckpt remote[%d]: ", (int)getpid());
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", buf);
}

/* Names already reported (a small open-addressed set; a full set just repeats messages). */
#define SEEN 512
static _Atomic(const char *) seen[SEEN];

static int first_time(const char *name)
{
    size_t h = 5381;
    for (const char *p = name; *p; p++)
        h = h * 33 + (unsigned char)*p;
    for (size_t i = 0; i < SEEN; i++) {
        _Atomic(const char *) *slot = &seen[(h + i) % SEEN];
        const char *cur = atomic_load(slot);
        if (cur == NULL) {
            if (atomic_compare_exchange_strong(slot, &cur, name))
                return 1;
        }
        if (cur == name || strcmp(cur, name) == 0)
            return 0;
    }
    return 1;
}

void remote_refuse(const char *name, const char *reason)
{
    if (first_time(name))
        rlog("%s is not supported in transparent mode (%s); it returns an error "
             "(cudaErrorNotSupported/ncclInvalidUsage) and is not forwarded", name, reason);
}

cudaError_t remote_refuse_call(const char *name, const char *condition)
{
    if (first_time(name))
        rlog("this call of %s is not supported in transparent mode (its arguments match: %s); "
             "it returns its library's \"not supported\" error (cudaErrorNotSupported, CUBLAS_STATUS_NOT_SUPPORTED, "
             "CUDNN_STATUS_NOT_SUPPORTED)", name, condition);
    return cudaErrorNotSupported;
}

void *remote_local_fn(void **cache, const char *name, int lib)
{
    void *fn = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (fn)
        return fn;
    const char *soname = lib == remote_next_cudart ? "libcudart.so.13"
                         : lib == remote_next_cublas ? "libcublas.so.13"
                         : lib == remote_next_cublaslt ? "libcublasLt.so.13"
                         : lib == remote_next_cudnn ? "libcudnn.so.9" : "libnccl.so.2";
    fn = lib == remote_next_nccl ? dlsym(RTLD_NEXT, name) : dlvsym(RTLD_NEXT, name, soname);
    if (fn == NULL) {
        rlog("%s: no %s is loaded after this library; aborting", name, soname);
        abort();
    }
    __atomic_store_n(cache, fn, __ATOMIC_RELEASE);
    return fn;
}
