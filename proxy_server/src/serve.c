/* serve.c -- the proxy's loop: drain the request ring, execute each record
 * in order, answer the synchronous ones.  End-of-file on the socket means
 * the worker is gone; the loop returns and the proxy exits.
 *
 * Records are executed one at a time on this one thread, in ring order,
 * which is the order the worker made the calls (per-stream order included).
 * Each record is copied into a private buffer first, so a request is parsed
 * from memory the worker cannot change under the proxy.  After a record the
 * proxy publishes ring_tail (and releases the arena up to the record's
 * arena_end); for a synchronous record the answer (ret, response) is in the
 * segment before ring_tail passes it.
 *
 * Errors of asynchronous records: the first one (per library: CUDA runtime,
 * NCCL) is kept and returned by the next synchronous call of the same
 * library that would otherwise have succeeded (an API function: not the
 * library's own queries such as a launch's parameter sizes), as a GPU reports an
 * asynchronous error at the next synchronising call; it is reported once.
 * cudaGetLastError/cudaPeekAtLastError clear the kept CUDA error instead:
 * the runtime's own last error (set when the call failed in the proxy)
 * already carries it.  The runtime's state (sticky errors, last error) is the
 * proxy thread's, as before.
 *
 * Idle: a bounded spin (SPIN_NS), then sleep on the proxy_wake futex after
 * setting proxy_sleeping, which tells the worker to ring; every
 * CHECK_ALIVE_MS the sleeping proxy checks the socket for its worker. */

#include "dispatch.h"
#include "jitckpt_sticky.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NS 10000
#define CHECK_ALIVE_MS 100

static struct jitckpt_wire *shadow;       /* private: the record being executed, and its response */
static int32_t pending_cuda, pending_nccl;  /* first error of an asynchronous call, not yet returned */

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *timeout)
{
    return syscall(SYS_futex, addr, op, val, timeout, NULL, 0);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static int is_nccl(unsigned fn)
{
    return fn < RFN_count && dispatch_generated[fn].name && strncmp(dispatch_generated[fn].name, "nccl", 4) == 0;
}

static int32_t execute(struct jitckpt_wire *w, uint64_t arena_size, unsigned fn, uint32_t req_len)
{
    struct rdisp d = {.w = shadow, .arena = (unsigned char *)w + w->arena_offset, .arena_size = arena_size,
                      .req_len = req_len};
    int32_t ret;
    int handled = 0;
    if (fn == JITCKPT_RFN_MARK) {                       /* a minibatch marker (watch.c) */
        uint64_t index;
        if (rd_get(&d, &index, sizeof index) != 0)
            return RD_BAD;
        watch_mark(index);
        shadow->rep_len = 0;
        return 0;
    }
    if (fn == JITCKPT_RFN_REWIND) {                     /* dst, stamp, value, n (addr, bytes) pairs (watch.c) */
        uint64_t dst, stamp, value, r[2 * JITCKPT_REWIND_MAX_RANGES];
        uint32_t n;
        if (rd_get(&d, &dst, sizeof dst) != 0 || rd_get(&d, &stamp, sizeof stamp) != 0 ||
            rd_get(&d, &value, sizeof value) != 0 || rd_get(&d, &n, sizeof n) != 0 ||
            n > JITCKPT_REWIND_MAX_RANGES || rd_get(&d, r, 16u * n) != 0)
            return RD_BAD;
        shadow->rep_len = 0;
        return watch_rewind_save(dst, stamp, value, n, r);
    }
    ret = dispatch_special(fn, &d, &handled);
    if (!handled) {
        if (fn < RFN_count && dispatch_generated[fn].fn) {
            ret = dispatch_generated[fn].fn(&d);
            pdebug("%s -> %d", dispatch_generated[fn].name, ret);
        } else {
            plog("the worker sent unknown function id %u (is it built from the same sources?)", fn);
            ret = cudaErrorNotSupported;
        }
    }
    shadow->rep_len = (uint32_t)d.rep;
    return ret;
}

/* The last error of a call the proxy answered itself, not through the runtime
 * (an allocation in its reserved range, devmem.c): cudaGetLastError reports it,
 * as the runtime would its own. */
static int32_t own_error;

void proxy_note_error(int32_t err)
{
    if (err != 0)
        own_error = err;
}

/* The result a synchronous call returns, given the errors asynchronous calls left. */
static int32_t settle(unsigned fn, int32_t ret)
{
    /* Only an API function the program called: not the library's own queries
     * (a launch's parameter sizes, the restart protocol) nor registrations. */
    if (fn >= RFN_count || !dispatch_generated[fn].fn)
        return ret;
    int32_t *pending = is_nccl(fn) ? &pending_nccl : &pending_cuda;
    if (fn == RFN_cudaGetLastError || fn == RFN_cudaPeekAtLastError) {
        pending_cuda = 0;
        if (ret == 0)
            ret = own_error;
        if (fn == RFN_cudaGetLastError)
            own_error = 0;
        return ret;
    }
    if (ret == 0 && *pending != 0)
        ret = *pending;
    *pending = 0;
    return ret;
}

int32_t serve_take_pending(void)
{
    int32_t e = pending_cuda ? pending_cuda : pending_nccl;
    pending_cuda = pending_nccl = 0;
    return e;
}

/* A synchronous call whose answer would show the program a failure that
 * transparent recovery repairs (the worker asked for recovery:
 * recovery_on): ncclCommGetAsyncError reporting a peer's failure becomes
 * JITCKPT_RET_RECOVER, which the worker answers by recovering and making the
 * call again.  A successful ncclCommInitRank's communicator is watched. */
/* A cuBLAS or cuDNN call: the libraries report a lost context with a status of their own
 * (CUBLAS_STATUS_EXECUTION_FAILED, CUDNN_STATUS_EXECUTION_FAILED, ...). */
static int library_fn(unsigned fn)
{
    const char *n = fn < RFN_count ? dispatch_generated[fn].name : NULL;
    if (n)
        return strncmp(n, "cublas", 6) == 0 || strncmp(n, "cudnn", 5) == 0;
#ifdef JITCKPT_REMOTE_CUBLASLT
    if (fn == RFN_cublasLtMatmul)
        return 1;
#endif
#ifdef JITCKPT_REMOTE_CUDNN
    if (fn == RFN_cudnnBackendExecute)
        return 1;
#endif
    return 0;
}

/* The runtime's sticky error, if the context is lost (0 otherwise). */
static int32_t sticky_error(void)
{
    static __typeof__(cudaPeekAtLastError) *peek;
    if (peek == NULL)
        peek = (__typeof__(cudaPeekAtLastError) *)proxy_sym(cudart, "cudaPeekAtLastError");
    int32_t e = peek ? (int32_t)peek() : 0;
    return jitckpt_sticky_cuda_error(e) ? e : 0;
}

static int32_t recover_first(unsigned fn, int32_t ret, struct jitckpt_wire *w)
{
    /* a library call that failed because the context is lost: the worker recovers, as from the runtime's own
     * sticky error (the watcher may not have seen it yet) */
    if (ret != 0 && library_fn(fn) && __atomic_load_n(&w->recovery_on, __ATOMIC_SEQ_CST)) {
        int32_t e = sticky_error();
        if (e != 0) {
            if (w->device_error == 0)
                __atomic_store_n(&w->device_error, e, __ATOMIC_SEQ_CST);
            return JITCKPT_RET_RECOVER;
        }
    }
    if (ret == 0 && watch_is_comm_init(fn))
        watch_comm_created(shadow->rep, shadow->rep_len);
    if (ret == 0 && fn == RFN_ncclCommGetAsyncError && __atomic_load_n(&w->recovery_on, __ATOMIC_SEQ_CST) &&
        shadow->rep_len >= sizeof(int32_t)) {
        int32_t async;
        memcpy(&async, shadow->rep, sizeof async);
        if (async != ncclSuccess && async != ncclInProgress)
            return JITCKPT_RET_RECOVER;
    }
    return ret;
}

/* The worker: still there?  It writes to the socket only the descriptors of
 * its pinned memory, which are taken first (pinned.c): then the socket is
 * empty until end-of-file. */
static int worker_alive(int sock)
{
    pinned_receive();
    char b;
    ssize_t n = recv(sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        return 0;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return errno == ECONNRESET ? 0 : -1;
    return 1;
}

/* Waits for records (or the worker's end): 1 records, 0 the worker is gone, -1 error. */
static int wait_records(int sock, struct jitckpt_wire *w, uint64_t tail)
{
    /* Spin briefly (the next record of a burst comes within a microsecond),
     * then sleep: a longer spin costs more than it saves when both processes
     * share a core, as on a loaded 2-core machine. */
    uint64_t start = now_ns(), spent = 0;
    while (spent < SPIN_NS) {
        for (int i = 0; i < 64; i++) {
            if (__atomic_load_n(&w->ring_head, __ATOMIC_ACQUIRE) != tail)
                return 1;
            cpu_relax();
        }
        spent = now_ns() - start;
    }
    for (;;) {
        uint32_t seq = __atomic_load_n(&w->proxy_wake, __ATOMIC_SEQ_CST);
        __atomic_store_n(&w->proxy_sleeping, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&w->ring_head, __ATOMIC_SEQ_CST) != tail)
            break;
        struct timespec t = {0, CHECK_ALIVE_MS * 1000000L};
        futex(&w->proxy_wake, FUTEX_WAIT, seq, &t);
        if (__atomic_load_n(&w->ring_head, __ATOMIC_ACQUIRE) != tail)
            break;
        int alive = worker_alive(sock);
        if (alive <= 0) {
            __atomic_store_n(&w->proxy_sleeping, 0, __ATOMIC_SEQ_CST);
            return alive;
        }
    }
    __atomic_store_n(&w->proxy_sleeping, 0, __ATOMIC_SEQ_CST);
    return 1;
}

static void publish(struct jitckpt_wire *w, uint64_t tail, uint64_t arena_end)
{
    __atomic_store_n(&w->arena_tail, arena_end, __ATOMIC_RELEASE);
    __atomic_store_n(&w->ring_tail, tail, __ATOMIC_SEQ_CST);
    uint64_t want = __atomic_load_n(&w->worker_waits_for, __ATOMIC_SEQ_CST);
    if (want != 0 && tail >= want) {
        __atomic_add_fetch(&w->worker_wake, 1, __ATOMIC_SEQ_CST);
        futex(&w->worker_wake, FUTEX_WAKE, 1, NULL);
    }
}

static int broken(const char *what, uint64_t pos)
{
    plog("the worker wrote a malformed request ring (%s at position %llu); stopping", what,
         (unsigned long long)pos);
    return -1;
}

int serve(int sock, struct jitckpt_wire *w)
{
    /* Read once, before the worker can touch the segment. */
    const uint64_t arena_size = w->arena_size, ring_size = w->ring_size;
    const unsigned char *ring = (const unsigned char *)w + w->ring_offset;
    shadow = malloc(sizeof *shadow);
    if (!shadow)
        return -1;
    memcpy(shadow, w, offsetof(struct jitckpt_wire, ring_head));     /* the layout, for d->w's readers */
    pinned_set_socket(sock);
    watch_start(w);
    uint64_t tail = 0, arena_end = 0;
    for (;;) {
        uint64_t head = __atomic_load_n(&w->ring_head, __ATOMIC_ACQUIRE);
        if (head == tail) {
            int r = wait_records(sock, w, tail);
            if (r <= 0)
                return r;
            continue;
        }
        if (head - tail > ring_size)
            return broken("head too far ahead", head);
        uint64_t off = tail % ring_size;
        struct jitckpt_ring_rec rec;
        memcpy(&rec.len, ring + off, sizeof rec.len);
        if (rec.len == 0) {                                   /* continue at the ring's start */
            tail += ring_size - off;
            continue;
        }
        memcpy(&rec, ring + off, sizeof rec);
        if (rec.len % 8 || rec.len < sizeof rec || rec.len > ring_size - off || rec.len > head - tail ||
            rec.req_len > rec.len - sizeof rec || rec.req_len > JITCKPT_WIRE_REQ_MAX)
            return broken("bad record length", tail);
        if (rec.arena_end < arena_end)
            return broken("arena position going back", tail);
        memcpy(shadow->req, ring + off + sizeof rec, rec.req_len);
        int32_t ret;
        int dropped = watch_dropping(tail);             /* an abort covers it (watch.c) */
        if (!dropped) {
            watch_before(rec.fn);
            ret = execute(w, arena_size, rec.fn, rec.req_len);
            dropped = watch_record_dropped();
            if (!dropped)
                watch_after(rec.fn, ret);
        }
        if (dropped) {
            ret = JITCKPT_RET_DROPPED;
            shadow->rep_len = 0;
        } else if (rec.flags & JITCKPT_REC_SYNC) {
            ret = recover_first(rec.fn, ret, w);
        }
        if (dropped) {
            if (rec.flags & JITCKPT_REC_SYNC) {
                w->rep_len = 0;
                w->ret = ret;
            }
        } else if (rec.flags & JITCKPT_REC_SYNC) {
            ret = settle(rec.fn, ret);
            memcpy(w->rep, shadow->rep, shadow->rep_len);
            w->rep_len = shadow->rep_len;
            w->ret = ret;
        } else if (ret != 0) {
            int32_t *pending = is_nccl(rec.fn) ? &pending_nccl : &pending_cuda;
            if (*pending == 0)
                *pending = ret;
            pdebug("asynchronous call %u failed (%d): returned by the next synchronous call", rec.fn, ret);
        }
        tail += rec.len;
        arena_end = rec.arena_end;
        publish(w, tail, arena_end);
    }
}
