/* graphs.c -- the proxy's half of cudaStreamGetCaptureInfo
 * (interpose/remote/graphs.c): a stream id -> i32 status, u64 id, the graph
 * being built as a virtual id (0: none), u64 number of dependencies. */

#include "dispatch.h"

int32_t dispatch_capture_info(struct rdisp *d)
{
    static __typeof__(cudaStreamGetCaptureInfo) *real;
    if (!real && (real = (__typeof__(cudaStreamGetCaptureInfo) *)proxy_sym(cudart, "cudaStreamGetCaptureInfo")) == NULL)
        return cudaErrorSymbolNotFound;
    uint64_t vid;
    void *stream;
    if (rd_get_handle(d, VH_STREAM, &vid, &stream))
        return cudaErrorInvalidResourceHandle;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaGraph_t graph = NULL;
    const cudaGraphNode_t *deps = NULL;
    size_t num = 0;
    cudaError_t err = real((cudaStream_t)stream, &status, &id, &graph, &deps, NULL, &num);
    if (err != cudaSuccess)
        return err;
    int32_t s = status;
    uint64_t i = id, n = num;
    rd_put(d, &s, sizeof s);
    rd_put(d, &i, sizeof i);
    rd_put_new_handle(d, VH_GRAPH, graph);
    rd_put(d, &n, sizeof n);
    return 0;
}
