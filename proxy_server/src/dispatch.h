/* dispatch.h -- the proxy's half of the wire format, shared by the generated
 * dispatch (build/gen/proxy_dispatch.c) and the hand-written one
 * (special.c).  The worker's half is interpose/remote/marshal.c. */
#ifndef JITCKPT_PROXY_DISPATCH_H
#define JITCKPT_PROXY_DISPATCH_H

#include <string.h>

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#ifdef JITCKPT_REMOTE_CUBLAS      /* the build forwards cuBLAS (Makefile: CUBLAS_INCLUDE) */
#include <cublas_api.h>
#endif

#include "proxy.h"
#include "remote_fns.h"

/* The result of a call whose request does not parse: the worker sent
 * something this proxy does not understand. */
#define RD_BAD ((int32_t)cudaErrorInvalidValue)

/* One call being executed: cursors into the request and the response. */
struct rdisp {
    struct jitckpt_wire *w;
    unsigned char *arena;
    size_t req, rep;
    size_t req_len, arena_size;   /* read once: the worker can write the segment at any time */
    int has_out;              /* a host_out buffer in the arena (or pinned, to complete before the answer) */
};

struct dispatch_entry {
    const char *name;
    int32_t (*fn)(struct rdisp *d);
};

extern const struct dispatch_entry dispatch_generated[RFN_count];
int dispatch_resolve(void *cudart, void *nccl, void *cublas, void *cudnn);   /* generated: how many the libraries lack */
int dispatch_note_missing(const char *name);                   /* missing.c: one the libraries lack (1) */
int32_t dispatch_missing(const char *name);                    /* missing.c: a call of it fails, naming it */
int32_t dispatch_special(unsigned fn, struct rdisp *d, int *handled);
int32_t dispatch_alloc(unsigned fn, struct rdisp *d);          /* alloc.c */
void alloc_reap(void);                                         /* alloc.c: the cudaFreeAsync frees, the device idle */
int32_t alloc_device_synchronize(void);                        /* alloc.c */
int alloc_is_deferred(const void *p);                          /* alloc.c: cudaFreeAsync'ed, not freed yet */
int32_t dispatch_nccl_init_all(struct rdisp *d);               /* nccl_init.c */
int32_t dispatch_hostfn(unsigned fn, struct rdisp *d);         /* hostfn.c */
int32_t dispatch_library(unsigned fn, struct rdisp *d);        /* library.c */
int32_t dispatch_blaslt(unsigned fn, struct rdisp *d);         /* blaslt.c (JITCKPT_REMOTE_CUBLASLT) */
#ifdef JITCKPT_REMOTE_CUDNN
#include <stdbool.h>
#include <cudnn.h>
int32_t dispatch_dnn(unsigned fn, struct rdisp *d);            /* dnn.c: the backend API */
int rd_dnn_tensor(struct rdisp *d, cudnnTensorDescriptor_t *out);   /* dnn.c: a tensor descriptor by value */
void rd_dnn_tensors_release(void);                             /* dnn.c: this dispatch's tensor descriptors */
#endif
int32_t dispatch_capture_info(struct rdisp *d);                /* graphs.c */
const void *rd_func(const void *func);       /* a kernel's virtual id -> the runtime's handle; a host stub as is */
int32_t dispatch_nccl_last_error(struct rdisp *d);             /* nccl_init.c */
const char *special_resolve(void *cudart);

int rd_get(struct rdisp *d, void *p, size_t n);
int rd_flag(struct rdisp *d);
int rd_get_handle(struct rdisp *d, int kind, uint64_t *vid, void **real);
int rd_get_string(struct rdisp *d, char **out);      /* a malloc'd copy, or NULL for NULL */
int rd_host_in(struct rdisp *d, const void **p);
int rd_host_out(struct rdisp *d, const void **p);
int rd_has_out(struct rdisp *d);
void rd_put(struct rdisp *d, const void *p, size_t n);
void rd_put_new_handle(struct rdisp *d, int kind, void *real);
void rd_put_string(struct rdisp *d, const char *s);

void watch_comm_added(ncclComm_t c);                 /* watch.c: a communicator to watch (restore.c's rebuild) */
void watch_device_reset(void);                       /* watch.c: cudaDeviceReset destroyed the current device's events */

#endif
