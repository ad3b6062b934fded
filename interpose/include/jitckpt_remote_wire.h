/* jitckpt_remote_wire.h -- the wire between a worker in remote (transparent)
 * mode (libjitckpt_remote.so) and its device proxy (jitckpt-proxy).
 *
 * One shared-memory segment per worker, created by the proxy (memfd) and
 * handed to its one worker over the proxy's Unix socket (SCM_RIGHTS), after
 * the proxy checked the peer's credentials (SO_PEERCRED).  The segment holds
 * one call record (request and response areas) and the bulk-data arena that
 * carries host bytes: H2D sources, D2H destinations, fatbinary images and
 * kernel arguments.  The socket stays open as the doorbell: the worker writes
 * one byte when a request is ready, the proxy one byte when the response is;
 * end-of-file on either side means the other process is gone.
 *
 * A request is the function id (enum remote_fn, generated) and its arguments
 * marshalled in parameter order as tools/gen_interpose.py describes them:
 * by-value parameters as their bytes, handles as 64-bit virtual ids, strings
 * as a 32-bit length and bytes, host buffers as a 64-bit size and a 64-bit
 * arena offset.  A response is the function's result and its outputs in
 * parameter order.  See proxy_server/README.md for the whole design. */
#ifndef JITCKPT_REMOTE_WIRE_H
#define JITCKPT_REMOTE_WIRE_H

#include <stdint.h>

#define JITCKPT_WIRE_MAGIC 0x4a4b5057u       /* "WPKJ" */
#define JITCKPT_WIRE_VERSION 1u
#define JITCKPT_WIRE_REQ_MAX (64u * 1024u)
#define JITCKPT_WIRE_REP_MAX (64u * 1024u)
#define JITCKPT_WIRE_DEFAULT_ARENA (64ull << 20)

/* The environment variable that names the proxy's socket in the worker. */
#define JITCKPT_PROXY_SOCKET_ENV "JITCKPT_PROXY_SOCKET"

/* Kinds of virtual handle.  The worker only ever sees virtual ids; the proxy
 * maps them to the real runtime's handles (proxy_server/src/handles.c). */
enum remote_handle_kind {
    VH_STREAM = 1,
    VH_EVENT,
    VH_KERNEL,
    VH_MODULE,
    VH_COMM,
    VH_GRAPH,
    VH_GRAPH_EXEC,
    VH_FUNC,
    VH_NKINDS
};

/* A virtual id: tag in the top 16 bits, kind in the next 8, then a counter.
 * 0, 1 and 2 are the special streams (NULL, cudaStreamLegacy,
 * cudaStreamPerThread) and cross unchanged. */
#define JITCKPT_VH_TAG 0x6a6bull                     /* "jk" */
#define JITCKPT_VH_MAKE(kind, n) ((JITCKPT_VH_TAG << 48) | ((uint64_t)(kind) << 40) | (uint64_t)(n))
#define JITCKPT_VH_KIND(id) ((int)(((id) >> 40) & 0xff))
#define JITCKPT_VH_IS_VIRTUAL(id) (((id) >> 48) == JITCKPT_VH_TAG)

/* The hello the proxy sends with the segment's file descriptor. */
struct jitckpt_wire_hello {
    uint32_t magic;
    uint32_t version;
    uint64_t segment_size;
    int32_t proxy_pid;
    int32_t status;              /* 0: accepted; the fd comes with it */
};

struct jitckpt_wire {
    uint32_t magic;
    uint32_t version;
    uint64_t segment_size;
    uint64_t arena_offset;       /* from the start of the segment, page-aligned */
    uint64_t arena_size;
    /* the call record */
    uint32_t fn;                 /* enum remote_fn */
    uint32_t req_len;
    int32_t ret;                 /* cudaError_t, ncclResult_t, or a hand-written result */
    uint32_t rep_len;
    unsigned char req[JITCKPT_WIRE_REQ_MAX];
    unsigned char rep[JITCKPT_WIRE_REP_MAX];
};

/* Hand-written calls that are not functions of the API. */
#define JITCKPT_RFN_PARAM_SIZES 0xfff0u       /* a kernel's parameter sizes, for a launch */

#endif
