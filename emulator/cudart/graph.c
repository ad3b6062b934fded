/* graph.c -- stream capture and CUDA graphs, the part the project needs.
 *
 * cudaStreamBeginCapture puts a stream in capture mode: the work then pushed
 * into it is not run but recorded, in issue order, into a graph, which
 * cudaStreamEndCapture returns.  Another stream joins the capture by waiting
 * (cudaStreamWaitEvent) for an event recorded in it, the fork/join pattern
 * PyTorch uses to capture NCCL collectives on their own stream.  A graph is
 * instantiated and launched onto a stream, where its nodes run in the order
 * they were captured (a valid order of the graph: every dependency was issued
 * before what depends on it), as ordinary stream work.
 *
 * The rules a GPU enforces that matter to a watchdog are enforced here too:
 *  - an event last recorded in a capturing stream is a graph node, not a
 *    marker on a stream: cudaEventQuery and cudaEventSynchronize on it return
 *    cudaErrorCapturedEvent, and while the capture runs they invalidate it;
 *  - cudaStreamSynchronize, cudaStreamQuery and synchronous copies on a
 *    capturing stream fail with cudaErrorStreamCaptureUnsupported and
 *    invalidate the capture;
 *  - a capturing stream may not wait for an unfinished event recorded outside
 *    the capture (cudaErrorStreamCaptureIsolation, which invalidates it);
 *  - an invalidated capture ends with cudaErrorStreamCaptureInvalidated and
 *    a NULL graph; one not in relaxed mode must end on the thread that began
 *    it (cudaErrorStreamCaptureWrongThread).
 * Not emulated: the "potentially unsafe" calls that a global-mode capture
 * forbids on other threads (cudaThreadExchangeStreamCaptureMode only records
 * the thread's mode), the check that every forked stream joined back,
 * graph construction and update by API, child graphs, conditional nodes.
 *
 * A captured node keeps its arguments until the graph is destroyed, so a
 * graph with NCCL operations holds its communicator until then: destroy the
 * graph (and its executable graphs) before ncclCommDestroy.
 *
 * Everything here is guarded by simdev_lock. */

#include <stdlib.h>

#include "simdev.h"

struct simdev_capture {
    struct simdev_capture *next;        /* active captures */
    unsigned long long id;
    enum cudaStreamCaptureMode mode;
    struct simdev_stream *origin;
    pthread_t thread;
    int invalidated;
    struct simdev_graph *graph;         /* being captured */
};

struct simdev_graph {
    struct simdev_graph *next_handle;
    struct simdev_op **nodes;           /* in capture order; each owns its references */
    size_t n, cap;
    int refs;                           /* handle, executable graphs, launched nodes */
};

struct simdev_graph_exec {
    struct simdev_graph_exec *next_handle;
    struct simdev_graph *graph;
};

/* One launched node: runs the graph's node, keeps the graph alive meanwhile. */
struct launched_node {
    struct simdev_graph *graph;
    struct simdev_op *node;
};

static struct simdev_capture *captures;
static struct simdev_graph *graphs;
static struct simdev_graph_exec *execs;
static unsigned long long next_capture_id = 1;
static __thread enum cudaStreamCaptureMode tls_capture_mode = cudaStreamCaptureModeGlobal;

/* ---- graphs -------------------------------------------------------------- */

static void graph_unref_locked(struct simdev_graph *g)
{
    if (--g->refs > 0)
        return;
    for (size_t i = 0; i < g->n; i++)
        simdev_op_discard_locked(g->nodes[i]);     /* may drop and retake the lock */
    free(g->nodes);
    free(g);
}

static int graph_append(struct simdev_graph *g, struct simdev_op *op)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        struct simdev_op **nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (!nodes)
            return 0;
        g->nodes = nodes;
        g->cap = cap;
    }
    op->next = NULL;
    g->nodes[g->n++] = op;
    return 1;
}

static struct simdev_graph *graph_resolve_locked(cudaGraph_t handle)
{
    for (struct simdev_graph *g = graphs; g; g = g->next_handle)
        if ((cudaGraph_t)g == handle)
            return g;
    simdev_trace("graph handle %p is not a live graph", (void *)handle);
    return NULL;
}

/* ---- captures ------------------------------------------------------------ */

static struct simdev_capture *capture_by_id_locked(unsigned long long id)
{
    for (struct simdev_capture *c = captures; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

void simdev_capture_invalidate_locked(struct simdev_capture *c)
{
    if (c && !c->invalidated) {
        c->invalidated = 1;
        simdev_trace("capture sequence %llu invalidated", c->id);
    }
}

void simdev_capture_invalidate_id_locked(unsigned long long id)
{
    simdev_capture_invalidate_locked(capture_by_id_locked(id));
}

unsigned long long simdev_capture_id_locked(const struct simdev_capture *c)
{
    return c ? c->id : 0;
}

cudaError_t simdev_capture_add_locked(struct simdev_stream *s, struct simdev_op *op,
                                      const struct simdev_fault_hit *hit, int wants_wait)
{
    struct simdev_capture *c = s->capture;
    cudaError_t err = cudaSuccess;
    if (c->invalidated)
        err = cudaErrorStreamCaptureInvalidated;
    else if (wants_wait) {
        simdev_trace("%s: a synchronous call on a capturing stream", op->name);
        simdev_capture_invalidate_locked(c);
        err = cudaErrorStreamCaptureUnsupported;
    }
    if (err != cudaSuccess || op->kind == SIMDEV_OP_WAIT_STREAM || op->kind == SIMDEV_OP_WAIT_EVENT) {
        /* Waits between streams of one capture are dependencies that the
         * capture order already respects. */
        simdev_op_discard_locked(op);
        return err;
    }
    if (hit && (hit->kind == SIMDEV_FAULT_HANG || hit->kind == SIMDEV_FAULT_SLOW)) {
        struct simdev_op *f = simdev_op_new(hit->kind == SIMDEV_FAULT_HANG ? SIMDEV_OP_HANG
                                                                           : SIMDEV_OP_DELAY,
                                            "injected fault");
        if (f) {
            f->delay_ms = hit->delay_ms;
            if (!graph_append(c->graph, f))
                free(f);
        }
    }
    if (!graph_append(c->graph, op)) {
        simdev_op_discard_locked(op);
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

cudaError_t simdev_capture_join_locked(struct simdev_stream *s, unsigned long long id)
{
    struct simdev_capture *c = capture_by_id_locked(id);
    if (!c)
        return cudaErrorStreamCaptureIsolation;     /* that capture has ended */
    if (s->capture == c)
        return c->invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    if (s->capture) {
        simdev_capture_invalidate_locked(s->capture);
        simdev_capture_invalidate_locked(c);
        return cudaErrorStreamCaptureMerge;
    }
    if (s->role == SIMDEV_STREAM_LEGACY) {
        simdev_capture_invalidate_locked(c);
        return cudaErrorStreamCaptureImplicit;
    }
    if (c->invalidated)
        return cudaErrorStreamCaptureInvalidated;
    s->capture = c;
    return cudaSuccess;
}

/* The start of a capture call on `stream`: enters the API, checks that the
 * required output pointer is there, and resolves the stream.  On success it
 * returns with simdev_lock held; otherwise the caller returns
 * simdev_return(error) at once. */
static cudaError_t enter_on_stream(const char *op, const void *required, cudaStream_t stream,
                                   int ptds, struct simdev_stream **s)
{
    cudaError_t err = simdev_enter(op, NULL);
    if (err == cudaSuccess && !required)
        err = cudaErrorInvalidValue;
    if (err != cudaSuccess)
        return err;
    pthread_mutex_lock(&simdev_lock);
    err = simdev_stream_resolve_locked(stream, ptds, s);
    if (err != cudaSuccess)
        pthread_mutex_unlock(&simdev_lock);
    return err;
}

static cudaError_t check_mode(enum cudaStreamCaptureMode mode)
{
    return mode == cudaStreamCaptureModeGlobal || mode == cudaStreamCaptureModeThreadLocal ||
                   mode == cudaStreamCaptureModeRelaxed
               ? cudaSuccess
               : cudaErrorInvalidValue;
}

cudaError_t simdev_stream_begin_capture(cudaStream_t stream, enum cudaStreamCaptureMode mode,
                                        int ptds)
{
    struct simdev_stream *s;
    cudaError_t err = check_mode(mode);
    if (err == cudaSuccess)
        err = enter_on_stream("cudaStreamBeginCapture", &mode, stream, ptds, &s);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (s->role == SIMDEV_STREAM_LEGACY)
        err = cudaErrorStreamCaptureUnsupported;      /* the legacy stream cannot capture */
    else if (s->capture)
        err = cudaErrorIllegalState;
    struct simdev_capture *c = NULL;
    if (err == cudaSuccess) {
        c = calloc(1, sizeof *c);
        struct simdev_graph *g = calloc(1, sizeof *g);
        if (!c || !g) {
            free(c);
            free(g);
            err = cudaErrorMemoryAllocation;
        } else {
            g->refs = 1;
            c->graph = g;
            c->id = next_capture_id++;
            c->mode = mode;
            c->origin = s;
            c->thread = pthread_self();
            c->next = captures;
            captures = c;
            s->capture = c;
        }
    }
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t simdev_stream_end_capture(cudaStream_t stream, cudaGraph_t *pGraph, int ptds)
{
    struct simdev_stream *s;
    cudaError_t err = enter_on_stream("cudaStreamEndCapture", pGraph, stream, ptds, &s);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_capture *c = s->capture;
    if (!c)
        err = cudaErrorIllegalState;
    else if (c->origin != s)
        err = cudaErrorStreamCaptureUnmatched;
    else if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self()))
        err = cudaErrorStreamCaptureWrongThread;
    if (err != cudaSuccess) {
        pthread_mutex_unlock(&simdev_lock);
        return simdev_return(err);
    }
    /* Every stream of the capture leaves capture mode. */
    for (int d = 0; d < SIMDEV_MAX_DEVICES; d++)
        for (struct simdev_stream *t = simdev_devices[d].streams; t; t = t->next_on_device)
            if (t->capture == c)
                t->capture = NULL;
    for (struct simdev_capture **pp = &captures; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    struct simdev_graph *g = c->graph;
    if (c->invalidated) {
        *pGraph = NULL;
        graph_unref_locked(g);
        err = cudaErrorStreamCaptureInvalidated;
    } else {
        g->next_handle = graphs;
        graphs = g;
        *pGraph = (cudaGraph_t)g;
    }
    free(c);
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t simdev_stream_capture_info(cudaStream_t stream, int ptds,
                                       enum cudaStreamCaptureStatus *status,
                                       unsigned long long *id, cudaGraph_t *graph,
                                       const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                       size_t *ndeps, const char *op)
{
    struct simdev_stream *s;
    cudaError_t err = enter_on_stream(op, status, stream, ptds, &s);
    if (err != cudaSuccess)
        return simdev_return(err);
    struct simdev_capture *c = s->capture;
    *status = !c ? cudaStreamCaptureStatusNone
                 : c->invalidated ? cudaStreamCaptureStatusInvalidated
                                  : cudaStreamCaptureStatusActive;
    if (c) {
        if (id)
            *id = c->id;
        if (graph)
            *graph = (cudaGraph_t)c->graph;
        if (deps)
            *deps = NULL;       /* dependencies are not tracked: nodes run in capture order */
        if (edges)
            *edges = NULL;
        if (ndeps)
            *ndeps = 0;
    }
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    cudaError_t err = simdev_enter("cudaThreadExchangeStreamCaptureMode", NULL);
    if (err == cudaSuccess && (!mode || check_mode(*mode) != cudaSuccess))
        err = cudaErrorInvalidValue;
    if (err == cudaSuccess) {
        enum cudaStreamCaptureMode previous = tls_capture_mode;
        tls_capture_mode = *mode;
        *mode = previous;
    }
    return simdev_return(err);
}

/* ---- executable graphs and their launch ----------------------------------- */

static cudaError_t instantiate(cudaGraphExec_t *pExec, cudaGraph_t graph, const char *op)
{
    cudaError_t err = simdev_enter(op, NULL);
    if (err == cudaSuccess && !pExec)
        err = cudaErrorInvalidValue;
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_graph *g = graph_resolve_locked(graph);
    struct simdev_graph_exec *x = g ? calloc(1, sizeof *x) : NULL;
    if (!g)
        err = cudaErrorInvalidValue;
    else if (!x)
        err = cudaErrorMemoryAllocation;
    else {
        x->graph = g;
        g->refs++;
        x->next_handle = execs;
        execs = x;
        *pExec = (cudaGraphExec_t)x;
    }
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags)
{
    return instantiate(pGraphExec, graph, "cudaGraphInstantiate");
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                          unsigned long long flags)
{
    return instantiate(pGraphExec, graph, "cudaGraphInstantiateWithFlags");
}

static void run_launched(void *arg)
{
    struct launched_node *l = arg;
    l->node->fn(l->node->arg);
}

static void release_launched(void *arg)
{
    struct launched_node *l = arg;
    pthread_mutex_lock(&simdev_lock);
    graph_unref_locked(l->graph);
    pthread_mutex_unlock(&simdev_lock);
    free(l);
}

/* A stream op that carries out one node of g on the launch stream. */
static struct simdev_op *launch_op_locked(struct simdev_graph *g, struct simdev_op *node)
{
    struct simdev_op *op = simdev_op_new(node->kind, node->name);
    if (!op)
        return NULL;
    switch (node->kind) {
    case SIMDEV_OP_CALL: {
        struct launched_node *l = malloc(sizeof *l);
        if (!l) {
            free(op);
            return NULL;
        }
        l->graph = g;
        l->node = node;
        g->refs++;
        op->fn = run_launched;
        op->arg = l;
        op->release = release_launched;
        break;
    }
    case SIMDEV_OP_RECORD_EVENT:
        op->event = node->event;
        op->event->refs++;
        op->event_gen = node->event->recorded + 1;
        break;
    default:                    /* an injected hang or delay */
        op->delay_ms = node->delay_ms;
        break;
    }
    return op;
}

cudaError_t simdev_graph_launch(cudaGraphExec_t exec, cudaStream_t stream, int ptds)
{
    struct simdev_fault_hit hit;
    cudaError_t err = simdev_enter("cudaGraphLaunch", &hit);
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_graph_exec *x = execs;
    while (x && (cudaGraphExec_t)x != exec)
        x = x->next_handle;
    struct simdev_stream *s = NULL;
    if (!x)
        err = cudaErrorInvalidValue;
    else
        err = simdev_stream_resolve_locked(stream, ptds, &s);
    if (err == cudaSuccess && s->capture)
        err = cudaErrorStreamCaptureUnsupported;    /* child graphs are not emulated */
    const struct simdev_fault_hit *first = &hit;
    for (size_t i = 0; err == cudaSuccess && i < x->graph->n; i++) {
        struct simdev_op *node = x->graph->nodes[i];
        struct simdev_op *op = launch_op_locked(x->graph, node);
        err = simdev_stream_submit_locked(stream, ptds, op, first, NULL, NULL);
        first = NULL;
        if (err == cudaSuccess && node->kind == SIMDEV_OP_RECORD_EVENT) {
            node->event->recorded++;
            node->event->captured_id = 0;    /* now recorded on a stream, by the launch */
        }
    }
    if (err == cudaSuccess && x->graph->n == 0 && first != NULL && hit.kind != SIMDEV_FAULT_NONE) {
        struct simdev_op *nop = simdev_op_new(SIMDEV_OP_DELAY, "empty graph");
        err = simdev_stream_submit_locked(stream, ptds, nop, first, NULL, NULL);
    }
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    return simdev_graph_launch(graphExec, stream, 0);
}

/* Unlinks an executable graph or a graph handle and drops its reference. */
static cudaError_t destroy_handle(const void *handle, int is_exec, const char *op)
{
    cudaError_t err = simdev_enter(op, NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    pthread_mutex_lock(&simdev_lock);
    struct simdev_graph *g = NULL;
    if (is_exec) {
        for (struct simdev_graph_exec **pp = &execs; *pp; pp = &(*pp)->next_handle)
            if ((const void *)*pp == handle) {
                struct simdev_graph_exec *x = *pp;
                *pp = x->next_handle;
                g = x->graph;
                free(x);
                break;
            }
    } else {
        for (struct simdev_graph **pp = &graphs; *pp; pp = &(*pp)->next_handle)
            if ((const void *)*pp == handle) {
                g = *pp;
                *pp = g->next_handle;
                break;
            }
    }
    if (g)
        graph_unref_locked(g);
    else
        err = cudaErrorInvalidValue;
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(err);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    return destroy_handle(graphExec, 1, "cudaGraphExecDestroy");
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    return destroy_handle(graph, 0, "cudaGraphDestroy");
}

/* ---- plain entry points (the _ptsz twins are in ptds.c) -------------------- */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    return simdev_stream_begin_capture(stream, mode, 0);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    return simdev_stream_end_capture(stream, pGraph, 0);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus *captureStatus_out,
                                     unsigned long long *id_out, cudaGraph_t *graph_out,
                                     const cudaGraphNode_t **dependencies_out,
                                     const cudaGraphEdgeData **edgeData_out,
                                     size_t *numDependencies_out)
{
    return simdev_stream_capture_info(stream, 0, captureStatus_out, id_out, graph_out,
                                      dependencies_out, edgeData_out, numDependencies_out,
                                      "cudaStreamGetCaptureInfo");
}
