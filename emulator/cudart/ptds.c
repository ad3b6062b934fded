/* ptds.c -- the per-thread-default-stream entry points (*_ptds, *_ptsz).
 *
 * Code compiled with `nvcc --default-stream per-thread` (or with
 * CUDA_API_PER_THREAD_DEFAULT_STREAM defined) calls these instead of the
 * plain functions; the only difference is that stream 0 means the calling
 * thread's own default stream instead of the legacy default stream.  Defining
 * the macro before including the real header makes the header rename the
 * declarations, so every definition below is checked against NVIDIA's
 * prototype of the _ptds/_ptsz function. */

#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include <cuda_runtime_api.h>

#include "simdev.h"

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return simdev_memcpy(dst, src, count, kind, 0, 1, 0, "cudaMemcpy");
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind)
{
    return simdev_memcpy2d(dst, dpitch, src, spitch, width, height, kind, 0, 1, 0,
                           "cudaMemcpy2D");
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    return simdev_memset(devPtr, value, count, 0, 1, 0, "cudaMemset");
}

cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height)
{
    return simdev_memset2d(devPtr, pitch, value, width, height, 0, 1, 0, "cudaMemset2D");
}

cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                               enum cudaMemcpyKind kind)
{
    return simdev_memcpy_symbol(symbol, (void *)src, count, offset, kind, 1, 0, 1, 0,
                                "cudaMemcpyToSymbol");
}

cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                 enum cudaMemcpyKind kind)
{
    return simdev_memcpy_symbol(symbol, dst, count, offset, kind, 0, 0, 1, 0,
                                "cudaMemcpyFromSymbol");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return simdev_memcpy(dst, src, count, kind, stream, 1, 1, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream)
{
    return simdev_memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream, 1, 1,
                           "cudaMemcpy2DAsync");
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return simdev_memset(devPtr, value, count, stream, 1, 1, "cudaMemsetAsync");
}

cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream)
{
    return simdev_memset2d(devPtr, pitch, value, width, height, stream, 1, 1,
                           "cudaMemset2DAsync");
}

cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count,
                                    size_t offset, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return simdev_memcpy_symbol(symbol, (void *)src, count, offset, kind, 1, stream, 1, 1,
                                "cudaMemcpyToSymbolAsync");
}

cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count, size_t offset,
                                      enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return simdev_memcpy_symbol(symbol, dst, count, offset, kind, 0, stream, 1, 1,
                                "cudaMemcpyFromSymbolAsync");
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return simdev_stream_synchronize(stream, 1);
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return simdev_stream_query(stream, 1);
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags)
{
    return simdev_stream_get_flags(hStream, 1, flags);
}

cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
    return simdev_stream_get_priority(hStream, 1, priority);
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
    return simdev_stream_get_device(hStream, 1, device);
}

cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long *streamId)
{
    return simdev_stream_get_id(hStream, 1, streamId);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
    return simdev_stream_is_capturing(stream, 1, pCaptureStatus);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return simdev_event_record(event, stream, 1, 0);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    return simdev_event_record(event, stream, 1, flags);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    return simdev_stream_wait_event(stream, event, 1, flags);
}

cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                  void *userData, unsigned int flags)
{
    return simdev_stream_add_callback(stream, callback, userData, flags, 1);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    return simdev_launch_host_func(stream, fn, userData, 1, "cudaLaunchHostFunc");
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream)
{
    struct simdev_kernel *k = simdev_kernel_by_host_fun(func);
    if (!k)
        k = simdev_kernel_by_handle(func);
    return simdev_launch(k, gridDim, blockDim, args, sharedMem, stream, 1);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    return simdev_launch_ex(config, func, args, 1);
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    return simdev_malloc_async(devPtr, size, hStream, 1);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    return simdev_free_async(devPtr, hStream, 1);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    return simdev_stream_begin_capture(stream, mode, 1);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    return simdev_stream_end_capture(stream, pGraph, 1);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus *captureStatus_out,
                                     unsigned long long *id_out, cudaGraph_t *graph_out,
                                     const cudaGraphNode_t **dependencies_out,
                                     const cudaGraphEdgeData **edgeData_out,
                                     size_t *numDependencies_out)
{
    return simdev_stream_capture_info(stream, 1, captureStatus_out, id_out, graph_out,
                                      dependencies_out, edgeData_out, numDependencies_out,
                                      "cudaStreamGetCaptureInfo");
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    return simdev_graph_launch(graphExec, stream, 1);
}
