/* jitckpt_remote_calllog.h -- the minibatch call log of transparent mode
 * (milestone 3a: recording only; proxy_server/README.md, "The call log").
 *
 * libjitckpt_remote.so (the worker side) keeps every call it forwarded to
 * its device proxy since the start of the current minibatch: the request
 * record the ring carries (function id, marshalled arguments) plus the bytes
 * of its host inputs (H2D sources, fatbinary images).  The proxy-restart
 * protocol's own calls are not logged.
 *
 * Minibatch boundaries come from the program.  A native program looks the two
 * phase functions up at run time, so that it still links and runs without
 * jitckpt:
 *
 *     void (*begin)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "jitckpt_phase_optimizer_begin");
 *     void (*end)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "jitckpt_phase_optimizer_end");
 *     ... forward, backward ...
 *     if (begin) begin();
 *     ... optimizer step ...
 *     if (end) end();
 *
 * jitckpt_phase_optimizer_end() ends minibatch i and starts minibatch i+1:
 * the log is cleared.  jitckpt_phase_optimizer_begin() records where the
 * optimizer phase starts in the log.  The passthrough library
 * (libjitckpt_interpose.so) exports both as no-ops.
 *
 * Memory: the log is capped by JITCKPT_REMOTE_LOG_MIB (default 1024; 0: no
 * log).  A minibatch whose calls exceed the cap switches the log off for the
 * rest of the process, said once on stderr: replay is then unavailable.
 *
 * The inspection calls below are exported by libjitckpt_remote.so only
 * (version node JITCKPT_REMOTE_1); find them with dlsym. */
#ifndef JITCKPT_REMOTE_CALLLOG_H
#define JITCKPT_REMOTE_CALLLOG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JITCKPT_REMOTE_LOG_MIB_ENV "JITCKPT_REMOTE_LOG_MIB"
#define JITCKPT_REMOTE_LOG_DEFAULT_MIB 1024
/* 1: one line on stderr at every minibatch end with the stats of the minibatch that ended. */
#define JITCKPT_REMOTE_LOG_TRACE_ENV "JITCKPT_REMOTE_LOG_TRACE"

struct jitckpt_remote_log_stats {
    uint64_t minibatch;          /* the current minibatch: jitckpt_phase_optimizer_end() calls so far */
    uint64_t calls;              /* calls in the log (since the current minibatch started) */
    uint64_t bytes;              /* the log's size: per-call headers, requests and host input bytes */
    uint64_t input_bytes;        /* of which host input bytes (H2D sources, fatbinary images) */
    int64_t optimizer_call;      /* the index in the log of the first call of the optimizer phase; -1: not begun */
    uint64_t optimizer_bytes;    /* the log's size when the optimizer phase began (0 if not begun) */
    uint64_t cap_bytes;          /* JITCKPT_REMOTE_LOG_MIB in bytes */
    uint64_t total_calls;        /* calls logged since the process started (every minibatch) */
    int32_t enabled;             /* 1: logging; 0: off (cap exceeded, or JITCKPT_REMOTE_LOG_MIB=0) */
    int32_t in_optimizer;        /* 1 between optimizer_begin and optimizer_end */
};

/* One logged call, as jitckpt_remote_log_entry returns it; the pointers stay
 * valid until the next CUDA call or phase function of any thread. */
struct jitckpt_remote_log_entry {
    uint32_t fn;                 /* enum remote_fn (the wire's function id) */
    uint32_t flags;              /* JITCKPT_REC_SYNC: the call waited for its answer */
    uint32_t req_len;
    const void *req;             /* the marshalled request, as in the ring (arena offsets included) */
    uint64_t input_len;
    const void *input;           /* the host input bytes, in the order the call marshalled them */
};

void jitckpt_phase_optimizer_begin(void);
void jitckpt_phase_optimizer_end(void);
int jitckpt_remote_log_stats(struct jitckpt_remote_log_stats *out);          /* 0 */
int jitckpt_remote_log_entry(uint64_t index, struct jitckpt_remote_log_entry *out); /* 0, or -1: no such call */

#ifdef __cplusplus
}
#endif

#endif
