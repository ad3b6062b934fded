/* client.c -- the worker's connection to its device proxy, and the call.
 *
 * At the first CUDA call the library connects to the Unix socket named by
 * JITCKPT_PROXY_SOCKET, receives the hello and the segment's file
 * descriptor (SCM_RIGHTS), maps the segment, and keeps the socket to learn
 * that the proxy is gone (end-of-file) and to hand pinned memory's
 * descriptors to the proxy (remote_send_fd, pinned.c).
 *
 * A call is marshalled into the staging area (marshal.c), then appended to
 * the request ring as one record.  An asynchronous call (remote_fn_async,
 * generated from api_facts.py's remote_async column) returns at once; a
 * synchronous one, and an asynchronous one that needs bytes back (a copy into
 * host memory), waits until the proxy has executed its record -- and so every
 * record before it -- and reads the answer.  Host bytes go into the arena,
 * allocated as a ring (wraparound; a call waits while the arena is full).
 *
 * Waiting: a short bounded spin, then a futex on worker_wake, which the
 * proxy bumps when ring_tail reaches worker_waits_for.  The proxy is woken
 * through proxy_wake only when it said it may sleep (proxy_sleeping), so a
 * burst of asynchronous calls costs no system call while the proxy is busy.
 *
 * Threads: one call lock serialises every call of every thread of the
 * worker, so the ring holds the calls in the order the program made them:
 * per-stream order is exact, and so is the order across threads (an event
 * recorded by one thread before another waits on it).  An uncontended lock
 * costs ~20 ns; one ring per thread would need cross-ring ordering for
 * events and the legacy stream, which the lock gives for free.
 *
 * A child forked from the worker has no proxy (fork_child below).
 *
 * Errors of asynchronous calls: the proxy keeps the first one and returns it
 * from the next synchronous call (proxy_server/src/serve.c).  A proxy that
 * is gone makes every later call fail with cudaErrorDevicesUnavailable,
 * said once on stderr. */

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "remote.h"

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int lock_held;         /* this thread holds call_lock (between remote_begin and remote_end) */
static struct jitckpt_wire *wire;
static unsigned char *ring;
static uint64_t ring_size, arena_size, segment_size;
static int sock = -1;
static int dead;              /* 1: no proxy (never connected, or gone) */
static int said_dead;
static int forked_child;      /* this process is a child forked from the worker (fork_child) */

#define SPIN_NS 5000          /* the bounded spin before sleeping on the futex */
#define CHECK_ALIVE_MS 100    /* how often a sleeping worker checks that the proxy is there */

/* The proxy-restart side (restart.c, milestone 2b), when built in: weak, so
 * that the transport links and works without it. */
#pragma weak remote_restart_connected
#pragma weak remote_restart_proxy_lost
#pragma weak remote_restart_count_call
void remote_restart_connected(pid_t proxy_pid);
void remote_restart_proxy_lost(void);
void remote_restart_count_call(struct rcall *c);

static int fail(const char *what)
{
    rlog("cannot reach the device proxy: %s; every CUDA call will fail with cudaErrorDevicesUnavailable", what);
    said_dead = 1;
    dead = 1;
    return -1;
}

int remote_proxy_lost;          /* recover.c: the proxy died under a recovery-enabled worker */

static void gone(void)
{
    if (remote_recovery_enabled()) {
        remote_proxy_lost = 1;                  /* remote_call recovers (recover.c), with the memory lost */
        return;
    }
    if (remote_restart_proxy_lost)
        remote_restart_proxy_lost();            /* may restart the proxy and stop the process */
    dead = 1;
    if (!said_dead) {
        said_dead = 1;
        rlog("the device proxy is gone; every CUDA call will fail with cudaErrorDevicesUnavailable");
    }
}

static int connect_proxy(void)
{
    const char *path = getenv(JITCKPT_PROXY_SOCKET_ENV);
    if (path == NULL || *path == '\0')
        return fail(JITCKPT_PROXY_SOCKET_ENV " is not set (start the program with jitckpt-proxy)");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return fail("the socket path is too long");
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        if (fd >= 0)
            close(fd);
        return fail(strerror(errno));
    }
    struct jitckpt_wire_hello hello;
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&hello, sizeof hello};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (n != (ssize_t)sizeof hello || hello.magic != JITCKPT_WIRE_MAGIC || hello.status != 0 || cm == NULL ||
        cm->cmsg_type != SCM_RIGHTS) {
        close(fd);
        return fail("the proxy refused this process (it serves one worker: its own pid check) or spoke another "
                    "protocol");
    }
    if (hello.version != JITCKPT_WIRE_VERSION) {
        close(fd);
        return fail("the proxy speaks another wire version (rebuild the proxy and this library together)");
    }
    int seg;
    memcpy(&seg, CMSG_DATA(cm), sizeof seg);
    void *p = mmap(NULL, hello.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, seg, 0);
    close(seg);
    if (p == MAP_FAILED) {
        close(fd);
        return fail("cannot map the shared segment");
    }
    struct jitckpt_wire *w = p;
    if (w->ring_size < JITCKPT_WIRE_MIN_RING || w->ring_offset + w->ring_size > hello.segment_size ||
        w->arena_offset + w->arena_size > hello.segment_size) {
        munmap(p, hello.segment_size);
        close(fd);
        return fail("the proxy's segment has an unexpected layout");
    }
    ring = (unsigned char *)p + w->ring_offset;
    ring_size = w->ring_size;
    arena_size = w->arena_size;
    segment_size = hello.segment_size;
    wire = w;
    sock = fd;
    if (remote_restart_connected)
        remote_restart_connected(hello.proxy_pid);
    return 0;
}

/* ---- waiting ------------------------------------------------------------------------- */

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

/* End-of-file on the socket: the proxy never writes to it after the hello. */
static int proxy_alive(void)
{
    char b;
    ssize_t n = recv(sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

static uint64_t tail(void)
{
    return __atomic_load_n(&wire->ring_tail, __ATOMIC_ACQUIRE);
}

/* Wakes the proxy if it said it may be asleep. */
static void ring_doorbell(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&wire->proxy_sleeping, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&wire->proxy_sleeping, 0, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&wire->proxy_wake, 1, __ATOMIC_SEQ_CST);
        futex(&wire->proxy_wake, FUTEX_WAKE, 1, NULL);
    }
}

/* Waits until the proxy has executed the ring up to position `until`; -1 if it is gone.
 * spin: spin a little first (waiting for an answer, which usually comes soon);
 * back-pressure waits for a good part of the ring and sleeps at once, leaving
 * the CPU to the proxy. */
static int recovery_watch;      /* wait_tail: 1 while a synchronous call of the program waits (recover.c) */
int abort_pending;              /* a back-pressure wait asked the proxy to drop everything: recover next */

static int wait_tail(uint64_t until, int spin)
{
    if (tail() >= until)
        return 0;
    ring_doorbell();                       /* the record we wait for may not have woken it yet */
    /* Spin briefly (an answer usually comes within a microsecond), then sleep:
     * a longer spin costs more than it saves when both processes share a
     * core, as on a loaded 2-core machine. */
    uint64_t start = now_ns(), spent = 0;
    while (spin && spent < SPIN_NS) {
        for (int i = 0; i < 64; i++) {
            if (tail() >= until)
                return 0;
            cpu_relax();
        }
        spent = now_ns() - start;
    }
    for (;;) {
        uint32_t seq = __atomic_load_n(&wire->worker_wake, __ATOMIC_SEQ_CST);
        __atomic_store_n(&wire->worker_waits_for, until, __ATOMIC_SEQ_CST);
        if (tail() >= until)
            break;
        struct timespec t = {0, CHECK_ALIVE_MS * 1000000L};
        long r = futex(&wire->worker_wake, FUTEX_WAIT, seq, &t);
        if (tail() >= until)
            break;
        if (r != 0 && errno == ETIMEDOUT && !proxy_alive()) {
            __atomic_store_n(&wire->worker_waits_for, 0, __ATOMIC_SEQ_CST);
            gone();
            return -1;
        }
        if (recovery_watch && remote_recovery_check()) {
            __atomic_store_n(&wire->worker_waits_for, 0, __ATOMIC_SEQ_CST);
            return 2;                           /* a failure that recovery repairs (recover.c) */
        }
        if (!spin && lock_held && !abort_pending && remote_recovery_enabled() && remote_recovery_check()) {
            /* Back-pressure behind work the proxy holds for a failed collective: have it
             * drop everything queued (the call being marshalled too); the call recovers
             * once it is appended (remote_call). */
            abort_pending = 1;
            __atomic_store_n(&wire->abort_before, UINT64_MAX, __ATOMIC_SEQ_CST);
        }
    }
    __atomic_store_n(&wire->worker_waits_for, 0, __ATOMIC_SEQ_CST);
    return 0;
}

/* ---- the arena: a ring of host bytes ------------------------------------------------ */

static uint64_t arena_head;        /* under the call lock: bytes handed out (monotonic) */
static uint64_t ring_head;         /* under the call lock: the worker's copy of wire->ring_head */

/* n bytes for the call being marshalled (8-byte aligned, never split by the
 * wrap); waits while the arena is full.  NULL if the call's bytes cannot fit
 * in the arena at all (the call is then not sent).  A call's first buffer may
 * wait for the whole arena to be released and start at its beginning, so one
 * buffer can be as large as the arena. */
void *remote_arena_alloc(struct rcall *c, size_t n, uint64_t *offset)
{
    uint64_t pos = (arena_head + 7) & ~7ull;
    uint64_t off = pos % arena_size;
    if (off + n > arena_size) {                 /* wrap: skip the end of the arena */
        pos += arena_size - off;
        off = 0;
    }
    int first = !c->arena_started;
    uint64_t start = first ? arena_head : c->arena_start;
    if (n > arena_size || (!first && pos + n - start > arena_size))
        return NULL;                            /* more than the whole arena for one call */
    /* The proxy releases the arena up to the arena_end of each record it executed:
     * at worst everything before this call. */
    for (;;) {
        uint64_t at = __atomic_load_n(&wire->arena_tail, __ATOMIC_ACQUIRE);
        if (pos + n - at <= arena_size)
            break;
        if (first && at == arena_head) {        /* all released: the whole arena is free */
            if (off != 0 && off + n > arena_size - 8) {
                pos += arena_size - off;
                off = 0;
            }
            start = pos;
            break;
        }
        /* Full: wait for a quarter of the ring's records (or all of them) to be done,
         * not for one, so that the proxy does not wake this thread per record. */
        uint64_t t = tail(), quarter = t + ring_size / 4;
        if (wait_tail(quarter < ring_head ? quarter : ring_head, 0) != 0)
            return NULL;
    }
    c->arena_started = 1;
    c->arena_start = start;
    arena_head = pos + n;
    c->arena_used = pos + n;
    *offset = off;
    return (unsigned char *)wire + wire->arena_offset + off;
}

/* ---- the call ------------------------------------------------------------------------ */

/* Starts a call with the call lock already held (restart.c). */
void remote_begin_locked(struct rcall *c, unsigned fn)
{
    memset(c, 0, sizeof *c);
    c->w = wire;
    c->arena = (unsigned char *)wire + wire->arena_offset;
    wire->fn = fn;
}

int remote_begin(struct rcall *c, unsigned fn)
{
    pthread_mutex_lock(&call_lock);
    if (wire == NULL && !dead)
        connect_proxy();
    if (dead) {
        if (forked_child && !said_dead) {
            said_dead = 1;
            rlog("a process forked from a CUDA program has no device proxy: its CUDA calls fail with "
                 "cudaErrorDevicesUnavailable");
        }
        pthread_mutex_unlock(&call_lock);
        return -1;
    }
    lock_held = 1;
    remote_begin_locked(c, fn);
    if (remote_restart_count_call)
        remote_restart_count_call(c);           /* may restart the proxy and begin c afresh */
    if (wire && remote_recovery_enabled() && remote_recovery_check()) {
        remote_recover(c, NULL, 0, 0);           /* before this call: it is not in the log yet */
        remote_begin_locked(c, fn);
    }
    c->program = 1;
    c->log = 1;                                 /* the program's call: into the call log (calllog.c) */
    return 0;
}

int remote_begin_quiet(struct rcall *c, unsigned fn)
{
    pthread_mutex_lock(&call_lock);
    lock_held = 1;
    if (wire == NULL && !dead)
        connect_proxy();
    if (dead || wire == NULL || remote_proxy_lost)
        return 1;                               /* a lost proxy: the recovery's new one gets everything */
    remote_begin_locked(c, fn);
    c->program = 1;
    return 0;
}

/* One message with a file descriptor on the socket (pinned.c), before the record that uses it. */
int remote_send_fd(int fd, const void *msg, size_t n)
{
    char control[CMSG_SPACE(sizeof(int))];
    memset(control, 0, sizeof control);
    struct iovec iov = {(void *)msg, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    ssize_t r;
    while ((r = sendmsg(sock, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    return r == (ssize_t)n ? 0 : -1;
}

/* Drops the connection and the segment, and connects to the proxy now
 * listening on the socket (restart.c, under the call lock): a new segment,
 * an empty ring and arena.  0, or -1 (said). */
int remote_reconnect(void)
{
    /* The old segment stays mapped (not unmapped): a call being retried after a
     * recovery still holds pointers into its arena (recover_and_retry).  One
     * segment's address space per restart. */
    if (sock >= 0)
        close(sock);
    wire = NULL;
    ring = NULL;
    sock = -1;
    ring_head = arena_head = 0;
    dead = said_dead = 0;
    return connect_proxy();
}

/* Appends the staged call as one record; returns the ring position after it, or 0 if the proxy is gone. */
static uint64_t append(struct rcall *c, uint32_t flags)
{
    size_t len = (sizeof(struct jitckpt_ring_rec) + c->req + 7) & ~(size_t)7;
    uint64_t pos = ring_head, off = pos % ring_size;
    int wrap = off + len > ring_size;
    uint64_t need = (wrap ? ring_size - off : 0) + len;
    if (pos + need - tail() > ring_size) {
        /* Full: wait until a quarter of the ring is free (hysteresis, as for the arena). */
        uint64_t until = pos + need - ring_size + ring_size / 4;
        if (wait_tail(until < pos ? until : pos, 0) != 0)
            return 0;
    }
    if (wrap) {
        uint32_t zero = 0;                      /* "continue at the ring's start" */
        memcpy(ring + off, &zero, sizeof zero);
        pos += ring_size - off;
        off = 0;
    }
    /* Every arena byte handed out so far belongs to this call or an earlier one. */
    struct jitckpt_ring_rec rec = {(uint32_t)len, c->w->fn, (uint32_t)c->req, flags, arena_head};
    memcpy(ring + off, &rec, sizeof rec);
    memcpy(ring + off + sizeof rec, c->w->req, c->req);
    ring_head = pos + len;
    __atomic_store_n(&wire->ring_head, ring_head, __ATOMIC_RELEASE);
    ring_doorbell();
    return ring_head;
}

/* For recovery (recover.c), under the call lock. */
uint64_t remote_append_raw(struct rcall *c, uint32_t flags) { return append(c, flags); }
int remote_wait(uint64_t until) { return wait_tail(until, 1) == 0 ? 0 : -1; }
struct jitckpt_wire *remote_wire(void) { return wire; }
uint64_t remote_ring_head(void) { return ring_head; }
int remote_proxy_alive(void) { return wire != NULL && proxy_alive(); }
int remote_skipping;

/* A call of the program met a failure that recovery repairs: recover, then
 * make the call again (its request, buffers re-placed in the arena) and give
 * the stub the new answer where it expects it.  The call itself is the last
 * one in the log, and is left out of the replay. */
static int32_t recover_and_retry(struct rcall *c, uint32_t flags, const char *why, int memory_lost, int logged)
{
    unsigned fn = c->w->fn;
    size_t req_len = c->req;
    unsigned char *req = malloc(req_len ? req_len : 1);
    unsigned char *ins[4] = {NULL, NULL, NULL, NULL};
    if (!req)
        return c->ret;
    memcpy(req, c->w->req, req_len);
    for (int i = 0; i < c->nbuf; i++)         /* (a direct input is the program's own buffer: it stays) */
        if (!c->buf_out[i] && !c->buf_direct[i] && c->buf_ptr[i] && (ins[i] = malloc(c->buf_len[i])) != NULL)
            memcpy(ins[i], c->buf_ptr[i], c->buf_len[i]);
    int32_t ret = remote_recover(c, why, memory_lost, logged);
    if (ret == 0) {
        struct rcall r;
        remote_begin_locked(&r, fn);
        memcpy(r.w->req, req, req_len);
        r.req = req_len;
        void *outs[4] = {NULL, NULL, NULL, NULL};
        for (int i = 0; i < c->nbuf; i++) {
            /* A direct buffer stays direct if the proxy (a new one, perhaps) has its
             * region mapped; otherwise it goes through the arena like the others. */
            int direct = c->buf_direct[i] && remote_pinned_shared(c->buf_ptr[i], c->buf_len[i]);
            uint64_t off = 0, size = c->buf_len[i];
            void *p = !direct && size ? remote_arena_alloc(&r, size, &off) : NULL;
            if (!direct && size && !p) {
                ret = cudaErrorNotSupported;
                break;
            }
            const void *in = c->buf_out[i] ? NULL : c->buf_direct[i] ? c->buf_ptr[i] : ins[i];
            if (p && in)
                memcpy(p, in, size);
            if (in && size && r.log_nin < 4) {
                r.log_in[r.log_nin] = p ? p : in;
                r.log_in_len[r.log_nin++] = size;
            }
            r.buf_pos[i] = c->buf_pos[i];
            r.buf_out[i] = c->buf_out[i];
            r.buf_direct[i] = (uint32_t)direct;
            r.buf_len[i] = size;
            r.buf_ptr[i] = direct ? c->buf_ptr[i] : p;
            r.nbuf = i + 1;
            if (!direct) {                      /* (direct: the request is unchanged) */
                memcpy(r.w->req + c->buf_pos[i], &size, sizeof size);
                memcpy(r.w->req + c->buf_pos[i] + 8, &off, sizeof off);
            }
            outs[i] = c->buf_out[i] ? p : NULL;
        }
        uint64_t end = ret == 0 ? append(&r, flags) : 0;
        if (end && !logged && c->log)
            remote_log_call(&r, flags);         /* the call was not in the log yet: now it is */
        if (end == 0 || wait_tail(end, 1) != 0) {
            ret = cudaErrorDevicesUnavailable;
        } else {
            ret = wire->ret;
            /* The stub reads outputs from its own arena pointers (of the old segment,
             * kept mapped after a proxy restart) and the response from c->w. */
            for (int i = 0; i < c->nbuf; i++)      /* (a direct one's: the program's buffer, on success) */
                if (outs[i] && c->buf_ptr[i] && outs[i] != c->buf_ptr[i] && (!c->buf_direct[i] || ret == 0))
                    memmove(c->buf_ptr[i], outs[i], c->buf_len[i]);
            c->w = wire;
            c->rep = 0;
        }
    }
    free(req);
    for (int i = 0; i < 4; i++)
        free(ins[i]);
    return c->ret = ret;
}

int32_t remote_call(struct rcall *c)
{
    if (remote_skipping && c->log) {            /* the rest of a failed optimizer step (recover.c) */
        c->w->rep_len = 0;
        return c->ret = 0;
    }
    if (dead && !remote_proxy_lost)
        return c->ret = cudaErrorDevicesUnavailable;
    if (remote_proxy_lost && c->log)
        return recover_and_retry(c, JITCKPT_REC_SYNC, "the device proxy died", 1, 0);
    if (c->overflow) {
        rlog("a call's arguments exceed the shared segment (request %u bytes, arena %llu bytes): not sent",
             JITCKPT_WIRE_REQ_MAX, (unsigned long long)arena_size);
        return c->ret = cudaErrorNotSupported;
    }
    unsigned fn = c->w->fn;
    int async = fn < RFN_count && remote_fn_async[fn] && !c->has_out && !remote_sync_all && !remote_capturing_now();
    uint64_t end = append(c, async ? 0 : JITCKPT_REC_SYNC);
    if (end == 0) {
        if (remote_proxy_lost && c->log)
            return recover_and_retry(c, JITCKPT_REC_SYNC, "the device proxy died", 1, 0);
        return c->ret = cudaErrorDevicesUnavailable;
    }
    if (c->log)
        remote_log_call(c, async ? 0 : JITCKPT_REC_SYNC);
    if (abort_pending)                          /* this record is dropped: recover, then make it again */
        return recover_and_retry(c, JITCKPT_REC_SYNC, NULL, 0, c->log);
    if (async)
        return c->ret = 0;                      /* cudaSuccess, ncclSuccess: its error comes later */
    recovery_watch = (c->program || remote_recovery_watch_protocol()) && remote_recovery_enabled();
    int w = wait_tail(end, 1);
    recovery_watch = 0;
    if (w == 2)
        return recover_and_retry(c, JITCKPT_REC_SYNC, NULL, 0, c->log);
    if (w != 0) {
        if (remote_proxy_lost && c->log)
            return recover_and_retry(c, JITCKPT_REC_SYNC, "the device proxy died", 1, 1);
        return c->ret = cudaErrorDevicesUnavailable;
    }
    c->rep = 0;
    c->ret = wire->ret;
    if (c->program && remote_recovery_enabled()) {      /* (logged, unless remote_begin_quiet's) */
        if (c->ret == JITCKPT_RET_RECOVER || c->ret == JITCKPT_RET_DROPPED)
            return recover_and_retry(c, JITCKPT_REC_SYNC, NULL, 0, c->log);
        if (remote_recoverable_error(fn, c->ret))
            return recover_and_retry(c, JITCKPT_REC_SYNC, "a sticky device error", 1, c->log);
    }
    if (c->ret == JITCKPT_RET_RECOVER || c->ret == JITCKPT_RET_DROPPED)
        c->ret = cudaErrorUnknown;
    return c->ret;
}

void remote_end(struct rcall *c)
{
    (void)c;
    lock_held = 0;
    pthread_mutex_unlock(&call_lock);
}

cudaError_t remote_unavailable(void)
{
    return cudaErrorDevicesUnavailable;
}

/* A minibatch ended (calllog.c): the proxy puts a marker on every stream, so
 * that the log keeps only what the device has not completed (recover.c). */
void remote_phase_begin(uint64_t index)
{
    if (lock_held || !remote_recovery_enabled())
        return;
    pthread_mutex_lock(&call_lock);
    if (wire && !dead) {
        lock_held = 1;
        remote_validate_begin(index);
        lock_held = 0;
    }
    pthread_mutex_unlock(&call_lock);
}

void remote_mark_minibatch(uint64_t index)
{
    remote_skipping = 0;
    if (lock_held || !remote_recovery_enabled())
        return;
    pthread_mutex_lock(&call_lock);
    if (wire && !dead) {
        lock_held = 1;
        remote_validate_end(index);
        remote_rewind_save(index + 1);          /* rewind.c: before the marker, so a done marker means saved */
        struct rcall c;
        remote_begin_locked(&c, JITCKPT_RFN_MARK);
        rc_put(&c, &index, sizeof index);
        append(&c, 0);
        remote_validate_prepare(index + 1);
        lock_held = 0;
    }
    pthread_mutex_unlock(&call_lock);
}

/* fork(): the child must not append to its parent's ring (the single producer
 * is the parent, under its lock), nor keep the parent's socket open (the
 * proxy would not see its worker go).  The child's calls fail with
 * cudaErrorDevicesUnavailable, said at its first call (a child that only
 * execs says nothing), as CUDA fails in a child forked after initialisation.
 * The lock is taken around fork() so that the child's copy is not held by a
 * thread that does not exist there -- unless the forking thread holds it
 * already (restart.c starts a new proxy under the call lock). */
static int prepare_locked;

static void fork_prepare(void)
{
    prepare_locked = !lock_held;
    if (prepare_locked)
        pthread_mutex_lock(&call_lock);
}

static void fork_parent(void)
{
    if (prepare_locked)
        pthread_mutex_unlock(&call_lock);
}

static void fork_child(void)
{
    remote_pinned_forked();                     /* pinned memory: the child's own copy (pinned.c) */
    if (wire != NULL) {
        munmap(wire, segment_size);
        wire = NULL;
        ring = NULL;
        if (sock >= 0)
            close(sock);
        sock = -1;
        dead = 1;
        said_dead = 0;
        forked_child = 1;
    }
    pthread_mutex_init(&call_lock, NULL);       /* one thread here: a fresh lock, held as the parent's was */
    if (lock_held)
        pthread_mutex_lock(&call_lock);
}

/* JITCKPT_REMOTE_SYNC=1: every call waits for its answer (milestone 1's behaviour;
 * for debugging: an asynchronous call's error is then returned by the call itself). */
int remote_sync_all;

__attribute__((constructor)) static void read_switches(void)
{
    const char *s = getenv("JITCKPT_REMOTE_SYNC");
    remote_sync_all = s != NULL && *s != '\0' && strcmp(s, "0") != 0;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}
