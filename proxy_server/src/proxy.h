/* proxy.h -- internal declarations of jitckpt-proxy, the device proxy of
 * transparent mode (../README.md).
 *
 * One proxy serves one worker.  It loads the CUDA runtime and NCCL at run
 * time (libs.c), creates the shared segment (segment.c), accepts its worker
 * on a Unix socket after checking the peer's credentials (listen.c), and
 * executes the calls the worker sends (serve.c) through the generated
 * dispatch (build/gen/proxy_dispatch.c) and the hand-written one
 * (special.c), translating virtual handles (handles.c); the worker's pinned
 * host memory is mapped here too (pinned.c).  Single-threaded:
 * every call runs on the main thread, in the order the worker sent it. */
#ifndef JITCKPT_PROXY_H
#define JITCKPT_PROXY_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "jitckpt_remote_wire.h"

/* Environment variables (each also a command-line option; see main.c). */
#define PROXY_ENV_CUDART "JITCKPT_PROXY_CUDART"
#define PROXY_ENV_NCCL "JITCKPT_PROXY_NCCL"
#define PROXY_ENV_CUBLAS "JITCKPT_PROXY_CUBLAS"
#define PROXY_ENV_CUBLASLT "JITCKPT_PROXY_CUBLASLT"
#define PROXY_ENV_CUDNN "JITCKPT_PROXY_CUDNN"
#define PROXY_ENV_PRELOAD "JITCKPT_PROXY_PRELOAD"
#define PROXY_ENV_RING_KIB "JITCKPT_PROXY_RING_KIB"     /* the request ring's size (segment.c) */

struct proxy_options {
    const char *socket_path;
    const char *cudart_path;       /* NULL: the default (libs.c) */
    const char *nccl_path;
    const char *cublas_path;       /* NULL: the default (libs.c) */
    const char *cublaslt_path;     /* NULL: the default (libs.c) */
    const char *cudnn_path;        /* NULL: the default (libs.c) */
    const char *preload_path;      /* spawn mode: the worker's LD_PRELOAD */
    pid_t worker_pid;              /* 0: the spawned child, or (no program) any pid */
    uint64_t arena_bytes;
    char **program;                /* spawn mode: argv of the worker, or NULL */
    int verbose;
};

void plog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pdebug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern int proxy_verbose;

/* libs.c */
int libs_load(const struct proxy_options *o);
void *proxy_sym(void *lib, const char *name);
extern void *cudart, *nccl, *cublas, *cublaslt, *cudnn;
const char *default_sibling(const char *relative_to_exe_dir_1, const char *relative_to_exe_dir_2);

/* segment.c */
struct jitckpt_wire *segment_create(uint64_t arena_bytes, int *fd);

/* listen.c */
int listen_socket(const char *path);
int accept_worker(int listener, const char *path, pid_t *expected, int segfd, uint64_t segsize, pid_t child,
                  int *child_status);

/* serve.c */
int serve(int sock, struct jitckpt_wire *w);

/* handles.c */
uint64_t vh_insert(int kind, void *real);
int vh_lookup(int kind, uint64_t vid, void **real);
void vh_forget(int kind, uint64_t vid);
int vh_bind(int kind, uint64_t vid, void *real);
void vh_expect(int kind, uint64_t vid);
int vh_rebind(int kind, uint64_t vid, void *real);
size_t vh_each(int kind, void (*fn)(uint64_t vid, void *real, void *arg), void *arg);

/* watch.c: collectives in flight, holding back dependent work, minibatch
 * markers, aborts (README.md, "Recovery") */
int watch_start(struct jitckpt_wire *w);
void watch_before(unsigned fn);                      /* a record is about to execute */
int watch_handle(int kind, uint64_t vid);            /* rdisp.c: 0, or -1: the record is dropped (an abort) */
void watch_after(unsigned fn, int32_t ret);          /* the record executed */
int watch_record_dropped(void);                      /* 1: the record just executed was dropped instead */
int watch_dropping(uint64_t pos);                    /* 1: drop the unexecuted record at this ring position */
int watch_is_comm_init(unsigned fn);
void watch_comm_created(const unsigned char *rep, size_t n);
void watch_mark(uint64_t index);                     /* a minibatch marker on every stream */
int watch_rewind_save(uint64_t dst, uint64_t stamp, uint64_t value, uint32_t n, const uint64_t *ranges);
                                                      /* ranges copied at the boundary, then stamped */
uint64_t watch_done_marker(void);
void watch_set_done_marker(uint64_t v);
void watch_clear(void);                              /* recovery done: forget collectives and markers */

/* serve.c: the errors asynchronous calls left (restore.c's RST_CLEAR takes them) */
int32_t serve_take_pending(void);

/* devmem.c: device memory in the reserved range (README.md, "Device pointers") */
int32_t devmem_malloc(void **ptr, size_t size);
int32_t devmem_malloc_at(void *ptr, size_t size);
int32_t devmem_free(void *ptr);
extern pid_t proxy_worker_pid;                         /* listen.c: the worker served (0: not known yet) */
struct jitckpt_wire *watch_wire(void);                 /* watch.c: the shared segment */
void proxy_note_error(int32_t err);                    /* serve.c: a CUDA error the runtime did not see */
int devmem_is_allocation(void *p);                     /* devmem.c */
void devmem_after_reset(void);                       /* cudaDeviceReset dropped the device's memory */
int devmem_info(uint64_t *base, uint64_t *size);   /* 1: allocations at fixed addresses */

/* restore.c: the restart protocol's calls (jitckpt_remote_restart.h) */
struct rdisp;
int32_t dispatch_restore(unsigned fn, struct rdisp *d, int *handled);
int32_t proxy_sync_all(void);                        /* cudaDeviceSynchronize on every device */

/* pinned.c: pinned host memory shared with the worker (README.md, "Pinned host memory") */
void pinned_set_socket(int sock);                    /* serve.c: the worker's connection */
void pinned_receive(void);                           /* take the descriptors waiting on the socket */
int pinned_contains(const void *p);                  /* 1: p lies in a region mapped from the worker */
int pinned_contains_range(const void *p, uint64_t n); /* 1: [p, p + n) lies in one such region */
int32_t dispatch_pinned(unsigned fn, struct rdisp *d);   /* JITCKPT_RFN_HOST_REGISTER, _UNREGISTER */

#endif
