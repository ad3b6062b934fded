/* hostfn.c -- host functions in transparent mode: cudaLaunchHostFunc and
 * cudaStreamAddCallback (proxy_server/README.md, "Host functions").
 *
 * The program's function lives in this process, the stream in the proxy.  The
 * worker keeps (function, argument) under an id and sends only the id; the
 * proxy enqueues a function of its own on the real stream.  When the stream
 * reaches it, the proxy posts the id in the shared segment and its runtime
 * thread waits; a dispatcher thread here (started at the first host function)
 * takes the posting and runs the program's function on a thread of its own,
 * then marks the posting done, which lets the stream go on.  So the function
 * runs after the stream's earlier work, work queued after it waits for it, and
 * a function that blocks (waiting for the program's main thread, as host
 * functions may) blocks only its stream, as on a GPU.
 *
 * A minibatch holding a host function cannot be replayed (calllog.c): the
 * function would run a second time.  Host functions pending in a proxy that
 * dies are lost with it (the README says so). */

#include "remote.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { HOST_FUNC, STREAM_CALLBACK };

struct pending {
    struct pending *next;
    uint64_t id;
    int kind;
    cudaHostFn_t fn;
    cudaStreamCallback_t callback;
    void *data;
    cudaStream_t stream;           /* the program's (virtual) handle */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending *pending;
static uint64_t next_id = 1;
static pthread_once_t started = PTHREAD_ONCE_INIT;

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *timeout)
{
    return syscall(SYS_futex, addr, op, val, timeout, NULL, 0);
}

static struct pending *take(uint64_t id)
{
    pthread_mutex_lock(&mu);
    struct pending **p = &pending, *found = NULL;
    for (; *p; p = &(*p)->next)
        if ((*p)->id == id) {
            found = *p;
            *p = found->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    return found;
}

struct run { struct jitckpt_wire *w; struct pending *p; uint64_t seq; int32_t status; };

static void *run_one(void *arg)
{
    struct run *r = arg;
    if (r->p) {
        if (r->p->kind == HOST_FUNC)
            r->p->fn(r->p->data);
        else
            r->p->callback(r->p->stream, (cudaError_t)r->status, r->p->data);
    }
    uint32_t slot = (uint32_t)(r->seq % JITCKPT_WIRE_CB_SLOTS);
    __atomic_store_n(&r->w->cb_done[slot], r->seq + 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&r->w->cb_done_wake, 1, __ATOMIC_SEQ_CST);
    futex(&r->w->cb_done_wake, FUTEX_WAKE, 64, NULL);
    free(r->p);
    free(r);
    return NULL;
}

static void *dispatcher(void *arg)
{
    (void)arg;
    struct jitckpt_wire *seen = NULL;
    uint64_t taken = 0;
    for (;;) {
        struct jitckpt_wire *w = remote_wire();
        if (w != seen) {                   /* a new proxy: its postings count from 0 */
            seen = w;
            taken = 0;
        }
        if (w == NULL) {
            usleep(10000);
            continue;
        }
        uint32_t wake = __atomic_load_n(&w->cb_wake, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&w->cb_posted, __ATOMIC_ACQUIRE) == taken) {
            struct timespec t = {0, 100 * 1000000L};
            futex(&w->cb_wake, FUTEX_WAIT, wake, &t);
            continue;
        }
        uint32_t slot = (uint32_t)(taken % JITCKPT_WIRE_CB_SLOTS);
        struct run *r = malloc(sizeof *r);
        if (r == NULL) {
            usleep(1000);
            continue;
        }
        r->w = w;
        r->seq = taken++;
        r->status = w->cb_status[slot];
        r->p = take(w->cb_ids[slot]);      /* NULL: not ours (never happens); marked done all the same */
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, run_one, r) != 0)
            run_one(r);
        pthread_attr_destroy(&attr);
    }
    return NULL;
}

static void start_dispatcher(void)
{
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, dispatcher, NULL) != 0)
        rlog("cannot start the thread that runs host functions: they will not run");
    pthread_attr_destroy(&attr);
}

static cudaError_t enqueue(unsigned fn, struct pending *p, unsigned flags)
{
    pthread_once(&started, start_dispatcher);
    pthread_mutex_lock(&mu);
    p->id = next_id++;
    p->next = pending;
    pending = p;
    pthread_mutex_unlock(&mu);
    cudaStream_t stream = remote_stream(p->stream);     /* (the program's function gets its own handle) */
    struct rcall c;
    if (remote_begin(&c, fn) != 0) {
        free(take(p->id));
        return remote_unavailable();
    }
    rc_put_handle(&c, stream);
    rc_put(&c, &p->id, sizeof p->id);
    rc_put(&c, &flags, sizeof flags);
    uint64_t id = p->id;                   /* p may be run and freed as soon as the proxy has it */
    cudaError_t err = (cudaError_t)remote_call(&c);
    remote_end(&c);
    if (err != cudaSuccess)
        free(take(id));
    return err;
}

EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    if (fn == NULL)
        return cudaErrorInvalidValue;
    struct pending *p = calloc(1, sizeof *p);
    if (p == NULL)
        return cudaErrorMemoryAllocation;
    p->kind = HOST_FUNC;
    p->fn = fn;
    p->data = userData;
    p->stream = stream;
    return enqueue(RFN_cudaLaunchHostFunc, p, 0);
}

EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void *userData,
                                         unsigned int flags)
{
    if (callback == NULL)
        return cudaErrorInvalidValue;
    struct pending *p = calloc(1, sizeof *p);
    if (p == NULL)
        return cudaErrorMemoryAllocation;
    p->kind = STREAM_CALLBACK;
    p->callback = callback;
    p->data = userData;
    p->stream = stream;
    return enqueue(RFN_cudaStreamAddCallback, p, flags);
}
