/* calllog.c -- the minibatch call log (transparent mode, milestone 3a:
 * recording only; include/jitckpt_remote_calllog.h, proxy_server/README.md).
 *
 * Every call remote_call() appended to the request ring, made through
 * remote_begin() (so not the proxy-restart protocol's own calls, which
 * restart.c starts with remote_begin_locked()), is copied here: a header,
 * the request bytes exactly as in the ring, and the call's host input bytes
 * (read back from the arena, where marshal.c put them; only the worker writes
 * the arena, under the call lock, so they are still there; an input in pinned
 * memory shared with the proxy is read from the program's buffer, at the
 * call, which is what the device reads if the program keeps CUDA's rules).
 * Neither cudaHostAlloc nor cudaFreeHost is logged: they change no device
 * state (pinned.c).  The program's
 * jitckpt_phase_optimizer_end() clears the log (a new minibatch begins);
 * jitckpt_phase_optimizer_begin() notes where the optimizer phase starts.
 *
 * One flat buffer, grown by doubling up to the cap (JITCKPT_REMOTE_LOG_MIB);
 * clearing keeps it, so a steady job allocates once.  A call that would take
 * the log past the cap switches logging off for the rest of the process (the
 * buffer is freed; said once): replay is then unavailable, and the job runs on
 * exactly as before.  Own lock (taken under the call lock by the logging
 * call, alone by the phase functions). */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitckpt_remote_calllog.h"
#include "remote.h"

/* One logged call: this header, the request, nbuf buffer descriptors (the
 * position of each host buffer's size and arena offset in the request, out
 * flag, direct flag, length), then the input buffers' bytes.  A direct buffer
 * (in pinned memory shared with the proxy) is size 0 in the request: its
 * length is here, and a replay puts it in the arena (recover.c). */
struct lrec {
    uint32_t fn, flags, req_len, nbuf;
    uint64_t input_len;
};
struct lbuf { uint32_t pos; uint16_t out, direct; uint64_t len; };

#define REC_SIZE(r) ((sizeof(struct lrec) + (r).req_len + (r).nbuf * sizeof(struct lbuf) + (r).input_len + 7) & \
                     ~(size_t)7)

/* The log holds the minibatches the device has not completed yet
 * (segments): the host runs ahead, so after a failure the replay starts at
 * the oldest one (recover.c).  The last segment is the current minibatch. */
#define MAX_SEGS 256
struct seg { uint64_t index, off, calls; const char *noreplay; };

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *buf;
static size_t len, allocated, cap;
static int enabled = -1;              /* -1: not configured yet */
static int trace;
static uint64_t minibatch, calls, input_bytes, total_calls;
static int64_t last_off = -1;     /* the last record's offset (calllog_unlog_last), -1: none */
static int64_t optimizer_call = -1;
static uint64_t optimizer_bytes;
static struct seg segs[MAX_SEGS] = {{0, 0, 0, "it holds the program's set-up"}};
static int nsegs = 1;

static void configure(void)
{
    if (enabled >= 0)
        return;
    unsigned long long mib = JITCKPT_REMOTE_LOG_DEFAULT_MIB;
    const char *s = getenv(JITCKPT_REMOTE_LOG_MIB_ENV);
    if (s && *s) {
        char *end;
        mib = strtoull(s, &end, 10);
        if (*end != '\0' || mib > (1ull << 30)) {
            rlog(JITCKPT_REMOTE_LOG_MIB_ENV "=%s is not a number of MiB; using %d", s, JITCKPT_REMOTE_LOG_DEFAULT_MIB);
            mib = JITCKPT_REMOTE_LOG_DEFAULT_MIB;
        }
    }
    cap = (size_t)mib << 20;
    enabled = cap > 0;
    if (!enabled)
        rlog("call log: off (" JITCKPT_REMOTE_LOG_MIB_ENV "=0): replay is unavailable");
    const char *t = getenv(JITCKPT_REMOTE_LOG_TRACE_ENV);
    trace = t && *t && strcmp(t, "0") != 0;
}

static void switch_off(size_t need)
{
    rlog("call log: minibatch %llu needs more than " JITCKPT_REMOTE_LOG_MIB_ENV "=%llu MiB (%llu calls, %llu bytes "
         "logged, the next needs %llu); the call log is off for the rest of this process: replay is unavailable",
         (unsigned long long)minibatch, (unsigned long long)(cap >> 20), (unsigned long long)calls,
         (unsigned long long)len, (unsigned long long)need);
    free(buf);
    buf = NULL;
    len = allocated = 0;
    calls = input_bytes = 0;
    optimizer_call = -1;
    optimizer_bytes = 0;
    segs[0] = (struct seg){minibatch, 0, 0, NULL};
    nsegs = 1;
    enabled = 0;
}

/* Queries and waits change nothing a replay needs; objects created or
 * destroyed inside a minibatch would need their handles re-bound. */
static uint32_t classify(unsigned fn)
{
    switch (fn) {
    case RFN_cudaEventQuery: case RFN_cudaStreamQuery: case RFN_cudaGetLastError: case RFN_cudaPeekAtLastError:
    case RFN_ncclCommGetAsyncError: case RFN_cudaGetDevice: case RFN_cudaGetDeviceCount:
    case RFN_cudaGetDeviceProperties: case RFN_cudaDeviceGetAttribute: case RFN_cudaFuncGetParamInfo:
    case RFN_cudaFuncGetName: case RFN_cudaEventSynchronize: case RFN_cudaStreamSynchronize:
    case RFN_cudaDeviceSynchronize: case RFN_cudaEventElapsedTime: case RFN_cudaMemGetInfo:
    case RFN_ncclCommCount: case RFN_ncclCommUserRank: case RFN_ncclCommCuDevice: case RFN_ncclGetVersion:
    case RFN_cudaStreamGetFlags: case RFN_cudaStreamGetPriority: case RFN_cudaGetSymbolAddress:
    case RFN_cudaGetSymbolSize: case RFN_cudaDriverGetVersion: case RFN_cudaRuntimeGetVersion:
    case RFN___cudaPushCallConfiguration: case RFN___cudaPopCallConfiguration:
    case RFN_cudaDeviceCanAccessPeer: case RFN_cudaDeviceGetByPCIBusId: case RFN_cudaDeviceGetPCIBusId:
    case RFN_cudaDeviceGetCacheConfig: case RFN_cudaDeviceGetLimit: case RFN_cudaDeviceGetStreamPriorityRange:
    case RFN_cudaGetDeviceFlags: case RFN_cudaStreamGetDevice: case RFN_cudaStreamGetId:
    case RFN_cudaStreamIsCapturing: case RFN_cudaFuncGetAttributes: case RFN_cudaPointerGetAttributes:
    case RFN_cudaProfilerStart: case RFN_cudaProfilerStop: case RFN_cudaLibraryGetKernelCount:
    case RFN_cudaOccupancyMaxActiveBlocksPerMultiprocessor:
    case RFN_cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags:
#ifdef JITCKPT_REMOTE_CUBLASLT
    case RFN_cublasLtMatmulAlgoGetHeuristic: case RFN_cublasLtMatmulDescGetAttribute:
    case RFN_cublasLtMatrixLayoutGetAttribute: case RFN_cublasLtMatmulPreferenceGetAttribute:
#endif
#ifdef JITCKPT_REMOTE_CUDNN
    /* a backend descriptor's definition: kept by dnn.c and played to a new proxy before any replay */
    case RFN_cudnnBackendCreateDescriptor: case RFN_cudnnBackendSetAttribute: case RFN_cudnnBackendGetAttribute:
    case RFN_cudnnBackendFinalize: case RFN_cudnnBackendDestroyDescriptor: case RFN_cudnnGetStream:
    case RFN_cudnnBackendInitialize:     /* (a variant pack's question to the proxy's cuDNN: dnn.c) */
    case RFN_cudnnGetLastErrorString:
    case RFN_cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize:
    case RFN_cudnnGetBatchNormalizationBackwardExWorkspaceSize:
    case RFN_cudnnGetBatchNormalizationTrainingExReserveSpaceSize:
#endif
        return LOG_SKIP;
    case RFN_cudaEventCreate: case RFN_cudaEventCreateWithFlags: case RFN_cudaEventDestroy:
    case RFN_cudaStreamCreate: case RFN_cudaStreamCreateWithFlags: case RFN_cudaStreamCreateWithPriority:
    case RFN_cudaStreamDestroy: case RFN_ncclCommAbort: case RFN_ncclCommDestroy: case RFN_ncclCommInitRank:
    case RFN_ncclGetUniqueId: case RFN___cudaRegisterFatBinary: case RFN___cudaRegisterFatBinaryEnd:
    case RFN___cudaRegisterFunction: case RFN___cudaRegisterVar: case RFN___cudaUnregisterFatBinary:
    case RFN___cudaInitModule: case RFN___cudaGetKernel: case RFN_cudaHostAlloc: case RFN_cudaMallocHost:
    case RFN_cudaFreeHost: case RFN_cudaDeviceReset: case RFN_ncclCommInitRankConfig: case RFN_ncclCommInitAll:
    case RFN_ncclCommFinalize: case RFN_cudaGetFuncBySymbol: case RFN_cudaLaunchHostFunc: case RFN_cudaStreamAddCallback:
    case RFN_cudaLibraryLoadData: case RFN_cudaLibraryEnumerateKernels: case RFN_cudaLibraryGetKernel:
    case RFN_cudaLibraryUnload: case RFN_cudaStreamBeginCapture: case RFN_cudaStreamEndCapture:
    case RFN_cudaGraphInstantiate: case RFN_cudaGraphInstantiateWithFlags: case RFN_cudaGraphLaunch:
    case RFN_cudaGraphExecDestroy: case RFN_cudaGraphDestroy:
#ifdef JITCKPT_REMOTE_CUBLAS
    case RFN_cublasCreate_v2: case RFN_cublasDestroy_v2:
#endif
#ifdef JITCKPT_REMOTE_CUDNN
    case RFN_cudnnCreate: case RFN_cudnnDestroy:
#endif
        return LOG_NOREPLAY;
    default:
        return fn < RFN_count ? 0 : LOG_NOREPLAY;
    }
}

void remote_log_call(struct rcall *c, uint32_t flags)
{
    pthread_mutex_lock(&log_lock);
    configure();
    if (!enabled)
        goto out;
    uint64_t in = 0;
    for (int i = 0; i < c->log_nin; i++)
        in += c->log_in_len[i];
    unsigned fn = c->w->fn;
    flags |= classify(fn);
    if ((flags & LOG_NOREPLAY) && !segs[nsegs - 1].noreplay)
        segs[nsegs - 1].noreplay = "it creates or destroys a stream, event, communicator, module or library handle";
    struct lrec r = {fn, flags, (uint32_t)c->req, (uint32_t)c->nbuf, in};
    size_t need = REC_SIZE(r);
    if (c->log_in_over || len + need > cap) {
        switch_off(need);
        goto out;
    }
    if (len + need > allocated) {
        size_t n = allocated ? allocated : (1u << 20);
        while (n < len + need)
            n *= 2;
        if (n > cap)
            n = cap;
        unsigned char *p = realloc(buf, n);
        if (p == NULL) {
            switch_off(need);
            goto out;
        }
        buf = p;
        allocated = n;
    }
    unsigned char *at = buf + len;
    last_off = (int64_t)len;
    memcpy(at, &r, sizeof r);
    memcpy(at + sizeof r, c->w->req, c->req);
    at += sizeof r + c->req;
    for (int i = 0; i < c->nbuf; i++) {
        struct lbuf b = {c->buf_pos[i], (uint16_t)c->buf_out[i], (uint16_t)c->buf_direct[i], c->buf_len[i]};
        memcpy(at, &b, sizeof b);
        at += sizeof b;
    }
    for (int i = 0; i < c->log_nin; i++) {
        memcpy(at, c->log_in[i], c->log_in_len[i]);
        at += c->log_in_len[i];
    }
    len += need;
    calls++;
    segs[nsegs - 1].calls++;
    total_calls++;
    input_bytes += in;
out:
    pthread_mutex_unlock(&log_lock);
}

/* ---- what recovery reads (recover.c; under the call lock) --------------------------- */

/* The program's last call, just logged, failed without touching the device (a cuBLAS or cuDNN call that
 * returned an error): a replay skips it (it would fail again, and stop the recovery).  Under the call lock,
 * before the next call is logged. */
void calllog_unlog_last(void)
{
    pthread_mutex_lock(&log_lock);
    if (enabled > 0 && last_off >= 0 && (size_t)last_off + sizeof(struct lrec) <= len) {
        struct lrec r;
        memcpy(&r, buf + last_off, sizeof r);
        r.flags |= LOG_SKIP;
        memcpy(buf + last_off, &r, sizeof r);
    }
    pthread_mutex_unlock(&log_lock);
}

uint64_t calllog_minibatch(void) { return minibatch; }

int calllog_enabled(void)
{
    pthread_mutex_lock(&log_lock);
    configure();
    int e = enabled;
    pthread_mutex_unlock(&log_lock);
    return e;
}

uint64_t calllog_first(void)
{
    pthread_mutex_lock(&log_lock);
    uint64_t f = segs[0].index;
    pthread_mutex_unlock(&log_lock);
    return f;
}

const char *calllog_noreplay(uint64_t from)
{
    const char *why = NULL;
    pthread_mutex_lock(&log_lock);
    if (!enabled)
        why = "the call log is off";
    else if (from < segs[0].index)
        why = "the minibatch is no longer in the call log";
    for (int i = 0; i < nsegs && !why; i++)
        if (segs[i].index >= from && segs[i].noreplay)
            why = segs[i].noreplay;
    pthread_mutex_unlock(&log_lock);
    return why;
}

void calllog_set_noreplay(const char *why)
{
    pthread_mutex_lock(&log_lock);
    if (!segs[nsegs - 1].noreplay)
        segs[nsegs - 1].noreplay = why;
    pthread_mutex_unlock(&log_lock);
}

void calllog_drop_until(uint64_t done)
{
    pthread_mutex_lock(&log_lock);
    int k = 0;
    while (k < nsegs - 1 && segs[k].index < done)
        k++;
    if (k > 0) {
        uint64_t off = segs[k].off;
        memmove(buf, buf + off, len - off);
        len -= off;
        last_off = last_off >= (int64_t)off ? last_off - (int64_t)off : -1;
        for (int i = k; i < nsegs; i++) {
            segs[i - k] = segs[i];
            segs[i - k].off -= off;
        }
        nsegs -= k;
    }
    pthread_mutex_unlock(&log_lock);
}

void calllog_skip_current(uint64_t new_minibatch)
{
    pthread_mutex_lock(&log_lock);
    len = 0;
    last_off = -1;
    calls = input_bytes = 0;
    optimizer_call = -1;
    optimizer_bytes = 0;
    minibatch = new_minibatch;
    segs[0] = (struct seg){new_minibatch, 0, 0, NULL};
    nsegs = 1;
    pthread_mutex_unlock(&log_lock);
}

int32_t calllog_each(uint64_t from, int skip_last, int32_t (*fn)(const struct log_rec *r, void *arg),
                     void (*seg_end)(uint64_t index, void *arg), void *arg)
{
    /* Under the call lock: nothing is logged meanwhile (recover.c holds it). */
    uint64_t total = 0;
    for (int i = 0; i < nsegs; i++)
        if (segs[i].index >= from)
            total += segs[i].calls;
    uint64_t n = 0;
    for (int i = 0; i < nsegs; i++) {
        if (segs[i].index < from)
            continue;
        size_t at = segs[i].off, end = i + 1 < nsegs ? segs[i + 1].off : len;
        while (at < end) {
            struct lrec r;
            memcpy(&r, buf + at, sizeof r);
            if (n++ >= total - (uint64_t)skip_last)
                return 0;
            const unsigned char *p = buf + at + sizeof r;
            struct log_rec lr = {r.fn, r.flags, r.req_len, r.nbuf, p, NULL, NULL, NULL, NULL, NULL};
            static __thread struct lbuf b[4];
            static __thread uint32_t pos[4], out[4], direct[4];
            static __thread uint64_t blen[4];
            memcpy(b, p + r.req_len, r.nbuf * sizeof(struct lbuf));
            for (uint32_t j = 0; j < r.nbuf && j < 4; j++) {
                pos[j] = b[j].pos;
                out[j] = b[j].out;
                direct[j] = b[j].direct;
                blen[j] = b[j].len;
            }
            lr.buf_pos = pos;
            lr.buf_out = out;
            lr.buf_direct = direct;
            lr.buf_len = blen;
            lr.input = p + r.req_len + r.nbuf * sizeof(struct lbuf);
            int32_t err = fn(&lr, arg);
            if (err)
                return err;
            at += REC_SIZE(r);
        }
        if (i + 1 < nsegs && seg_end)
            seg_end(segs[i].index, arg);
    }
    return 0;
}

EXPORT void jitckpt_phase_optimizer_begin(void)
{
    pthread_mutex_lock(&log_lock);
    configure();
    int first = optimizer_call < 0;
    if (first) {
        optimizer_call = (int64_t)calls;
        optimizer_bytes = len - segs[nsegs - 1].off;
    }
    uint64_t m = minibatch;
    pthread_mutex_unlock(&log_lock);
    if (first)
        remote_phase_begin(m);          /* recover.c: replay validation may begin here */
}

EXPORT void jitckpt_phase_optimizer_end(void)
{
    pthread_mutex_lock(&log_lock);
    configure();
    if (trace)
        rlog("call log: minibatch %llu ended: %llu calls, %llu bytes, %llu input bytes, optimizer phase from call "
             "%lld (%s)", (unsigned long long)minibatch, (unsigned long long)calls,
             (unsigned long long)(len - segs[nsegs - 1].off), (unsigned long long)input_bytes, (long long)optimizer_call, enabled ? "logging" : "off");
    uint64_t ended = minibatch++;
    calls = input_bytes = 0;
    optimizer_call = -1;
    optimizer_bytes = 0;
    if (nsegs == MAX_SEGS) {            /* the device is very far behind: the oldest can no longer be replayed */
        size_t off = segs[1].off;
        memmove(buf, buf + off, len - off);
        len -= off;
        last_off = last_off >= (int64_t)off ? last_off - (int64_t)off : -1;
        for (int i = 1; i < nsegs; i++) {
            segs[i - 1] = segs[i];
            segs[i - 1].off -= off;
        }
        nsegs--;
    }
    segs[nsegs++] = (struct seg){minibatch, len, 0, NULL};
    if (!remote_recovery_enabled()) {   /* nothing replays: keep only the new minibatch, as cleared */
        len = 0;
        last_off = -1;
        segs[0] = (struct seg){minibatch, 0, 0, NULL};
        nsegs = 1;
    }
    pthread_mutex_unlock(&log_lock);
    remote_mark_minibatch(ended);       /* recover.c: the proxy's marker, so that completed ones leave the log */
#ifdef JITCKPT_REMOTE_CUBLAS
    remote_blas_minibatch_begins();     /* blas.c: every cuBLAS handle's settings open the new minibatch's log */
#endif
#ifdef JITCKPT_REMOTE_CUDNN
    remote_dnn_minibatch_begins();      /* dnn.c: likewise every cuDNN handle's stream */
#endif
}

/* JITCKPT_REMOTE_LOG_TRACE=1: the log as the process ends, too (a program that never calls
 * the phase functions is one long minibatch). */
__attribute__((destructor)) static void trace_at_exit(void)
{
    if (trace)
        rlog("call log at exit: minibatch %llu: %llu calls, %llu bytes, %llu input bytes, %llu calls logged in all "
             "(%s)", (unsigned long long)minibatch, (unsigned long long)calls,
             (unsigned long long)(len - segs[nsegs - 1].off), (unsigned long long)input_bytes,
             (unsigned long long)total_calls, enabled ? "logging" : "off");
}

EXPORT int jitckpt_remote_log_stats(struct jitckpt_remote_log_stats *out)
{
    if (out == NULL)
        return -1;
    pthread_mutex_lock(&log_lock);
    configure();
    *out = (struct jitckpt_remote_log_stats){
        .minibatch = minibatch, .calls = calls, .bytes = len - segs[nsegs - 1].off, .input_bytes = input_bytes,
        .optimizer_call = optimizer_call, .optimizer_bytes = optimizer_bytes, .cap_bytes = cap,
        .total_calls = total_calls, .enabled = enabled, .in_optimizer = optimizer_call >= 0};
    pthread_mutex_unlock(&log_lock);
    return 0;
}

EXPORT int jitckpt_remote_log_entry(uint64_t index, struct jitckpt_remote_log_entry *out)
{
    int ret = -1;
    pthread_mutex_lock(&log_lock);
    if (out != NULL && index < calls) {
        size_t at = segs[nsegs - 1].off;        /* the current minibatch's calls */
        for (uint64_t i = 0;; i++) {
            struct lrec r;
            memcpy(&r, buf + at, sizeof r);
            if (i == index) {
                *out = (struct jitckpt_remote_log_entry){r.fn, r.flags & JITCKPT_REC_SYNC, r.req_len,
                                                         buf + at + sizeof r, r.input_len,
                                                         buf + at + sizeof r + r.req_len +
                                                             r.nbuf * sizeof(struct lbuf)};
                ret = 0;
                break;
            }
            at += REC_SIZE(r);
        }
    }
    pthread_mutex_unlock(&log_lock);
    return ret;
}
