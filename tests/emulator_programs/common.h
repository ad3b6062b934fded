// common.h -- helpers shared by the CUDA test programs of tests/test_emulator.py.
//
// The programs are ordinary CUDA C++ built with `nvcc -cudart shared`; they
// would build and run unchanged on a GPU.  Each takes a subcommand, prints
// what it checks, and exits 0 only if every check passed.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#define CHECK(expr)                                                                         \
    do {                                                                                    \
        cudaError_t e_ = (expr);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #expr,  \
                         cudaGetErrorName(e_), cudaGetErrorString(e_));                     \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

#define EXPECT_ERR(expr, want)                                                              \
    do {                                                                                    \
        cudaError_t e_ = (expr);                                                            \
        if (e_ != (want)) {                                                                 \
            std::fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, \
                         #expr, cudaGetErrorName(e_), cudaGetErrorName(want));              \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

#define REQUIRE(cond)                                                                       \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            std::fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__,     \
                         #cond);                                                            \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

static inline double now_ms()
{
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

static inline void sleep_ms(int ms)
{
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

static inline int env_int(const char *name, int dflt)
{
    const char *s = std::getenv(name);
    return s && *s ? std::atoi(s) : dflt;
}

// Polls cudaEventQuery for `ms` milliseconds; returns true if it stayed
// cudaErrorNotReady the whole time (the host thread stays free meanwhile).
static inline bool stays_not_ready(cudaEvent_t ev, int ms)
{
    double end = now_ms() + ms;
    int polls = 0;
    while (now_ms() < end) {
        cudaError_t e = cudaEventQuery(ev);
        if (e != cudaErrorNotReady) {
            std::fprintf(stderr, "event query returned %s after %d polls\n", cudaGetErrorName(e),
                         polls);
            return false;
        }
        polls++;
        sleep_ms(10);
    }
    return polls > 10;
}

// A gate that blocks a stream from the host: the stream runs gate_wait (via
// cudaLaunchHostFunc) and stays there until the host opens the gate.
struct Gate {
    volatile int open = 0;
};

static void CUDART_CB gate_wait(void *p)
{
    Gate *g = static_cast<Gate *>(p);
    while (!__atomic_load_n(&g->open, __ATOMIC_ACQUIRE))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

static inline void gate_open(Gate &g)
{
    __atomic_store_n(&g.open, 1, __ATOMIC_RELEASE);
}
