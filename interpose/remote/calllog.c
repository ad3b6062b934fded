/* calllog.c -- the minibatch call log (transparent mode, milestone 3a:
 * recording only; include/jitckpt_remote_calllog.h, proxy_server/README.md).
 *
 * Every call remote_call() appended to the request ring, made through
 * remote_begin() (so not the proxy-restart protocol's own calls, which
 * restart.c starts with remote_begin_locked()), is copied here: a header,
 * the request bytes exactly as in the ring, and the call's host input bytes
 * (read back from the arena, where marshal.c put them; only the worker writes
 * the arena, under the call lock, so they are still there).  The program's
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

struct lrec {
    uint32_t fn, flags, req_len, pad;
    uint64_t input_len;
};

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *buf;
static size_t len, allocated, cap;
static int enabled = -1;              /* -1: not configured yet */
static int trace;
static uint64_t minibatch, calls, input_bytes, total_calls;
static int64_t optimizer_call = -1;
static uint64_t optimizer_bytes;

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
    enabled = 0;
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
    size_t need = (sizeof(struct lrec) + c->req + in + 7) & ~(size_t)7;
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
    struct lrec r = {c->w->fn, flags, (uint32_t)c->req, 0, in};
    unsigned char *at = buf + len;
    memcpy(at, &r, sizeof r);
    memcpy(at + sizeof r, c->w->req, c->req);
    at += sizeof r + c->req;
    for (int i = 0; i < c->log_nin; i++) {
        memcpy(at, c->log_in[i], c->log_in_len[i]);
        at += c->log_in_len[i];
    }
    len += need;
    calls++;
    total_calls++;
    input_bytes += in;
out:
    pthread_mutex_unlock(&log_lock);
}

EXPORT void jitckpt_phase_optimizer_begin(void)
{
    pthread_mutex_lock(&log_lock);
    configure();
    if (optimizer_call < 0) {
        optimizer_call = (int64_t)calls;
        optimizer_bytes = len;
    }
    pthread_mutex_unlock(&log_lock);
}

EXPORT void jitckpt_phase_optimizer_end(void)
{
    pthread_mutex_lock(&log_lock);
    configure();
    if (trace)
        rlog("call log: minibatch %llu ended: %llu calls, %llu bytes, %llu input bytes, optimizer phase from call "
             "%lld (%s)", (unsigned long long)minibatch, (unsigned long long)calls, (unsigned long long)len,
             (unsigned long long)input_bytes, (long long)optimizer_call, enabled ? "logging" : "off");
    minibatch++;
    len = 0;
    calls = input_bytes = 0;
    optimizer_call = -1;
    optimizer_bytes = 0;
    pthread_mutex_unlock(&log_lock);
}

/* JITCKPT_REMOTE_LOG_TRACE=1: the log as the process ends, too (a program that never calls
 * the phase functions is one long minibatch). */
__attribute__((destructor)) static void trace_at_exit(void)
{
    if (trace)
        rlog("call log at exit: minibatch %llu: %llu calls, %llu bytes, %llu input bytes, %llu calls logged in all "
             "(%s)", (unsigned long long)minibatch, (unsigned long long)calls, (unsigned long long)len,
             (unsigned long long)input_bytes, (unsigned long long)total_calls, enabled ? "logging" : "off");
}

EXPORT int jitckpt_remote_log_stats(struct jitckpt_remote_log_stats *out)
{
    if (out == NULL)
        return -1;
    pthread_mutex_lock(&log_lock);
    configure();
    *out = (struct jitckpt_remote_log_stats){
        .minibatch = minibatch, .calls = calls, .bytes = len, .input_bytes = input_bytes,
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
        size_t at = 0;
        for (uint64_t i = 0;; i++) {
            struct lrec r;
            memcpy(&r, buf + at, sizeof r);
            if (i == index) {
                *out = (struct jitckpt_remote_log_entry){r.fn, r.flags, r.req_len, buf + at + sizeof r,
                                                         r.input_len, buf + at + sizeof r + r.req_len};
                ret = 0;
                break;
            }
            at += (sizeof r + r.req_len + r.input_len + 7) & ~(size_t)7;
        }
    }
    pthread_mutex_unlock(&log_lock);
    return ret;
}
