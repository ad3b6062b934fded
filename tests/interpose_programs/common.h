// common.h -- shared by the CUDA programs of tests/test_interpose.py: error
// checks, the environment, and the ncclUniqueId exchange between ranks (rank
// 0 writes it to the file JITCKPT_TEST_ID_FILE names, the others read it).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#define CHECK(expr)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (expr);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,       \
                         cudaGetErrorName(e_));                                              \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)
#define NCHECK(expr)                                                                         \
    do {                                                                                     \
        ncclResult_t r_ = (expr);                                                            \
        if (r_ != ncclSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,       \
                         ncclGetErrorString(r_));                                            \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)
#define REQUIRE(cond)                                                                        \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            std::fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static inline int env_int(const char *name, int dflt)
{
    const char *s = std::getenv(name);
    return s && *s ? std::atoi(s) : dflt;
}

static inline ncclUniqueId exchange_id(int rank)
{
    ncclUniqueId id;
    const char *path = std::getenv("JITCKPT_TEST_ID_FILE");
    REQUIRE(path != nullptr);
    if (rank == 0) {
        NCHECK(ncclGetUniqueId(&id));
        std::string tmp = std::string(path) + ".tmp";
        FILE *f = std::fopen(tmp.c_str(), "wb");
        REQUIRE(f && std::fwrite(&id, sizeof id, 1, f) == 1);
        std::fclose(f);
        REQUIRE(std::rename(tmp.c_str(), path) == 0);
        return id;
    }
    for (int tries = 0; tries < 3000; tries++) {
        FILE *f = std::fopen(path, "rb");
        if (f) {
            size_t got = std::fread(&id, sizeof id, 1, f);
            std::fclose(f);
            if (got == 1) return id;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::fprintf(stderr, "no ncclUniqueId in %s\n", path);
    std::exit(1);
}
