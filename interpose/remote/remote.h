/* remote.h -- internal declarations of libjitckpt_remote.so, the worker side
 * of transparent mode (proxy_server/README.md).
 *
 * The library is LD_PRELOADed instead of the passthrough library.  It
 * exports every CUDA runtime and NCCL function of the API: the generated
 * stubs (build/gen-remote/remote_stubs.c) marshal a call into the shared
 * segment's request ring and, unless it is asynchronous, wait for the
 * proxy's answer (client.c); the hand-written ones cover nvcc's hidden
 * registration and launch entry points (special.c) and pinned host memory
 * shared with the proxy (pinned.c); every function it cannot marshal yet is
 * refused by name (refuse.c).  Nothing here ever calls the real runtime's stateful
 * functions: the worker holds no device state.
 *
 * Concurrency: remote_begin() takes the library's one call lock and
 * remote_end() releases it; calls reach the proxy through the request ring
 * in the order they were made (client.c). */
#ifndef JITCKPT_REMOTE_H
#define JITCKPT_REMOTE_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>          /* the generated stubs' size expressions (strlen) */

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#ifdef JITCKPT_REMOTE_CUBLAS      /* the build forwards cuBLAS (interpose/Makefile: CUBLAS_INCLUDE) */
#include <cublas_api.h>
#endif
#ifdef JITCKPT_REMOTE_CUBLASLT    /* and cuBLASLt (cublasLt.h beside it; remote/blaslt.c) */
#include <stdio.h>
#include <cublasLt.h>
#endif
#ifdef JITCKPT_REMOTE_CUDNN       /* the build forwards cuDNN (interpose/Makefile: CUDNN_INCLUDE; remote/dnn.c) */
#include <stdbool.h>
#include <cudnn.h>
#endif

#include "jitckpt_remote_wire.h"
#include "remote_fns.h"

#define EXPORT __attribute__((visibility("default")))

/* One call being marshalled: cursors into the request, response and arena. */
struct rcall {
    struct jitckpt_wire *w;
    unsigned char *arena;
    size_t req, rep, arena_used;
    int overflow;             /* a request or arena overflow: the call is not sent */
    int has_out;              /* host bytes come back: the call waits for its answer */
    int program;              /* a call of the program (remote_begin, remote_begin_quiet): recovery may repair it */
    int arena_started;        /* arena_start is set */
    uint64_t arena_start;     /* the arena position of this call's first buffer */
    int32_t ret;
    /* host buffers, in marshalling order (marshal.c): where each one's size and
     * arena offset sit in the request, for replay and for a call made again
     * after a recovery (recover.c).  A direct buffer lies in a pinned region
     * shared with the proxy and crosses as its pointer (size 0 in the request):
     * buf_len is its real length, buf_ptr the program's pointer (otherwise the
     * arena's) */
    int nbuf;
    uint32_t buf_pos[4];
    uint32_t buf_out[4];
    uint32_t buf_direct[4];
    uint64_t buf_len[4];
    void *buf_ptr[4];
    /* the call log (calllog.c): set by remote_begin, not by remote_begin_locked */
    int log;
    int log_nin, log_in_over;
    const void *log_in[4];    /* the host inputs' bytes in the arena (a direct one's: the program's) */
    size_t log_in_len[4];
};

/* client.c: the connection, the call */
int remote_begin(struct rcall *c, unsigned fn);     /* 0, or -1 (no proxy; nothing held) */
/* The call lock, always (release with remote_end); 0 with a proxy to call, 1
 * without.  Not counted by JITCKPT_REMOTE_RESTART_AT, not logged (pinned.c). */
int remote_begin_quiet(struct rcall *c, unsigned fn);
int remote_send_fd(int fd, const void *msg, size_t n);   /* on the socket, SCM_RIGHTS; 0 or -1 */
int32_t remote_call(struct rcall *c);
void remote_end(struct rcall *c);
cudaError_t remote_unavailable(void);
void *remote_arena_alloc(struct rcall *c, size_t n, uint64_t *offset);
extern int remote_sync_all;                          /* JITCKPT_REMOTE_SYNC=1 */

/* generated (remote_stubs.c): 1 for the calls that are posted to the ring
 * without waiting (api_facts.py's remote_async column) */
extern const unsigned char remote_fn_async[RFN_count];

/* calllog.c: the minibatch call log (jitckpt_remote_calllog.h) */
void remote_log_call(struct rcall *c, uint32_t flags);
#define LOG_SKIP 0x100u          /* a query or a wait: not replayed */
#define LOG_NOREPLAY 0x200u      /* creates or destroys an object: a minibatch holding it cannot be replayed */
struct log_rec {                 /* one logged call, as calllog_each gives it */
    uint32_t fn, flags, req_len, nbuf;
    const unsigned char *req;
    const uint32_t *buf_pos, *buf_out, *buf_direct;
    const uint64_t *buf_len;
    const unsigned char *input;  /* the input buffers' bytes, in order */
};
uint64_t calllog_minibatch(void);                    /* the current (host) minibatch */
uint64_t calllog_first(void);                        /* the oldest minibatch still in the log */
int calllog_enabled(void);
const char *calllog_noreplay(uint64_t from);         /* why minibatches from..current cannot be replayed, or NULL */
void calllog_set_noreplay(const char *why);          /* the current minibatch cannot be replayed */
void calllog_unlog_last(void);                      /* the last logged call failed harmlessly: replays skip it */
void calllog_drop_until(uint64_t done);              /* drop minibatches < done (the device completed them) */
/* Calls fn for every logged call of minibatches >= from, in order, except the last
 * `skip_last` calls; seg_end(index) after each complete minibatch.  0, or fn's error. */
int32_t calllog_each(uint64_t from, int skip_last, int32_t (*fn)(const struct log_rec *r, void *arg),
                     void (*seg_end)(uint64_t index, void *arg), void *arg);
void calllog_skip_current(uint64_t new_minibatch);   /* recovery: drop everything; the next end makes new_minibatch */

/* client.c: recovery's access to the transport (recover.c) */
void remote_begin_locked(struct rcall *c, unsigned fn);
uint64_t remote_append_raw(struct rcall *c, uint32_t flags);   /* the ring position after it, or 0 */
int remote_wait(uint64_t until);                     /* 0, or -1: the proxy is gone */
struct jitckpt_wire *remote_wire(void);
uint64_t remote_ring_head(void);
int remote_reconnect(void);
int remote_proxy_alive(void);
extern int remote_skipping;                          /* recover.c: the rest of a failed optimizer step is skipped */

/* recover.c */
int remote_recovery_enabled(void);
int remote_recovery_active(void);                    /* enabled, and not turned off since (validation, managed, graphs) */
int remote_recovery_watch_protocol(void);            /* a protocol call's wait watches for a second failure */
int remote_recovery_check(void);                     /* under the call lock: 1 if a failure needs recovery */
int32_t remote_recover(struct rcall *c, const char *why, int memory_lost, int pending_logged);
#define RECOVER_SUSPECT 2            /* memory_lost: the driver is suspect: copy out, new proxy, copy back */
int remote_recoverable_error(unsigned fn, int32_t ret);
void remote_recovery_off(const char *code, const char *why);   /* state a replay cannot reset (pinned.c) */
void remote_mark_minibatch(uint64_t index);          /* calllog.c, at a minibatch end: the proxy's marker */
void remote_phase_begin(uint64_t index);             /* calllog.c: an optimizer phase begins (validation) */
void remote_validate_begin(uint64_t minibatch);      /* under the call lock */
void remote_validate_end(uint64_t minibatch);        /* under the call lock */
extern uint64_t remote_alloc_minibatch_of(uint64_t addr);
int32_t remote_write_device(struct rcall *c, uint64_t addr, const void *from, uint64_t n);  /* RST_WRITE */
void remote_validate_prepare(uint64_t next);         /* under the call lock: minibatch `next` begins */

/* rewind.c: state a minibatch changes in place before its optimizer step (under the call lock) */
struct rewind_range { uint64_t addr, bytes; };
size_t remote_rewind_ranges(const struct rewind_range **out);
uint64_t remote_rewind_bytes(void);                  /* bytes saved at each boundary (0: none) */
uint64_t remote_rewind_from(void);                   /* the first minibatch whose start is saved */
int remote_rewind_adopt(const struct rewind_range *r, size_t n, uint64_t from);
void remote_rewind_save(uint64_t minibatch);         /* at the boundary before `minibatch`, before its marker */
int32_t remote_rewind_restore(struct rcall *c, uint64_t minibatch);
void remote_rewind_hint(const char *why, uint64_t addr, uint64_t bytes);   /* a call changed these in place:
                                                        no recovery until validation has learned them */
size_t remote_rewind_hints(const struct rewind_range **out);
void remote_rewind_freed(uint64_t addr, uint64_t size);   /* restart.c: the program freed device memory */
int remote_rewind_intact(void);                      /* the slots are mapped by the current proxy */
int remote_rewind_hints_covered(void);               /* every announced range is rewound */
uint64_t remote_rewind_saved_upto(void);             /* the newest minibatch whose start is saved, or 0 */
const char *remote_rewind_unlearned(void);
void remote_rewind_learned(void);
/* pinned.c, under the call lock: pinned memory the proxy maps too (NULL: none could be had) */
void *remote_pinned_alloc_locked(size_t size);
void remote_pinned_free_locked(void *p);

/* marshal.c: arguments and results, in parameter order (jitckpt_remote_wire.h) */
void rc_put(struct rcall *c, const void *p, size_t n);
void rc_put_handle(struct rcall *c, const void *handle);
void rc_put_flag(struct rcall *c, int on);
void rc_put_string(struct rcall *c, const char *s);
void rc_put_in(struct rcall *c, const void *p, size_t n);        /* through the arena */
void *rc_put_out(struct rcall *c, size_t n);
/* A host buffer whose pointer already crossed (the generated stubs): one in a
 * pinned region shared with the proxy crosses as that pointer (direct). */
void rc_put_host_in(struct rcall *c, const void *p, size_t n);
void *rc_put_host_out(struct rcall *c, const void *p, size_t n);
/* A host buffer the call writes only in part (a 2D copy's rows): its bytes go over
 * too, so that the copy back leaves the rest as it was. */
void *rc_put_host_inout(struct rcall *c, const void *p, size_t n);
void rc_get_out(struct rcall *c, void *dst, const void *from, size_t n);
int rc_get(struct rcall *c, void *p, size_t n);
void rc_get_handle(struct rcall *c, void **handle);
const char *rc_get_string(struct rcall *c);

/* pinned.c: pinned host memory shared with the proxy (under the call lock) */
int remote_pinned_shared(const void *p, size_t n);   /* 1: [p, p+n) lies in a region the proxy has mapped */
void remote_pinned_reshare(void);                    /* a new proxy (restart.c): share every region again */
void remote_pinned_forked(void);                     /* in a forked child: private copies, no proxy */
int remote_pinned_is_managed(const void *p);         /* p lies in cudaMallocManaged memory */
int remote_free_managed(void *ptr);                  /* cudaFree of managed memory, or -1: not managed */
int remote_registered_range(const void *p);
int remote_live_libraries(void);                      /* library.c: libraries loaded and not unloaded */
int remote_kernel_unloaded(uint64_t kernel);          /* library.c: a kernel handle of an unloaded library */
int remote_capturing_now(void);                       /* graphs.c: a capture is under way: every call waits */
long remote_live_graphs(void);                        /* graphs.c: graphs and executable graphs alive */
void remote_capture_ended(cudaStream_t stream, cudaError_t ret, cudaGraph_t *pGraph);   /* graphs.c */
int remote_capture_end_check(cudaStream_t stream);   /* graphs.c: -1, or the error of ending on this thread */          /* p lies in memory the program cudaHostRegister'ed */

/* copykind.c: cudaMemcpyDefault and host-to-host copies, which the worker resolves itself */
enum cudaMemcpyKind remote_default_kind(const void *dst, const void *src);   /* NULL: a symbol (device) */
cudaError_t remote_copy_h2h(void *dst, const void *src, size_t count, cudaStream_t stream);
int remote_is_device_ptr(const void *p);             /* restart.c, under the call lock */
int remote_current_device(void);                     /* restart.c, under the call lock */
/* ptds.c: this thread's own stream where the program passed cudaStreamPerThread
 * (outside the call lock: it may create the stream) */
cudaStream_t remote_stream(cudaStream_t stream);
void remote_ptds_reset(void);
int remote_pointer_attributes_here(struct cudaPointerAttributes *attributes, const void *ptr);  /* -1: ask the proxy */

/* nccl_init.c */
size_t remote_nccl_type_size(ncclDataType_t datatype);

/* special.c: nvcc's hidden launch entry point (no header declares it) */
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);

/* refuse.c: functions and calls remote mode does not cover */
void remote_refuse(const char *name, const char *reason);
cudaError_t remote_refuse_call(const char *name, const char *condition);
void rlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* bypass.c: a driver function called (the generated driver_guard.c): stops the job, naming it and its caller */
void remote_driver_called(const char *function, const void *caller) __attribute__((noreturn));
/* bypass.c: around a pure function of the real library (1 before, 0 after): it finds no CUDA driver */
void remote_pure_call(int entering);

/* refuse.c too: pure functions (cudaGetErrorString) called in-process */
enum { remote_next_cudart, remote_next_nccl, remote_next_cublas, remote_next_cublaslt, remote_next_cudnn };
#ifdef JITCKPT_REMOTE_CUBLAS
/* blas.c: each cuBLAS handle's pointer mode and stream, as the worker set them */
void remote_blas_created(cublasHandle_t *h);
void remote_blas_destroyed(cublasHandle_t h);
void remote_blas_set_pointer_mode(cublasHandle_t h, cublasPointerMode_t mode);
void remote_blas_set_stream(cublasHandle_t h, cudaStream_t stream);
void remote_blas_set_math_mode(cublasHandle_t h, cublasMath_t mode);
void remote_blas_set_workspace(cublasHandle_t h, void *workspace, size_t bytes);
int32_t remote_blas_recreate(struct rcall *c, int32_t (*set_device)(struct rcall *c, int device));
void remote_blas_minibatch_begins(void);
size_t remote_blas_scalar_bytes(cublasHandle_t h, const void *scalar, size_t host_bytes); /* 0: crosses as is */
int remote_blas_get_stream(cublasHandle_t h, cudaStream_t *stream);
#endif
#ifdef JITCKPT_REMOTE_CUDNN
/* dnn.c: cuDNN handles (stream, device), the legacy tensor descriptors kept here, the backend descriptors'
 * definitions (for a restart) */
void remote_dnn_created(cudnnHandle_t *h);
void remote_dnn_destroyed(cudnnHandle_t h);
void remote_dnn_set_stream(cudnnHandle_t h, cudaStream_t stream);
int remote_dnn_get_stream(cudnnHandle_t h, cudaStream_t *stream);
void remote_dnn_put_tensor(struct rcall *c, cudnnTensorDescriptor_t desc);
size_t remote_dnn_scalar_bytes(cudnnTensorDescriptor_t desc, const void *scalar);
int32_t remote_dnn_recreate(struct rcall *c, int32_t (*set_device)(struct rcall *c, int device));
void remote_dnn_minibatch_begins(void);
void remote_dnn_running_stats(const void *desc, const void *mean, const void *variance, double factor);
#endif
void *remote_local_fn(void **cache, const char *name, int lib);

#endif
