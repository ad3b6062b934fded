/* capture.c -- CUDA graph capture: what the watchdog must not touch, and how
 * the collectives of a captured graph are watched instead.
 *
 * While a stream is being captured (cudaStreamBeginCapture ...
 * cudaStreamEndCapture, and every stream that joins the capture by waiting
 * for one of its events) the work issued to it does not run: it becomes nodes
 * of a graph.  An event recorded there is a node too, and cudaEventQuery on it
 * returns cudaErrorCapturedEvent and invalidates the capture.  PyTorch
 * captures NCCL collectives exactly in the pattern the watch-list looks for
 * (event recorded on the NCCL stream, waited for by the compute stream), so:
 *
 *  - captures_active counts the captures begun through this library and not
 *    yet ended.  While it is non-zero, a record on an NCCL stream asks the
 *    runtime whether the stream is capturing (cudaStreamGetCaptureInfo); if
 *    so, the event is never put on the watch-list, and a watch of its earlier
 *    record is cleared under the watchdog's lock (event_watch.c), so the
 *    watchdog cannot be between reading the slot and querying it.
 *  - The watchdog thread puts itself in cudaStreamCaptureModeRelaxed
 *    (watchdog.c), so its queries of other events are never "potentially
 *    unsafe" calls that a global-mode capture on another thread forbids.
 *
 * The collectives inside a graph run when the graph is launched, where no
 * application event follows them on an NCCL stream.  An NCCL call made on a
 * capturing stream marks the graph being captured (cudaStreamGetCaptureInfo
 * names it) as one with collectives; cudaGraphInstantiate* of such a graph
 * marks the executable graph; and after each cudaGraphLaunch of a marked
 * executable graph the library records an event of its own (one per launch
 * stream, re-recorded at every launch) on the launch stream and watches it
 * like an event behind an NCCL kernel (event_watch_on_graph_launch).  A
 * collective that hangs inside the graph therefore becomes a JIT event after
 * the hang timeout, measured from the launch.  The whole graph's work counts
 * against that timeout, not only its collectives.
 *
 * The tables are small handle sets (handle_set.c): a launch looks its graph
 * up without a lock, and a record or an NCCL call only reads captures_active
 * unless a capture is under way. */

#define _GNU_SOURCE
#include "interpose.h"

#define ORIGINS_MAX 64
#define GRAPHS_MAX 256
#define LAUNCH_EVENTS_MAX 64

_Atomic int captures_active;

/* Handle sets (handle_set.c): lookups lock-free, changes under set_lock. */
static pthread_mutex_t set_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(uintptr_t) origin_items[ORIGINS_MAX], graph_items[GRAPHS_MAX], exec_items[GRAPHS_MAX];
static struct handle_set origins = HANDLE_SET(origin_items, &set_lock, "concurrent graph captures");
static struct handle_set graphs = HANDLE_SET(graph_items, &set_lock, "graphs with collectives");
static struct handle_set execs = HANDLE_SET(exec_items, &set_lock, "executable graphs with collectives");

/* The library's own launch events, one per launch stream. */
static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t stream;
    cudaEvent_t event;
} launch_events[LAUNCH_EVENTS_MAX];

/* ---- capture state --------------------------------------------------------- */

/* Called before the capture begins, so that a record on a stream that has
 * just started capturing is never mistaken for a plain one; undone by
 * capture_abandoned if it does not begin.  A capture that does not fit the
 * table keeps captures_active above zero for good, which only costs a
 * cudaStreamGetCaptureInfo per NCCL record.  Returns what capture_abandoned
 * needs. */
int capture_began(cudaStream_t stream, int ptds)
{
    int added = handle_set_add(&origins, stream_canon(stream, ptds));
    atomic_fetch_add(&captures_active, 1);
    return added;
}

/* The capture did not begin (e.g. the stream was already capturing: then its
 * entry belongs to the capture under way and stays). */
void capture_abandoned(cudaStream_t stream, int ptds, int began)
{
    if (began > 0)
        handle_set_remove(&origins, stream_canon(stream, ptds));
    atomic_fetch_sub(&captures_active, 1);
}

/* Called once the capture has ended. */
void capture_ended(cudaStream_t stream, int ptds)
{
    if (handle_set_remove(&origins, stream_canon(stream, ptds)))
        atomic_fetch_sub(&captures_active, 1);
}

/* The graph `stream` is capturing into; 0 if it is not capturing, 1 if it is
 * but the runtime cannot tell which graph (then: assume capturing). */
static uintptr_t capturing_graph(cudaStream_t stream, int ptds)
{
    __typeof__(cudaStreamGetCaptureInfo) *info = forward_fn(&next_cudaStreamGetCaptureInfo);
    if (info == NULL)
        return 1;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = NULL;
    cudaStream_t canon = (cudaStream_t)stream_canon(stream, ptds);
    if (info(canon, &status, NULL, &graph, NULL, NULL, NULL) != cudaSuccess)
        return 1;
    if (status == cudaStreamCaptureStatusNone)
        return 0;
    return graph != NULL ? (uintptr_t)graph : 1;
}

int capture_stream_is_capturing_slow(cudaStream_t stream, int ptds)
{
    return capturing_graph(stream, ptds) != 0;
}

void capture_nccl_call_slow(cudaStream_t stream)
{
    uintptr_t graph = capturing_graph(stream, 0);
    if (graph <= 1)
        return;
    handle_set_add(&graphs, graph);
}

/* ---- graphs with collectives ------------------------------------------------ */

void capture_graph_instantiated(cudaGraphExec_t exec, cudaGraph_t graph)
{
    if (handle_set_has(&graphs, (uintptr_t)graph))
        handle_set_add(&execs, (uintptr_t)exec);
}

void capture_graph_forget(cudaGraph_t graph)
{
    handle_set_remove(&graphs, (uintptr_t)graph);
}

void capture_exec_forget(cudaGraphExec_t exec)
{
    handle_set_remove(&execs, (uintptr_t)exec);
}

/* The library's own event for launches on `stream`, created on first use. */
static cudaEvent_t launch_event(cudaStream_t stream, int ptds)
{
    uintptr_t canon = stream_canon(stream, ptds);
    cudaEvent_t event = NULL;
    pthread_mutex_lock(&event_lock);
    int free_slot = -1;
    for (int i = 0; i < LAUNCH_EVENTS_MAX && event == NULL; i++) {
        if (launch_events[i].stream == canon)
            event = launch_events[i].event;
        else if (launch_events[i].stream == 0 && free_slot < 0)
            free_slot = i;
    }
    if (event == NULL && free_slot >= 0) {
        __typeof__(cudaEventCreateWithFlags) *create = forward_fn(&next_cudaEventCreateWithFlags);
        if (create != NULL && create(&event, cudaEventDisableTiming) == cudaSuccess) {
            launch_events[free_slot].stream = canon;
            launch_events[free_slot].event = event;
        } else {
            event = NULL;
        }
    } else if (event == NULL) {
        count(&counters.untracked);
    }
    pthread_mutex_unlock(&event_lock);
    return event;
}

/* cudaStreamDestroy: the stream's launch event goes with it. */
void capture_stream_destroyed(cudaStream_t stream)
{
    uintptr_t canon = stream_canon(stream, 0);
    cudaEvent_t event = NULL;
    pthread_mutex_lock(&event_lock);
    for (int i = 0; i < LAUNCH_EVENTS_MAX; i++)
        if (launch_events[i].stream == canon) {
            event = launch_events[i].event;
            launch_events[i].stream = 0;
            launch_events[i].event = NULL;
        }
    pthread_mutex_unlock(&event_lock);
    if (handle_set_remove(&origins, canon))
        atomic_fetch_sub(&captures_active, 1);     /* destroyed while capturing */
    if (event != NULL) {
        event_watch_on_destroy(event);      /* the watchdog lets go of it first */
        __typeof__(cudaEventDestroy) *destroy = forward_fn(&next_cudaEventDestroy);
        if (destroy != NULL)
            destroy(event);
    }
}

/* After a successful cudaGraphLaunch: if the graph captured collectives, an
 * event of the library's own is recorded on the launch stream and watched. */
void capture_graph_launched(cudaGraphExec_t exec, cudaStream_t stream, int ptds,
                            __typeof__(cudaEventRecord) *record)
{
    if (record == NULL || !handle_set_has(&execs, (uintptr_t)exec))
        return;
    /* Launched into a capture, the graph is a node of another graph: nothing runs yet. */
    if (atomic_load(&captures_active) && capture_stream_is_capturing_slow(stream, ptds))
        return;
    cudaEvent_t event = launch_event(stream, ptds);
    if (event == NULL)
        return;
    event_watch_on_graph_launch(event, stream, ptds);  /* before the record: see event_watch.c */
    if (record(event, stream) == cudaSuccess)
        count(&counters.graph_launches);
    watchdog_start_once();
}
