/* recover.c -- transparent recovery in the worker (milestone 4; paper
 * section 4.2; proxy_server/README.md, "Recovery").
 *
 * A failure is noticed under a call of the program, never by the program:
 *   - a collective unfinished for longer than JITCKPT_HANG_TIMEOUT seconds
 *     (the proxy's watcher publishes when the oldest one was enqueued),
 *   - an asynchronous communicator error (a peer aborted or died),
 *   - a sticky device error (cudaErrorIllegalAddress, a lost device, ...),
 *   - a proxy that died (SIGKILL, a crash).
 * Every rank then recovers together:
 *   1. stop: the proxy aborts its communicators and drops the records not yet
 *      executed; work that depended on an unfinished collective was held back
 *      (proxy_server/src/watch.c), so the parameters and optimizer state are
 *      still those of the start of the oldest minibatch the device has not
 *      completed;
 *   2. a rank whose device memory is gone (sticky error, lost device, dead
 *      proxy) gets a new proxy with every allocation at its address;
 *   3. the ranks meet through torchrun's store (python -m
 *      jitckpt.transparent.rendezvous): each reports whether its memory is
 *      intact, the minibatch its device completed, what its log holds, and
 *      rank 0 a new NCCL id;
 *   4. every rank decides the same: K, the minibatch to resume at (the newest
 *      any intact rank completed), the root (the lowest intact rank at K), and
 *      the ranks that need a copy of the root's memory;
 *   5. the allocations made since the start of K are freed, the communicators
 *      rebuilt behind the same virtual ids, the root sends its allocations to
 *      the ranks that need them (the replica fetch), and each rank replays its
 *      logged calls of minibatches K, K+1, ... (the call in progress last);
 *   6. a rank that failed inside minibatch K-1's optimizer step (its
 *      replicas completed it) takes the replica's memory and skips the rest
 *      of that step: its calls until jitckpt_phase_optimizer_end do nothing.
 * Then the call the program was in is made again and returns its answer.
 * Anything that makes this impossible (a minibatch that created objects, a
 * log that was switched off, allocations that differ from the root's, no
 * intact rank) stops every rank with exit status 75 and the reason: the job
 * launcher then restarts from the last checkpoint.  Never a wrong answer. */

#include "remote.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jitckpt_remote_restart.h"
#include "jitckpt_sticky.h"

#define EXIT_NO_RECOVERY 75
#define MAX_WORLD 1024

/* restart.c */
size_t restart_n_allocs(void);
void restart_alloc(size_t i, uint64_t *addr, uint64_t *size, uint64_t *minibatch);
size_t restart_n_comms(void);
void restart_comm(size_t i, uint64_t *vid, int *nranks, int *rank, int *device);
const char *restart_replace_and_recreate(void);
extern int remote_proxy_lost;

struct snap { uint64_t addr, size, minibatch; unsigned char *bytes; };   /* device memory copied out */
static struct snap *snapshot(struct rcall *c, size_t *n);
static int32_t write_alloc(struct rcall *c, uint64_t addr, const unsigned char *from, uint64_t n);
static void free_snap(struct snap *s, size_t n);

static int configured, enabled, in_recovery, world = 1, rank;
static const char *busy;         /* "the recovery" or "replay validation": a failure now cannot be recovered */
static int watch_protocol;       /* the protocol's own waits are watched too (after the first RST_CLEAR) */
static double hang_timeout = 30.0;
static int generation;
static uint64_t last_done;
static const char *invalid;      /* validation found the replay unfaithful: recovery refuses (the reason) */
static const char *invalid_code = "validation";   /* the report's `cannot` word for it */
static void validate_configure(void);   /* replay validation (below): when, and whether one has passed */
#define VALIDATE_RETRIES 3              /* a check skipped is tried again at most this often in a row */
static long validate_at;
static int validated_once;              /* a replay validation has passed on this rank */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void configure(void)
{
    if (configured)
        return;
    configured = 1;
    const char *w = getenv("WORLD_SIZE"), *r = getenv("RANK"), *off = getenv("JITCKPT_TRANSPARENT_RECOVERY");
    const char *t = getenv("JITCKPT_HANG_TIMEOUT");
    world = w && *w ? atoi(w) : 1;
    rank = r && *r ? atoi(r) : 0;
    if (t && *t) {
        char *end;
        double v = strtod(t, &end);
        if (*end == '\0' && v > 0)
            hang_timeout = v;
        else
            rlog("JITCKPT_HANG_TIMEOUT=%s is not a number of seconds; using %.0f", t, hang_timeout);
    }
    /* One rank has no replica to recover from: errors reach the program as before. */
    enabled = world > 1 && world <= MAX_WORLD && !(off && strcmp(off, "0") == 0) && getenv("MASTER_ADDR") &&
              getenv("MASTER_PORT");
}

int remote_recovery_enabled(void)
{
    configure();
    return enabled;
}

int remote_recovery_active(void)
{
    configure();
    return enabled && !invalid;
}

/* client.c: whether a wait of the recovery's or validation's own calls watches for a failure. */
static int validate_starting;    /* remote_validate_begin: a failure there is an ordinary one */

int remote_recovery_watch_protocol(void)
{
    return (in_recovery && watch_protocol) || validate_starting;
}

int remote_recoverable_error(unsigned fn, int32_t ret)
{
    if (ret == 0)
        return 0;
    const int nccl = fn >= RFN_ncclAllGather && fn <= RFN_ncclSend;     /* remote_fns.h orders names */
    if (nccl)
        return ret == ncclUnhandledCudaError || ret == ncclSystemError || ret == ncclRemoteError ||
               ret == ncclInternalError;
    return jitckpt_sticky_cuda_error(ret);
}

int remote_recovery_check(void)
{
    if (!remote_recovery_enabled())
        return 0;
    struct jitckpt_wire *w = remote_wire();
    if (!w)
        return 0;
    if (!__atomic_load_n(&w->recovery_on, __ATOMIC_RELAXED))
        __atomic_store_n(&w->recovery_on, 1, __ATOMIC_SEQ_CST);
    uint64_t done = __atomic_load_n(&w->done_marker, __ATOMIC_ACQUIRE);
    if (done > last_done) {
        calllog_drop_until(done);
        last_done = done;
    }
    if (__atomic_load_n(&w->comm_error, __ATOMIC_ACQUIRE) || __atomic_load_n(&w->device_error, __ATOMIC_ACQUIRE))
        return 1;
    uint64_t t = __atomic_load_n(&w->coll_oldest_ns, __ATOMIC_ACQUIRE);
    if (t) {
        struct timespec n;
        clock_gettime(CLOCK_MONOTONIC, &n);
        uint64_t now = (uint64_t)n.tv_sec * 1000000000ull + (uint64_t)n.tv_nsec;
        if (now > t && (double)(now - t) * 1e-9 > hang_timeout)
            return 1;
    }
    return 0;
}

static void __attribute__((noreturn, format(printf, 1, 2))) give_up(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rlog("rank %d: transparent recovery is not possible: %s; stopping (exit status %d) so that the job restarts "
         "from its last checkpoint", rank, msg, EXIT_NO_RECOVERY);
    fflush(stdout);
    _exit(EXIT_NO_RECOVERY);
}

/* ---- the calls of the protocol (restart protocol ids; not logged) ------------------- */

static int32_t simple(unsigned fn, const void *a, size_t na, struct rcall *c)
{
    remote_begin_locked(c, fn);
    if (na)
        rc_put(c, a, na);
    return remote_call(c);
}

static uint64_t alloc_hash(uint64_t before)
{
    /* Replicas allocate the same sizes in the same order, at the same offsets
     * in their own rank's reserved range (proxy_server/src/devmem.c). */
    uint64_t h = 1469598103934665603ull, base = 0;
    for (size_t i = 0; i < restart_n_allocs(); i++) {
        uint64_t a, s, mb;
        restart_alloc(i, &a, &s, &mb);
        if (mb >= before)
            continue;
        if (!base)
            base = a;
        a -= base;
        for (int k = 0; k < 8; k++) { h ^= (a >> (8 * k)) & 0xff; h *= 1099511628211ull; }
        for (int k = 0; k < 8; k++) { h ^= (s >> (8 * k)) & 0xff; h *= 1099511628211ull; }
    }
    return h;
}

/* Frees the allocations made in minibatch `from` or later, newest first (a replay makes them again, at the same
 * addresses).  0, or the first error. */
static int32_t free_since(struct rcall *c, uint64_t from)
{
    int32_t first = 0;
    for (size_t i = restart_n_allocs(); i-- > 0;) {
        uint64_t a, sz, mb;
        restart_alloc(i, &a, &sz, &mb);
        if (mb < from)
            continue;
        void *p = (void *)(uintptr_t)a;
        remote_begin_locked(c, RFN_cudaFree);
        rc_put(c, &p, sizeof p);
        int32_t err = remote_call(c);
        if (err && !first)
            first = err;
    }
    return first;
}

/* ---- the rendezvous through torchrun's store ---------------------------------------- */

struct report {
    int mem, have;
    unsigned long long done, first, host, allocs, rw, rwf, rwok;
    char cannot[64];
    char id[2 * sizeof(ncclUniqueId) + 1];
};

static int parse_report(const char *tok, struct report *r)
{
    memset(r, 0, sizeof *r);
    int n = sscanf(tok,
                   "v1;mem=%d;done=%llu;first=%llu;host=%llu;allocs=%llx;rw=%llu;rwf=%llu;rwok=%llu;cannot=%63[^;];"
                   "id=%256s", &r->mem, &r->done, &r->first, &r->host, &r->allocs, &r->rw, &r->rwf, &r->rwok,
                   r->cannot, r->id);
    r->have = n == 10;
    return r->have ? 0 : -1;
}

/* Runs the rendezvous helper for generation `gen`: our token in, every rank's out, each handed to
 * each(rank, token, arg) (0: understood).  0, or -1 (said). */
static int rendezvous_tokens(const char *token, long gen_no, int (*each)(int r, const char *tok, void *arg), void *arg)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        rlog("rendezvous: pipe: %s", strerror(errno));
        return -1;
    }
    char gen[32];
    snprintf(gen, sizeof gen, "%ld", gen_no);
    const char *py = getenv("JITCKPT_PYTHON");
    if (!py || !*py)
        py = "python3";
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        unsetenv("LD_PRELOAD");            /* the helper is not a CUDA program */
        execlp(py, py, "-m", "jitckpt.transparent.rendezvous", "--generation", gen, (char *)NULL);
        fprintf(stderr, "jitckpt remote: cannot run %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    size_t tl = strlen(token);
    if (write(in[1], token, tl) != (ssize_t)tl || write(in[1], "\n", 1) != 1)
        rlog("rendezvous: cannot write to the helper");
    close(in[1]);
    size_t cap = (size_t)world * 9000 + 1, got = 0;
    char *text = malloc(cap);
    ssize_t n;
    while (text && got < cap - 1 && (n = read(out[0], text + got, cap - 1 - got)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        got += (size_t)n;
    }
    close(out[0]);
    int status = 0;
    while (waitpid(p, &status, 0) < 0 && errno == EINTR)
        ;
    if (!text || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        free(text);
        rlog("rendezvous: the helper failed (status %d; its message is above)",
             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    text[got] = '\0';
    int seen = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int r;
        char tok[9000];
        if (sscanf(line, "%d %8999s", &r, tok) == 2 && r >= 0 && r < world && each(r, tok, arg) == 0)
            seen++;
    }
    free(text);
    if (seen != world) {
        rlog("rendezvous: %d of %d reports understood", seen, world);
        return -1;
    }
    return 0;
}

static int each_report(int r, const char *tok, void *arg)
{
    return parse_report(tok, &((struct report *)arg)[r]);
}

/* The recovery's meeting: every rank's report. */
static int rendezvous(const char *token, struct report *all)
{
    return rendezvous_tokens(token, generation, each_report, all);
}

/* ---- replay ------------------------------------------------------------------------- */

struct replay_state { uint64_t calls; };

static int32_t replay_one(const struct log_rec *r, void *arg)
{
    if (r->flags & LOG_SKIP)
        return 0;
    struct rcall c;
    remote_begin_locked(&c, r->fn);
    memcpy(c.w->req, r->req, r->req_len);
    c.req = r->req_len;
    /* Every host buffer goes through the arena, its size and offset patched in
     * the request: inputs with their logged bytes, outputs into the arena.  A
     * direct buffer (pinned memory shared with the proxy: size 0 in the logged
     * request) too: a replay never reads the program's pinned buffer, which it
     * may have reused since, nor writes it (a copy into it completed before
     * the call returned while recovery is on: marshal.c). */
    const unsigned char *in = r->input;
    for (uint32_t j = 0; j < r->nbuf && j < 4; j++) {
        uint64_t off = 0, n = r->buf_len[j];
        if (n) {
            void *p = remote_arena_alloc(&c, n, &off);
            if (!p)
                return cudaErrorNotSupported;
            if (!r->buf_out[j]) {
                memcpy(p, in, n);
                in += n;
            }
        }
        memcpy(c.w->req + r->buf_pos[j], &n, sizeof n);
        memcpy(c.w->req + r->buf_pos[j] + 8, &off, sizeof off);
    }
    if (getenv("JITCKPT_REMOTE_REPLAY_TRACE")) {
        uint64_t h = 1469598103934665603ull;
        for (uint32_t i = 0; i < r->req_len; i++) { h ^= c.w->req[i]; h *= 1099511628211ull; }
        int direct = 0;
        for (uint32_t j = 0; j < r->nbuf && j < 4; j++)
            direct += (int)r->buf_direct[j];
        rlog("replay: fn %u flags %#x req %u bytes (%016llx), %u buffers (%d from pinned memory)", r->fn, r->flags,
             r->req_len, (unsigned long long)h, r->nbuf, direct);
    }
    if (remote_append_raw(&c, 0) == 0)
        return cudaErrorDevicesUnavailable;
    ((struct replay_state *)arg)->calls++;
    return 0;
}

static void replay_mark(uint64_t index, void *arg)
{
    (void)arg;
    struct rcall c;
    remote_rewind_save(index + 1);
    remote_begin_locked(&c, JITCKPT_RFN_MARK);
    rc_put(&c, &index, sizeof index);
    remote_append_raw(&c, 0);
}

/* ---- the recovery ------------------------------------------------------------------- */

static void hex(const unsigned char *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static int unhex(const char *s, unsigned char *p, size_t n)
{
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        p[i] = (unsigned char)v;
    }
    return 0;
}

int32_t remote_recover(struct rcall *c0, const char *why, int memory_lost, int pending_logged)
{
    (void)c0;
    struct rcall c;
    double t0 = now_s();
    if (in_recovery)
        give_up("a second failure during %s (%s)", busy ? busy : "the recovery",
                why ? why : "a collective hung or a peer failed");
    in_recovery = 1;
    watch_protocol = 0;
    busy = "the recovery";
    generation++;
    struct jitckpt_wire *w = remote_wire();
    char reason[160];
    double waited_ms = -1;                     /* how long the oldest collective had been in flight */
    if (w && w->coll_oldest_ns) {
        struct timespec n;
        clock_gettime(CLOCK_MONOTONIC, &n);
        uint64_t now = (uint64_t)n.tv_sec * 1000000000ull + (uint64_t)n.tv_nsec;
        if (now > w->coll_oldest_ns)
            waited_ms = (double)(now - w->coll_oldest_ns) * 1e-6;
    }
    if (why) {
        snprintf(reason, sizeof reason, "%s", why);
    } else if (w && w->device_error) {
        snprintf(reason, sizeof reason, "a sticky device error (%d)", (int)w->device_error);
        memory_lost = 1;
    } else if (w && w->comm_error) {
        snprintf(reason, sizeof reason, "a communicator reported NCCL error %d (a peer failed)", (int)w->comm_error);
    } else {
        snprintf(reason, sizeof reason, "a collective did not complete within JITCKPT_HANG_TIMEOUT=%g s",
                 hang_timeout);
    }
    rlog("rank %d: %s: recovering transparently (recovery %d)", rank, reason, generation);

    /* 1. Stop: abort the communicators, drop what was not executed. */
    extern int abort_pending;
    abort_pending = 0;
    int alive = !remote_proxy_lost && remote_proxy_alive();
    if (alive) {
        uint64_t head = remote_ring_head();
        __atomic_store_n(&w->abort_before, head ? head : 1, __ATOMIC_SEQ_CST);
        double until = now_s() + 10.0;
        while ((__atomic_load_n(&w->ring_tail, __ATOMIC_ACQUIRE) < head ||
                !__atomic_load_n(&w->abort_done, __ATOMIC_ACQUIRE)) && now_s() < until && remote_proxy_alive()) {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
        if (__atomic_load_n(&w->ring_tail, __ATOMIC_ACQUIRE) < head || !remote_proxy_alive()) {
            rlog("rank %d: the device proxy did not stop within 10 s: replacing it", rank);
            alive = 0;
        }
    }
    double t_stop = now_s();

    /* Whether the saves of state changed in place failed (read before a new proxy replaces the segment). */
    int32_t save_failed = w ? __atomic_load_n(&w->rewind_error, __ATOMIC_ACQUIRE) : 0;

    /* 2. This rank's memory.  Driver suspect (memory_lost == RECOVER_SUSPECT): the device still
     * answers, but the proxy is not trusted: copy everything out, replace it, copy back. */
    int suspect = memory_lost == RECOVER_SUSPECT;
    int mem = alive && (!memory_lost || suspect);
    uint64_t done = 0;
    if (mem) {
        int32_t dev = -1;
        if (simple(JITCKPT_RFN_RST_HEALTH, NULL, 0, &c) == 0 && rc_get(&c, &dev, sizeof dev) == 0 &&
            rc_get(&c, &done, sizeof done) == 0 && dev == 0)
            calllog_drop_until(done);
        else
            mem = 0;
    }
    struct snap *saved = NULL;
    size_t nsaved = 0;
    if (mem && suspect && (saved = snapshot(&c, &nsaved)) == NULL)
        mem = 0;                               /* could not copy out: as if lost */
    if (!mem || suspect) {
        const char *failed = restart_replace_and_recreate();
        if (failed)
            give_up("the replacement device proxy failed %s", failed);
        remote_proxy_lost = 0;
    }
    for (size_t i = 0; saved && i < nsaved; i++)
        if (write_alloc(&c, saved[i].addr, saved[i].bytes, saved[i].size) != 0)
            give_up("copying device memory back into the new proxy failed");
    free_snap(saved, nsaved);
    w = remote_wire();
    double t_restart = now_s();

    /* 3. The report. */
    uint64_t first = calllog_first(), host = calllog_minibatch();
    const char *cannot = invalid ? invalid_code : "none";
    uint64_t vid = 0;
    int nranks = 0, crank = 0, cdev = 0;
    if (invalid) {
        /* said when validation failed; the other ranks give up too */
    } else if (remote_rewind_unlearned()) {
        cannot = "inplace";
    } else if (remote_rewind_bytes() && (save_failed || !remote_rewind_intact())) {
        cannot = "rewind";
    } else if (restart_n_comms() != 1) {
        cannot = "communicators";
    } else {
        restart_comm(0, &vid, &nranks, &crank, &cdev);
        if (nranks != world || crank != rank)
            cannot = "communicators";
    }
    validate_configure();
    if (strcmp(cannot, "none") == 0 && !validated_once && validate_at >= 0)
        cannot = "unchecked";                  /* nothing has shown yet that a replay reproduces a minibatch */
    char id[2 * sizeof(ncclUniqueId) + 1] = "-";
    if (rank == 0 && strcmp(cannot, "none") == 0) {
        if (simple(JITCKPT_RFN_RST_UNIQUE_ID, NULL, 0, &c) == 0) {
            ncclUniqueId u;
            if (rc_get(&c, &u, sizeof u) == 0)
                hex((const unsigned char *)&u, sizeof u, id);
        } else {
            cannot = "nccl-id";
        }
    }
    char token[512];
    snprintf(token, sizeof token, "v1;mem=%d;done=%llu;first=%llu;host=%llu;allocs=%016llx;rw=%llu;rwf=%llu;rwok=%llu;"
             "cannot=%s;id=%s", mem, (unsigned long long)(mem ? done : 0), (unsigned long long)first,
             (unsigned long long)host, (unsigned long long)alloc_hash(first < host ? first : host),
             (unsigned long long)remote_rewind_bytes(), (unsigned long long)remote_rewind_from(),
             (unsigned long long)remote_rewind_saved_upto(), cannot, id);
    static struct report all[MAX_WORLD];
    if (rendezvous(token, all) != 0)
        give_up("the ranks could not meet through torchrun's store");
    double t_rdzv = now_s();

    /* 4. The same decision on every rank. */
    uint64_t K = 0;
    int root = -1, unchecked = -1;
    for (int r = 0; r < world; r++) {
        if (strcmp(all[r].cannot, "validation") == 0)
            give_up("rank %d's replay validation failed earlier (a replay there does not reproduce the device "
                    "memory)", r);
        if (strcmp(all[r].cannot, "inplace") == 0)
            give_up("rank %d changes device state in place before its optimizer step (BatchNorm's running "
                    "statistics) that replay validation has not learned yet: a replay would apply it twice", r);
        if (strcmp(all[r].cannot, "rewind") == 0)
            give_up("rank %d could not save the state it changes in place before its optimizer step (a failed "
                    "copy, or host memory the device proxy could not map)", r);
        if (strcmp(all[r].cannot, "managed") == 0)
            give_up("rank %d has managed memory (cudaMallocManaged), which a replay cannot reset", r);
        if (strcmp(all[r].cannot, "unchecked") == 0 && unchecked < 0)
            unchecked = r;                         /* (said below, after the reasons about the minibatch itself) */
        else if (strcmp(all[r].cannot, "none") != 0 && strcmp(all[r].cannot, "unchecked") != 0)
            give_up("rank %d cannot take part (%s: transparent mode recovers one communicator of all ranks)", r,
                    all[r].cannot);
        if (all[r].mem && all[r].done >= K)
            K = all[r].done;
    }
    for (int r = 0; r < world && root < 0; r++)
        if (all[r].mem && all[r].done == K)
            root = r;
    if (root < 0)
        give_up("no rank kept its device memory: there is no replica to copy from");
    int need_fetch[MAX_WORLD], nfetch = 0;
    for (int r = 0; r < world; r++) {
        need_fetch[r] = !all[r].mem || all[r].done < K;
        if (need_fetch[r]) {
            nfetch++;
            if (all[r].allocs != all[root].allocs)
                give_up("rank %d lost its device memory and its allocations differ from rank %d's: no replica holds "
                        "its state", r, root);
        }
    }
    /* State changed in place (rewind.c): each rank writes back its own, saved at K's start in host memory
     * (so a rank that lost its device memory has it too, if its device got that far). */
    for (int r = 0; r < world; r++) {
        if (!all[r].rw)
            continue;
        if (need_fetch[r] && all[r].host + 1 == K)
            give_up("rank %d failed inside minibatch %llu's optimizer step, after that minibatch changed %llu bytes "
                    "in place that only it held (per-rank state such as BatchNorm's running statistics): no replica "
                    "has them", r, (unsigned long long)(K - 1), all[r].rw);
        if (all[r].rwok < K)
            give_up("rank %d's device had not saved the %llu bytes it changes in place (per-rank state such as "
                    "BatchNorm's running statistics) at minibatch %llu's start (the newest saved: %llu)%s", r,
                    all[r].rw, (unsigned long long)K, all[r].rwok, need_fetch[r] ? ": no replica has them" : "");
        if (all[r].rwf > K)
            give_up("rank %d saves the state it changes in place from minibatch %llu on; the resume point %llu is "
                    "earlier", r, all[r].rwf, (unsigned long long)K);
        if (all[r].host >= K + JITCKPT_REWIND_SLOTS)
            give_up("rank %d's host ran %d minibatches ahead of the resume point %llu, so the state it changes in "
                    "place, saved at that minibatch's start, may be overwritten", r, JITCKPT_REWIND_SLOTS,
                    (unsigned long long)K);
    }
    int skip = 0;
    if (need_fetch[rank]) {
        if (host + 1 == K)
            skip = 1;                              /* failed in K-1's optimizer step: the replica finished it */
        else if (host < K || first > K)
            give_up("this rank's call log (minibatches %llu..%llu) does not hold minibatch %llu",
                    (unsigned long long)first, (unsigned long long)host, (unsigned long long)K);
    } else if (first != K) {
        give_up("this rank's device completed minibatch %llu but the resume point is %llu",
                (unsigned long long)first, (unsigned long long)K);
    }
    const char *noreplay = skip ? NULL : calllog_noreplay(K);
    if (noreplay)
        give_up("minibatch %llu cannot be replayed: %s", (unsigned long long)K, noreplay);
    if (!skip && K == 0)
        give_up("minibatch 0 holds the program's set-up and cannot be replayed");
    if (unchecked >= 0)
        give_up("no replay validation has passed yet on rank %d (checks from minibatch %ld, "
                "JITCKPT_TRANSPARENT_VALIDATE_AT; one skipped is tried again at most %d times): whether a replay "
                "reproduces this program's minibatch is not known (state changed in place that no call announces, "
                "such as BatchNorm's num_batches_tracked, would be changed twice), so the recovery would not be "
                "known to be exact", unchecked, validate_at, VALIDATE_RETRIES);
    if (!skip)
        calllog_drop_until(K);

    /* 5. Free what the minibatches from K allocated (the replay makes it again, at the same addresses). */
    if (!skip)
        free_since(&c, K);
    /* The communicator, behind the same virtual id. */
    ncclUniqueId u;
    if (unhex(all[0].id, (unsigned char *)&u, sizeof u) != 0)
        give_up("rank 0 sent no NCCL id");
    remote_begin_locked(&c, JITCKPT_RFN_RST_COMM_REBUILD);
    rc_put(&c, &vid, sizeof vid);
    rc_put(&c, &nranks, sizeof nranks);
    rc_put(&c, &crank, sizeof crank);
    rc_put(&c, &cdev, sizeof cdev);
    rc_put(&c, &u, sizeof u);
    if (remote_call(&c) != 0)
        give_up("rebuilding the communicator failed");
    /* The abort is over: forget what was in flight (the replay's own work must not be dropped). */
    uint64_t resume = skip ? K - 1 : K;
    int32_t left = -1;
    remote_begin_locked(&c, JITCKPT_RFN_RST_CLEAR);
    rc_put(&c, &resume, sizeof resume);
    if (remote_call(&c) != 0 || rc_get(&c, &left, sizeof left) != 0)
        give_up("the device proxy did not answer after the abort");
    watch_protocol = 1;                        /* from here on, a new failure is a second failure */
    double t_comm = now_s();
    /* The replica fetch: the root's allocations (those older than K) to each rank that needs them. */
    uint64_t fetched = 0;
    for (size_t i = 0; i < restart_n_allocs() && nfetch; i++) {
        uint64_t a, s, mb;
        restart_alloc(i, &a, &s, &mb);
        if (mb >= K && !skip)
            continue;
        for (int r = 0; r < world; r++) {
            if (!need_fetch[r] || (rank != root && rank != r))
                continue;
            int32_t peer = rank == root ? r : root, send = rank == root;
            remote_begin_locked(&c, JITCKPT_RFN_RST_XFER);
            rc_put(&c, &vid, sizeof vid);
            rc_put(&c, &peer, sizeof peer);
            rc_put(&c, &send, sizeof send);
            rc_put(&c, &a, sizeof a);
            rc_put(&c, &s, sizeof s);
            if (remote_call(&c) != 0)
                give_up("copying %llu bytes at %#llx %s rank %d failed", (unsigned long long)s,
                        (unsigned long long)a, send ? "to" : "from", (int)peer);
            if (rank == r)
                fetched += s;
        }
    }
    double t_fetch = now_s();

    /* 6. Replay (or skip the rest of a failed optimizer step). */
    if (!skip && remote_rewind_restore(&c, K) != 0)
        give_up("writing back the state changed in place at minibatch %llu's start failed", (unsigned long long)K);
    if (!skip && remote_rewind_bytes())
        rlog("rank %d: wrote back %llu bytes of state changed in place, as saved at minibatch %llu's start",
             rank, (unsigned long long)remote_rewind_bytes(), (unsigned long long)K);
    struct replay_state rs = {0};
    int32_t err = 0;
    if (!skip)
        err = calllog_each(K, pending_logged ? 1 : 0, replay_one, replay_mark, &rs);
    if (err)
        give_up("replaying the call log failed (error %d)", (int)err);
    remote_begin_locked(&c, JITCKPT_RFN_RST_CLEAR);
    rc_put(&c, &resume, sizeof resume);
    left = -1;
    if (remote_call(&c) != 0 || rc_get(&c, &left, sizeof left) != 0)
        give_up("the device proxy did not answer after the replay");
    if (left != 0)
        give_up("a replayed call failed (error %d)", (int)left);
    if (skip) {
        calllog_skip_current(K - 1);
        remote_skipping = 1;
    }
    last_done = resume;
    double t_end = now_s();
    rlog("rank %d: recovered in %.0f ms (stop %.0f, %s %.0f, rendezvous %.0f, communicator %.0f, replica copy %.0f "
         "ms for %llu bytes, replay %.0f ms of %llu calls): resumed at minibatch %llu%s, root rank %d; the oldest "
         "collective had waited %.0f ms when the recovery began",
         rank, (t_end - t0) * 1e3, (t_stop - t0) * 1e3,
         suspect && mem ? "copy out, new proxy, copy back" : mem ? "health check" : "new proxy", (t_restart - t_stop) * 1e3,
         (t_rdzv - t_restart) * 1e3, (t_comm - t_rdzv) * 1e3, (t_fetch - t_comm) * 1e3,
         (unsigned long long)fetched, (t_end - t_fetch) * 1e3, (unsigned long long)rs.calls,
         (unsigned long long)K, skip ? " (the rest of the failed optimizer step skipped)" : "", root,
         waited_ms < 0 ? 0.0 : waited_ms);
    in_recovery = watch_protocol = 0;
    busy = NULL;
    return 0;
}

/* ---- replay-log validation (section 4.1) --------------------------------------------
 *
 * At minibatch JITCKPT_TRANSPARENT_VALIDATE_AT (default 5) and every
 * JITCKPT_TRANSPARENT_VALIDATE_EVERY (default 1000; 0: once) minibatches
 * after it, every rank checks that a replay reproduces the device memory, in
 * the worst state a recovery can meet: at jitckpt_phase_optimizer_begin the
 * device is synchronised and every allocation copied out (S_pre: the
 * forward, backward and all-reduce have run, the parameters not yet
 * changed); at jitckpt_phase_optimizer_end the device is synchronised again,
 * the allocations checksummed (C1) and copied out (S_end); then the
 * allocations older than the minibatch get S_pre back, the minibatch's own
 * are freed, the whole minibatch is replayed from the log, and the
 * allocations checksummed again (C2).  C1 == C2: said once.  Otherwise the
 * replay is unfaithful (device state the log does not capture: a kernel that
 * keeps hidden state, a side channel into device memory): S_end is written
 * back, so the job goes on exactly as without the check, and transparent
 * recovery is off for the job: at the next failure every rank stops with
 * exit status 75 and the job falls back to its checkpoints.  All ranks
 * validate the same minibatch, so the replayed collectives meet: the replay
 * re-runs them, and a rank that did not replay would have its next real
 * collective matched with the others' replayed one.  So whether to check is
 * agreed first (validate_agree): a rank that cannot (its recovery is off, a
 * failure under way, a minibatch that creates a stream or an event there,
 * memory it could not copy out) says why, and no rank checks; a check skipped
 * for a passing reason is tried again at the next minibatch, at most
 * VALIDATE_RETRIES times in a row.  Costs two host copies of device memory
 * and two meetings through torchrun's store, once every N minibatches. */

static struct snap *pre;
static size_t npre;
static int64_t validating = -1;
static long validate_at = 5, validate_every = 1000;
static int validate_configured;
static int64_t validate_retry = -1;     /* a skipped check is tried again at this minibatch */
static int validate_retries;            /* checks skipped in a row */
static int64_t skip_for = -1;           /* the minibatch this rank cannot check, and why (a code of skip_text) */
static const char *skip_code;

static void validate_configure(void)
{
    if (validate_configured)
        return;
    validate_configured = 1;
    const char *a = getenv("JITCKPT_TRANSPARENT_VALIDATE_AT"), *e = getenv("JITCKPT_TRANSPARENT_VALIDATE_EVERY");
    if (a && *a)
        validate_at = atol(a);
    if (e && *e)
        validate_every = atol(e);
}

/* pinned.c: the job has state a replay cannot reset; said once, and a later
 * failure stops every rank (exit status EXIT_NO_RECOVERY) with the reason. */
void remote_recovery_off(const char *code, const char *why)
{
    configure();
    if (!enabled || invalid)
        return;
    invalid = why;
    invalid_code = code;
    rlog("rank %d: %s.  Transparent recovery is OFF for this job: a failure will stop every rank (exit status %d) "
         "and the job falls back to its checkpoints.", rank, why, EXIT_NO_RECOVERY);
}

static int validate_now(uint64_t minibatch)
{
    validate_configure();
    if (validate_at < 0 || (long)minibatch < validate_at)
        return 0;
    if ((long)minibatch == validate_at || (int64_t)minibatch == validate_retry)
        return 1;
    return validate_every > 0 && ((long)minibatch - validate_at) % validate_every == 0;
}

static int32_t read_alloc(struct rcall *c, uint64_t addr, unsigned char *to, uint64_t n)
{
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < (8u << 20) ? n - done : (8u << 20), at = addr + done;
        remote_begin_locked(c, JITCKPT_RFN_RST_READ);
        rc_put(c, &at, sizeof at);
        rc_put(c, &k, sizeof k);
        void *out = rc_put_out(c, k);
        int32_t err = remote_call(c);
        if (err)
            return err;
        rc_get_out(c, to + done, out, k);
        done += k;
    }
    return 0;
}

static int32_t write_alloc(struct rcall *c, uint64_t addr, const unsigned char *from, uint64_t n)
{
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < (8u << 20) ? n - done : (8u << 20), at = addr + done;
        remote_begin_locked(c, JITCKPT_RFN_RST_WRITE);
        rc_put(c, &at, sizeof at);
        rc_put(c, &k, sizeof k);
        rc_put_in(c, from + done, k);
        int32_t err = remote_call(c);
        if (err)
            return err;
        done += k;
    }
    return 0;
}

int32_t remote_write_device(struct rcall *c, uint64_t addr, const void *from, uint64_t n)
{
    return write_alloc(c, addr, from, n);
}

/* Copies every live allocation out; NULL on failure. */
static struct snap *snapshot(struct rcall *c, size_t *n)
{
    *n = restart_n_allocs();
    struct snap *s = calloc(*n ? *n : 1, sizeof *s);
    for (size_t i = 0; s && i < *n; i++) {
        restart_alloc(i, &s[i].addr, &s[i].size, &s[i].minibatch);
        s[i].bytes = malloc(s[i].size ? s[i].size : 1);
        if (!s[i].bytes || read_alloc(c, s[i].addr, s[i].bytes, s[i].size) != 0) {
            for (size_t j = 0; j <= i; j++)
                free(s[j].bytes);
            free(s);
            return NULL;
        }
    }
    return s;
}

static void free_snap(struct snap *s, size_t n)
{
    for (size_t i = 0; s && i < n; i++)
        free(s[i].bytes);
    free(s);
}

static uint64_t fnv(uint64_t h, const unsigned char *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Under the call lock (client.c), at the boundary before minibatch `next`: if `next` is validated, its
 * start is copied out (what learning the state it changes in place needs: rewind.c). */
static struct snap *start;
static size_t nstart;
static int64_t start_for = -1;

void remote_validate_prepare(uint64_t next)
{
    free_snap(start, nstart);
    start = NULL;
    start_for = -1;
    if (!remote_recovery_enabled() || invalid || !validate_now(next))
        return;
    struct rcall c;
    validate_starting = 1;
    int32_t err = simple(JITCKPT_RFN_RST_SYNC, NULL, 0, &c);
    validate_starting = 0;
    if (err == 0 && (start = snapshot(&c, &nstart)) != NULL)
        start_for = (int64_t)next;
}

/* Under the call lock (client.c): the optimizer phase of `minibatch` begins. */
void remote_validate_begin(uint64_t minibatch)
{
    if (!remote_recovery_enabled() || !validate_now(minibatch) || validating >= 0)
        return;
    skip_for = (int64_t)minibatch;         /* until the copy is made: this rank cannot check, and why */
    if (invalid) {
        skip_code = "off";
        return;
    }
    struct rcall c;
    int32_t dev = -1;
    uint64_t done = 0;
    validate_starting = 1;                 /* the synchronisation waits for the minibatch's collectives */
    int32_t err = simple(JITCKPT_RFN_RST_HEALTH, NULL, 0, &c);
    validate_starting = 0;
    skip_code = "failed";
    if (err != 0 || rc_get(&c, &dev, sizeof dev) != 0 || rc_get(&c, &done, sizeof done) != 0 || dev != 0)
        return;                            /* a failure (recovered above, or to come): no validation now */
    calllog_drop_until(done);
    skip_code = calllog_first() != minibatch ? "behind" : calllog_noreplay(minibatch) ? "noreplay" : "copy";
    if (strcmp(skip_code, "copy") != 0)
        return;
    pre = snapshot(&c, &npre);
    if (pre) {
        validating = (int64_t)minibatch;
        skip_for = -1;
    }
}

/* Why a rank cannot take part in a check (its token's code). */
static const char *skip_text(const char *code)
{
    static const struct { const char *code, *text; } texts[] = {
        {"off", "its transparent recovery is off (said above)"},
        {"failed", "its device proxy failed (the recovery deals with it)"},
        {"behind", "its call log still holds earlier minibatches"},
        {"noreplay", "the minibatch creates or destroys a stream, an event or a library handle there"},
        {"copy", "its device memory could not be copied out"},
        {"unmarked", "its optimizer phase was not marked in this minibatch"},
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if (strcmp(code, texts[i].code) == 0)
            return texts[i].text;
    return code;
}

/* The state a recovery meets (S_pre, the state changed in place rewound: from `learn` copied out at the
 * start when given, else from rewind.c's save), the minibatch's allocations freed, the minibatch replayed,
 * synchronised, and copied out into *after.  NULL, or what failed. */
static const char *replay_from_pre(struct rcall *c, uint64_t minibatch, const struct rewind_range *learn,
                                   size_t nlearn, struct replay_state *rs, struct snap **after, size_t *nafter)
{
    for (size_t i = 0; i < npre; i++)
        if (pre[i].minibatch < minibatch && write_alloc(c, pre[i].addr, pre[i].bytes, pre[i].size) != 0)
            return "writing device memory back";
    if (learn) {
        for (size_t k = 0; k < nlearn; k++)
            for (size_t i = 0; i < nstart; i++)
                if (learn[k].addr >= start[i].addr && learn[k].addr + learn[k].bytes <= start[i].addr + start[i].size &&
                    write_alloc(c, learn[k].addr, start[i].bytes + (learn[k].addr - start[i].addr), learn[k].bytes))
                    return "writing the state changed in place back";
    } else if (remote_rewind_restore(c, minibatch) != 0) {
        return "writing the state changed in place back";
    }
    if (free_since(c, minibatch) != 0)
        return "freeing the minibatch's allocations";
    if (calllog_each(minibatch, 0, replay_one, NULL, rs) != 0)
        return "replaying the minibatch";
    if (simple(JITCKPT_RFN_RST_SYNC, NULL, 0, c) != 0)
        return "synchronising after the replay";
    if ((*after = snapshot(c, nafter)) == NULL)
        return "copying device memory out after the replay";
    return NULL;
}

/* The validation's meeting (generations from here: a recovery's count from 1). */
#define VALIDATE_GENERATION 1000000000L

struct agreement { int first; char code[16]; };

static int each_check(int r, const char *tok, void *arg)
{
    struct agreement *a = arg;
    int check = 0;
    char code[16] = "";
    if (sscanf(tok, "v1;check=%d;why=%15[a-z]", &check, code) < 1)
        return -1;
    if (!check && a->first < 0) {
        a->first = r;
        snprintf(a->code, sizeof a->code, "%s", code);
    }
    return 0;
}

/* Every rank, at the end of a minibatch that is due to be checked: whether every rank can check it (1), or
 * not (0: said, and a retry scheduled unless a rank's recovery is off), or -1 if the ranks could not meet.
 * Ranks that pass the same tokens decide the same. */
static int validate_agree(uint64_t minibatch, int can)
{
    char token[64];
    if (can)
        snprintf(token, sizeof token, "v1;check=1");
    else
        snprintf(token, sizeof token, "v1;check=0;why=%s", invalid ? "off"
                 : skip_for == (int64_t)minibatch && skip_code ? skip_code : "unmarked");
    struct agreement a = {-1, ""};
    if (rendezvous_tokens(token, VALIDATE_GENERATION + 2 * (long)minibatch, each_check, &a) != 0)
        return -1;
    if (a.first < 0) {
        validate_retries = 0;
        return 1;
    }
    int again = strcmp(a.code, "off") != 0 && validate_retries < VALIDATE_RETRIES;
    validate_retries = again ? validate_retries + 1 : 0;
    validate_retry = again ? (int64_t)minibatch + 1 : -1;
    if (!invalid)
        rlog("rank %d: replay validation at minibatch %llu is skipped on every rank: rank %d cannot take part (%s); "
             "%s%s", rank, (unsigned long long)minibatch, a.first, skip_text(a.code),
             again ? "it is tried again at the next minibatch" : "the next is at its usual time",
             again || validated_once ? "" : ".  No check has passed yet: until one does, a failure stops every rank "
                                            "(exit status 75) instead of a recovery");
    return 0;
}

static int each_learn(int r, const char *tok, void *arg)
{
    int learn = 0;
    (void)r;
    if (sscanf(tok, "v1;learn=%d", &learn) != 1)
        return -1;
    if (learn)
        *(int *)arg = 1;
    return 0;
}

#define REWIND_MAX_BYTES (256ull << 20)
#define REWIND_ALIGN 64u
#define REWIND_GAP 256u
static const char over_limits[] = "more than the limits of state to rewind (2048 ranges, 256 MiB)";

static int range_cmp(const void *a, const void *b)
{
    const struct rewind_range *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The ranges a replay must rewind to reproduce `end`: those rewound already and the bytes of memory older
 * than the minibatch where `after` differs from `end` (64-byte aligned, merged across gaps of up to 256
 * bytes inside one allocation).  The count, or -1 with *why (a difference in memory the minibatch made
 * itself, or more than the limits: then the replay is unfaithful, not state to rewind). */
static long learn_ranges(uint64_t minibatch, const struct snap *end, const struct snap *after, size_t n,
                         struct rewind_range **out, const char **why)
{
    const struct rewind_range *old, *hint;
    size_t nold = remote_rewind_ranges(&old), nhint = remote_rewind_hints(&hint), cap = nold + nhint + 64, k = 0;
    uint64_t scanned = 0;
    struct rewind_range *r = malloc(cap * sizeof *r);
    if (!r) {
        *why = "out of memory";
        return -1;
    }
    for (size_t i = 0; i < nold; i++)
        r[k++] = old[i];
    for (size_t i = 0; i < nhint; i++)           /* what library calls said they change (dnn.c), whole */
        r[k++] = hint[i];
    for (size_t i = 0; i < n; i++) {
        if (memcmp(end[i].bytes, after[i].bytes, end[i].size) == 0)
            continue;
        if (end[i].minibatch >= minibatch) {
            free(r);
            *why = "memory the minibatch allocated itself";
            return -1;
        }
        for (uint64_t b = 0; b < end[i].size;) {
            if (end[i].bytes[b] == after[i].bytes[b]) {
                b++;
                continue;
            }
            uint64_t lo = b - b % REWIND_ALIGN, last = b;
            for (uint64_t j = b + 1; j < end[i].size && j <= last + REWIND_GAP; j++)   /* across short equal runs */
                if (end[i].bytes[j] != after[i].bytes[j])
                    last = j;
            uint64_t hi = last + 1;
            hi = hi + (REWIND_ALIGN - hi % REWIND_ALIGN) % REWIND_ALIGN;
            if (hi > end[i].size)
                hi = end[i].size;
            if (k == cap) {
                cap *= 2;
                struct rewind_range *g = realloc(r, cap * sizeof *r);
                if (!g) {
                    free(r);
                    *why = "out of memory";
                    return -1;
                }
                r = g;
            }
            r[k++] = (struct rewind_range){end[i].addr + lo, hi - lo};
            b = hi;
            scanned += hi - lo;
            if (k > 4 * JITCKPT_REWIND_MAX_RANGES || scanned > REWIND_MAX_BYTES) {   /* no use going on */
                free(r);
                *why = over_limits;
                return -1;
            }
        }
    }
    qsort(r, k, sizeof *r, range_cmp);
    size_t m = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < k; i++) {
        int same_alloc = 0;
        for (size_t j = 0; m && j < n && !same_alloc; j++)
            same_alloc = r[m - 1].addr >= end[j].addr && r[m - 1].addr < end[j].addr + end[j].size &&
                         r[i].addr + r[i].bytes <= end[j].addr + end[j].size;
        if (m && same_alloc && r[i].addr <= r[m - 1].addr + r[m - 1].bytes + REWIND_GAP) {
            uint64_t e = r[i].addr + r[i].bytes > r[m - 1].addr + r[m - 1].bytes ? r[i].addr + r[i].bytes
                                                                                 : r[m - 1].addr + r[m - 1].bytes;
            r[m - 1].bytes = e - r[m - 1].addr;
        } else {
            r[m++] = r[i];
        }
    }
    for (size_t i = 0; i < m; i++)
        bytes += r[i].bytes;
    if (m > JITCKPT_REWIND_MAX_RANGES || bytes > REWIND_MAX_BYTES) {
        free(r);
        *why = over_limits;
        return -1;
    }
    *out = r;
    return (long)m;
}

/* Under the call lock: minibatch `minibatch` ended (its log segment is complete). */
void remote_validate_end(uint64_t minibatch)
{
    int due = validate_now(minibatch), can = validating == (int64_t)minibatch;
    validating = -1;
    if (validate_retry == (int64_t)minibatch)
        validate_retry = -1;
    const char *failed = NULL, *unlearnable = NULL;
    size_t nend = 0, nafter = 0;
    struct snap *end = NULL, *after = NULL;
    struct rewind_range *learned = NULL;
    long nlearned = -1;
    if (!due) {
        free_snap(pre, npre);
        pre = NULL;
        return;
    }
    double t0 = now_s();
    struct rcall c;
    in_recovery = watch_protocol = 1;          /* a failure during the check: the job stops (remote_recover) */
    busy = "replay validation";
    int agreed = validate_agree(minibatch, can);
    if (agreed < 0)
        give_up("replay validation at minibatch %llu: the ranks could not agree whether to check it (a rank "
                "failed or stopped meanwhile)", (unsigned long long)minibatch);
    if (!agreed)
        goto out;
    if (simple(JITCKPT_RFN_RST_SYNC, NULL, 0, &c) != 0 || (end = snapshot(&c, &nend)) == NULL) {
        failed = "copying device memory out";
        goto out;
    }
    uint64_t c1 = 1469598103934665603ull, c2 = c1;
    for (size_t i = 0; i < nend; i++)
        c1 = fnv(c1, end[i].bytes, end[i].size);
    /* Reset to the state a recovery would meet, then replay the whole minibatch. */
    struct replay_state rs = {0};
    failed = replay_from_pre(&c, minibatch, NULL, 0, &rs, &after, &nafter);
    uint64_t first_diff = 0;
    int same = !failed && nafter == nend;
    for (size_t i = 0; same && i < nafter; i++)
        same = after[i].size == end[i].size && after[i].addr == end[i].addr;
    if (same) {
        for (size_t i = 0; i < nafter; i++) {
            c2 = fnv(c2, after[i].bytes, after[i].size);
            if (!first_diff && memcmp(after[i].bytes, end[i].bytes, end[i].size) != 0)
                first_diff = after[i].addr;
        }
    }
    /* State changed in place: learn it (the start of the minibatch was copied out), and check again.  The
     * check replays the collectives too, so every rank makes it if any rank learned something. */
    if (!failed && same && (c1 != c2 || !remote_rewind_hints_covered()) && start_for == (int64_t)minibatch)
        nlearned = learn_ranges(minibatch, end, after, nend, &learned, &unlearnable);
    int retry = 0;
    if (!failed) {                                   /* every validating rank meets, whatever it found */
        char token[32];
        snprintf(token, sizeof token, "v1;learn=%d", nlearned >= 0);
        if (rendezvous_tokens(token, VALIDATE_GENERATION + 2 * (long)minibatch + 1, each_learn, &retry) != 0)
            failed = "agreeing with the other ranks on the state changed in place";
    }
    int learnt = nlearned >= 0;                      /* this rank found ranges to rewind */
    if (!failed && retry) {                          /* (one that did not checks again with what it rewinds) */
        free_snap(after, nafter);
        after = NULL;
        rs.calls = 0;
        failed = replay_from_pre(&c, minibatch, learnt ? learned : NULL, learnt ? (size_t)nlearned : 0, &rs, &after,
                                 &nafter);
        same = !failed && nafter == nend;
        c2 = 1469598103934665603ull;
        for (size_t i = 0; same && i < nafter; i++) {
            same = after[i].size == end[i].size && after[i].addr == end[i].addr;
            c2 = fnv(c2, after[i].bytes, after[i].size);
        }
        if (!failed && same && c1 == c2 && learnt && remote_rewind_adopt(learned, (size_t)nlearned, minibatch + 1))
            remote_recovery_off("rewind", "there is no pinned host memory shared with the device proxy for the "
                                "state the program changes in place");
        else if (!failed && same && c1 == c2 && learnt)
            rlog("rank %d: replay validation at minibatch %llu: the minibatch changes %llu bytes in %ld range(s) of "
                 "device memory in place before its optimizer step (BatchNorm's running statistics, counters); "
                 "with them rewound, the replay of %llu calls reproduces device memory (checksum %016llx).  They "
                 "are saved at every minibatch boundary from minibatch %llu on, and a recovery writes them back "
                 "before its replay", rank, (unsigned long long)minibatch, (unsigned long long)remote_rewind_bytes(),
                 nlearned, (unsigned long long)rs.calls, (unsigned long long)c1, (unsigned long long)minibatch + 1);
    }
    if (!failed && (!same || c1 != c2)) {
        invalid = "replay validation failed";
        rlog("rank %d: replay validation FAILED at minibatch %llu: replaying it from the call log does not reproduce "
             "device memory (checksum %016llx, replayed %016llx; first difference in the allocation at %#llx%s%s): "
             "the program changes device state the call log does not capture (a kernel with hidden state, a side "
             "channel into device memory).  Transparent recovery is OFF for this job: a failure will stop every "
             "rank (exit status %d) and the job falls back to its checkpoints.  Training goes on from the minibatch's own "
             "result (state the log cannot see, such as a kernel's own counters, was advanced by the check).",
             rank, (unsigned long long)minibatch, (unsigned long long)c1, (unsigned long long)c2,
             (unsigned long long)first_diff, unlearnable ? "; not state to rewind: it lies in " : "",
             unlearnable ? unlearnable : "", EXIT_NO_RECOVERY);
        for (size_t i = 0; i < nend && !failed; i++)       /* as if nothing had been checked */
            if (write_alloc(&c, end[i].addr, end[i].bytes, end[i].size) != 0)
                failed = "writing the minibatch's result back";
    } else if (!failed) {
        validated_once = 1;
        remote_rewind_learned();
        if (!learnt)
            rlog("rank %d: replay validation at minibatch %llu: the replay of %llu calls reproduces device memory "
                 "(checksum %016llx, %.0f ms)", rank, (unsigned long long)minibatch, (unsigned long long)rs.calls,
                 (unsigned long long)c1, (now_s() - t0) * 1e3);
    }
out:
    free(learned);
    free_snap(after, nafter);
    free_snap(end, nend);
    free_snap(pre, npre);
    pre = NULL;
    free_snap(start, nstart);
    start = NULL;
    start_for = -1;
    in_recovery = watch_protocol = 0;
    busy = NULL;
    if (failed)
        give_up("replay validation at minibatch %llu failed %s, and device memory may be changed",
                (unsigned long long)minibatch, failed);
}
