/* graphs.c -- CUDA graphs and stream capture in transparent mode
 * (proxy_server/README.md, "API coverage").
 *
 * Capture, instantiation and launches run in the proxy through the generated
 * stubs; graphs and executable graphs are virtual handles.  What the worker
 * adds:
 *   - while a capture is under way, every call waits for its answer (the
 *     asynchronous ring would report a call's capture error at a later call);
 *   - the first capture turns transparent recovery off for the job, with the
 *     reason: captured work bypasses the call log, so a replay could not redo
 *     what a graph launch did;
 *   - a proxy restart with graphs alive stops with the reason (restart.c):
 *     it does not re-capture them;
 *   - a capture begun in global or thread-local mode ends only on the thread
 *     that began it (cudaErrorStreamCaptureWrongThread, told here: the proxy
 *     runs every call on one thread);
 *   - cudaStreamGetCaptureInfo crosses as status, id, graph and the number of
 *     dependencies; the dependency node arrays cannot (refused by name). */

#include "remote.h"
#include "track.h"

#include <pthread.h>

static int capturing;            /* captures under way in the proxy (atomic) */

/* The captures under way: their stream (as the proxy sees it), thread and mode. */
#define MAX_CAPTURES 64
struct capture { cudaStream_t stream; pthread_t thread; enum cudaStreamCaptureMode mode; };
static struct capture captures[MAX_CAPTURES];
static int ncaptures;
static pthread_mutex_t captures_mu = PTHREAD_MUTEX_INITIALIZER;
static long live_graphs;         /* graphs and executable graphs alive (under the call lock) */

int remote_capturing_now(void)
{
    return __atomic_load_n(&capturing, __ATOMIC_RELAXED) > 0;
}

long remote_live_graphs(void)
{
    return live_graphs;
}

void remote_track_cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    __atomic_add_fetch(&capturing, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&captures_mu);
    if (ncaptures < MAX_CAPTURES)
        captures[ncaptures++] = (struct capture){stream, pthread_self(), mode};
    pthread_mutex_unlock(&captures_mu);
    remote_recovery_off("graphs", "the program captures CUDA graphs, whose work bypasses the call log (a replay "
                        "could not redo what a graph launch did)");
}

/* Before cudaStreamEndCapture: the error when this thread may not end the capture, or -1. */
int remote_capture_end_check(cudaStream_t stream)
{
    stream = remote_stream(stream);
    int ret = -1;
    pthread_mutex_lock(&captures_mu);
    for (int i = 0; i < ncaptures; i++)
        if (captures[i].stream == stream && captures[i].mode != cudaStreamCaptureModeRelaxed &&
            !pthread_equal(captures[i].thread, pthread_self()))
            ret = cudaErrorStreamCaptureWrongThread;
    pthread_mutex_unlock(&captures_mu);
    return ret;
}

/* After every cudaStreamEndCapture that reached the proxy: it ends the capture
 * unless there was none; a failed one hands back no graph, as the runtime's. */
void remote_capture_ended(cudaStream_t stream, cudaError_t ret, cudaGraph_t *pGraph)
{
    if (ret != cudaSuccess && pGraph != NULL)
        *pGraph = NULL;
    if (ret == cudaErrorIllegalState || ret == cudaErrorInvalidResourceHandle || ret == cudaErrorInvalidValue)
        return;
    pthread_mutex_lock(&captures_mu);
    for (int i = 0; i < ncaptures; i++)
        if (captures[i].stream == stream) {
            captures[i] = captures[--ncaptures];
            break;
        }
    pthread_mutex_unlock(&captures_mu);
    int n = __atomic_load_n(&capturing, __ATOMIC_SEQ_CST);
    while (n > 0 && !__atomic_compare_exchange_n(&capturing, &n, n - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
}

void remote_track_cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    (void)stream;
    if (pGraph && *pGraph)
        live_graphs++;
}

void remote_track_cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
    (void)graph; (void)flags;
    if (pGraphExec && *pGraphExec)
        live_graphs++;
}

void remote_track_cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                unsigned long long flags)
{
    remote_track_cudaGraphInstantiate(pGraphExec, graph, flags);
}

void remote_track_cudaGraphExecDestroy(cudaGraphExec_t graphExec) { (void)graphExec; live_graphs--; }
void remote_track_cudaGraphDestroy(cudaGraph_t graph) { (void)graph; live_graphs--; }

EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
                                            unsigned long long *id_out, cudaGraph_t *graph_out,
                                            const cudaGraphNode_t **dependencies_out,
                                            const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    if (captureStatus_out == NULL)
        return cudaErrorInvalidValue;
    stream = remote_stream(stream);
    struct rcall c;
    if (remote_begin(&c, RFN_cudaStreamGetCaptureInfo) != 0)
        return remote_unavailable();
    rc_put_handle(&c, stream);
    cudaError_t err = (cudaError_t)remote_call(&c);
    int32_t status = 0;
    uint64_t id = 0, num = 0;
    void *graph = NULL;
    if (err == cudaSuccess && rc_get(&c, &status, sizeof status) == 0 && rc_get(&c, &id, sizeof id) == 0) {
        rc_get_handle(&c, &graph);
        rc_get(&c, &num, sizeof num);
    }
    remote_end(&c);
    if (err != cudaSuccess)
        return err;
    if ((dependencies_out || edgeData_out) && status == cudaStreamCaptureStatusActive && num > 0)
        return remote_refuse_call("cudaStreamGetCaptureInfo", "dependencies_out or edgeData_out of an active capture "
                                  "(graph node handles)");
    *captureStatus_out = (enum cudaStreamCaptureStatus)status;
    if (id_out)
        *id_out = id;
    if (graph_out)
        *graph_out = (cudaGraph_t)graph;
    if (dependencies_out)
        *dependencies_out = NULL;
    if (edgeData_out)
        *edgeData_out = NULL;
    if (numDependencies_out)
        *numDependencies_out = (size_t)num;
    return cudaSuccess;
}
