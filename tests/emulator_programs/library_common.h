/* library_common.h -- shared by the plain C test programs of the emulated NVIDIA
 * libraries (cublas_gemm.c, cublaslt_gemm.c, cudnn_conv.c): the CHECK macros,
 * the seeded inputs, FNV-1a and the host function that stalls a stream.
 *
 * Plain C (gcc -std=gnu11) against the real cuda_runtime_api.h, header-only,
 * so the programs still build with gcc and link with only the library under
 * test and -lcudart.  Included as "library_common.h": found beside the
 * program, no -I needed.  (common.h is the CUDA C++ programs' header: nvcc,
 * <chrono>, std::, a CHECK with another message; it does not build as C.) */
#ifndef JITCKPT_LIBRARY_COMMON_H
#define JITCKPT_LIBRARY_COMMON_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Unless `expr` (a call returning `type`) returns `ok`: prints
 * "<file>:<line>: <text> failed: <name(status)>" and exits 1.  `text` is the
 * caller's #expr, so the message shows the call as written. */
#define CHECK_STATUS(type, expr, text, ok, name)                                            \
    do {                                                                                    \
        type s_ = (expr);                                                                   \
        if (s_ != (ok)) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, text, name(s_));  \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define CHECK_CUDA(expr) CHECK_STATUS(cudaError_t, expr, #expr, cudaSuccess, cudaGetErrorName)

/* ---- inputs and hashes ---------------------------------------------------------- */

static uint64_t rng;

static inline void seed(uint64_t s)
{
    rng = s * 0x9e3779b97f4a7c15ull + 1;
}

/* In [-range, range) (range: a power of two), with a full 53-bit mantissa, so
 * that sums round and their order matters: the top 53 bits of an xorshift64
 * step, times range * 2^-52 (exact), less range. */
static inline double next_in(double range)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (range * 0x1.0p-52) - range;
}

#define FNV_START 0xcbf29ce484222325ull

/* FNV-1a 64 of n bytes, continuing from h (FNV_START to begin). */
static inline uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* A host function (cudaLaunchHostFunc) that sleeps (intptr_t)ms milliseconds:
 * keeps a stream busy while the call under test is queued behind it. */
static inline void host_fn_sleep(void *ms)
{
    struct timespec ts = {0, (long)(intptr_t)ms * 1000000L};
    nanosleep(&ts, NULL);
}

#endif
