/* forward.c -- finds the next definition of every function the library wraps.
 *
 * A wrapper calls forward_fn(&next_X); after the first call that is one
 * atomic load.  The first call looks the function up:
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
 * dependencies.  A function found nowhere is reported once on stderr, and
 * the wrapper returns cudaErrorSharedObjectSymbolNotFound or ncclSystemError. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#include "interpose.h"

struct next_sym next_cudaEventRecord = {"cudaEventRecord", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaEventRecordWithFlags = {"cudaEventRecordWithFlags", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaStreamWaitEvent = {"cudaStreamWaitEvent", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaEventSynchronize = {"cudaEventSynchronize", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaEventDestroy = {"cudaEventDestroy", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaStreamDestroy = {"cudaStreamDestroy", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaStreamSynchronize = {"cudaStreamSynchronize", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaDeviceSynchronize = {"cudaDeviceSynchronize", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpy = {"cudaMemcpy", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpyAsync = {"cudaMemcpyAsync", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpy2D = {"cudaMemcpy2D", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpy2DAsync = {"cudaMemcpy2DAsync", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemset = {"cudaMemset", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemsetAsync = {"cudaMemsetAsync", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaLaunchKernel = {"cudaLaunchKernel", NEXT_CUDART, NULL, 0};
struct next_sym next___cudaLaunchKernel = {"__cudaLaunchKernel", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaLaunchKernelExC = {"cudaLaunchKernelExC", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaEventQuery = {"cudaEventQuery", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaGetDevice = {"cudaGetDevice", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaSetDevice = {"cudaSetDevice", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaStreamCreateWithFlags = {"cudaStreamCreateWithFlags", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaStreamGetFlags = {"cudaStreamGetFlags", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaEventRecord_ptsz = {"cudaEventRecord_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaEventRecordWithFlags_ptsz = {"cudaEventRecordWithFlags_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaStreamWaitEvent_ptsz = {"cudaStreamWaitEvent_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaStreamSynchronize_ptsz = {"cudaStreamSynchronize_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpy_ptds = {"cudaMemcpy_ptds", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpyAsync_ptsz = {"cudaMemcpyAsync_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpy2D_ptds = {"cudaMemcpy2D_ptds", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemcpy2DAsync_ptsz = {"cudaMemcpy2DAsync_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemset_ptds = {"cudaMemset_ptds", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaMemsetAsync_ptsz = {"cudaMemsetAsync_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaLaunchKernel_ptsz = {"cudaLaunchKernel_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next___cudaLaunchKernel_ptsz = {"__cudaLaunchKernel_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_cudaLaunchKernelExC_ptsz = {"cudaLaunchKernelExC_ptsz", NEXT_CUDART, NULL, 0};
struct next_sym next_ncclAllReduce = {"ncclAllReduce", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclBroadcast = {"ncclBroadcast", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclBcast = {"ncclBcast", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclReduce = {"ncclReduce", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclAllGather = {"ncclAllGather", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclReduceScatter = {"ncclReduceScatter", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclAlltoAll = {"ncclAlltoAll", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclGather = {"ncclGather", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclScatter = {"ncclScatter", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclSend = {"ncclSend", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclRecv = {"ncclRecv", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclAllReduceConfig = {"ncclAllReduceConfig", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclBroadcastConfig = {"ncclBroadcastConfig", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclReduceConfig = {"ncclReduceConfig", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclAllGatherConfig = {"ncclAllGatherConfig", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclReduceScatterConfig = {"ncclReduceScatterConfig", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclAlltoAllConfig = {"ncclAlltoAllConfig", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclGatherConfig = {"ncclGatherConfig", NEXT_NCCL, NULL, 0};
struct next_sym next_ncclScatterConfig = {"ncclScatterConfig", NEXT_NCCL, NULL, 0};

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
        if (!atomic_exchange(&sym->reported, 1))
            ilog("cannot forward %s: no %s%s%s is loaded after this library (is the %s loaded?)",
                 sym->name, sym->name, sym->lib == NEXT_CUDART ? "@" : "",
                 sym->lib == NEXT_CUDART ? JITCKPT_CUDART_SONAME : "",
                 sym->lib == NEXT_CUDART ? "CUDA runtime" : "NCCL library");
        return NULL;
    }
    atomic_store_explicit(&sym->fn, fn, memory_order_release);
    return fn;
}
