/* jitckpt_remote_wire.h -- the wire between a worker in remote (transparent)
 * mode (libjitckpt_remote.so) and its device proxy (jitckpt-proxy).
 *
 * One shared-memory segment per worker, created by the proxy (memfd) and
 * handed to its one worker over the proxy's Unix socket (SCM_RIGHTS), after
 * the proxy checked the peer's credentials (SO_PEERCRED).  The segment holds
 * a header, the request ring, and the bulk-data arena that carries host
 * bytes (H2D sources, D2H destinations, fatbinary images).  The socket stays
 * open for liveness (end-of-file on either side means the other process is
 * gone) and, from the worker to the proxy, for the file descriptors of pinned
 * host memory (struct jitckpt_wire_pinned_fd, JITCKPT_RFN_HOST_REGISTER).
 *
 * Every call is a record appended to the request ring (single producer: the
 * worker, under its one call lock; single consumer: the proxy's one thread),
 * executed by the proxy in ring order.  An asynchronous call (generated
 * table remote_fn_async) returns as soon as its record is appended; a
 * synchronous one (flag JITCKPT_REC_SYNC) waits until the proxy has executed
 * it, and so everything before it, and reads its answer from the response
 * area.  Doorbells are futex words in the header, used only when the other
 * side is asleep.  The arena is a ring too: a record names the arena position
 * its call used up to, and the proxy releases the arena up to there once the
 * record is executed; a full ring or arena makes the worker wait (back-pressure).
 *
 * A request is the function id (enum remote_fn, generated) and its arguments
 * marshalled in parameter order as tools/gen_interpose.py describes them:
 * by-value parameters as their bytes, handles as 64-bit virtual ids, strings
 * as a 32-bit length and bytes, host buffers as a 64-bit size and a 64-bit
 * arena offset (size 0: the pointer crosses unchanged; JITCKPT_WIRE_PINNED
 * below).  A response is the function's result and its outputs in
 * parameter order.  See proxy_server/README.md for the whole design. */
#ifndef JITCKPT_REMOTE_WIRE_H
#define JITCKPT_REMOTE_WIRE_H

#include <stdint.h>

#define JITCKPT_WIRE_MAGIC 0x4a4b5057u       /* "WPKJ" */
#define JITCKPT_WIRE_VERSION 5u
#define JITCKPT_WIRE_REQ_MAX (64u * 1024u)
#define JITCKPT_WIRE_REP_MAX (64u * 1024u)
#define JITCKPT_WIRE_DEFAULT_ARENA (64ull << 20)
#define JITCKPT_WIRE_DEFAULT_RING (2ull << 20)
/* The smallest ring: two records of the largest request (one may be skipped at the wrap). */
#define JITCKPT_WIRE_MIN_RING (2ull * (JITCKPT_WIRE_REQ_MAX + 4096))

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
    VH_BLAS,            /* a cuBLAS handle (issue 19) */
    VH_DNN,             /* a cuDNN handle (issue 19) */
    VH_DNN_DESC,        /* a cuDNN backend descriptor (issue 19; interpose/remote/dnn.c) */
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

/* One record of the request ring: this header, then req_len bytes of request;
 * len (a multiple of 8) covers both.  len 0: the rest of the ring up to its
 * end is unused, the next record is at the ring's start. */
struct jitckpt_ring_rec {
    uint32_t len;
    uint32_t fn;                 /* enum remote_fn */
    uint32_t req_len;
    uint32_t flags;              /* JITCKPT_REC_SYNC */
    uint64_t arena_end;          /* the arena position (monotonic) this call used up to */
};
#define JITCKPT_REC_SYNC 1u      /* the worker waits for this record's answer */

#define JITCKPT_WIRE_LINE __attribute__((aligned(64)))
#define JITCKPT_WIRE_CB_SLOTS 64u      /* host functions posted to the worker and not finished, at most */

struct jitckpt_wire {
    uint32_t magic;
    uint32_t version;
    uint64_t segment_size;
    uint64_t arena_offset;       /* from the start of the segment, page-aligned */
    uint64_t arena_size;
    uint64_t ring_offset;        /* from the start of the segment, page-aligned */
    uint64_t ring_size;
    /* Written by the worker (positions are monotonic byte counts; offset = position % size). */
    JITCKPT_WIRE_LINE uint64_t ring_head;      /* end of the last record appended */
    uint32_t proxy_sleeping;                   /* written by both: 1 while the proxy may sleep on proxy_wake */
    uint32_t proxy_wake;                       /* futex: bumped by the worker to wake the proxy */
    /* Written by the proxy. */
    JITCKPT_WIRE_LINE uint64_t ring_tail;      /* end of the last record executed */
    uint64_t arena_tail;                       /* arena released up to here */
    uint64_t worker_waits_for;                 /* written by the worker: a ring_tail it sleeps for, or 0 */
    uint32_t worker_wake;                      /* futex: bumped by the proxy to wake the worker */
    /* Recovery (proxy_server/README.md, "Recovery"; the proxy's watch.c, the
     * worker's recover.c).  abort_before is written by the worker: every
     * record before that ring position not yet executed is dropped, and every
     * communicator aborted; the proxy answers with abort_done = 1.  The rest
     * is written by the proxy's watcher thread. */
    JITCKPT_WIRE_LINE uint64_t abort_before;   /* 0: no abort asked */
    uint32_t abort_done;
    int32_t comm_error;          /* the first asynchronous NCCL error of a communicator (ncclRemoteError, ...) */
    int32_t device_error;        /* a sticky device error the watcher saw */
    uint32_t recovery_on;        /* written by the worker: 1 when it recovers (serve.c's recover_first) */
    uint64_t coll_oldest_ns;     /* CLOCK_MONOTONIC ns when the oldest unfinished collective was enqueued; 0: none */
    uint64_t done_marker;        /* minibatch markers completed on the device: the newest index + 1 */
    int32_t rewind_error;        /* the first failed JITCKPT_RFN_REWIND save (a recovery cannot count on it) */
    uint32_t rewind_pad;
    /* Host functions (cudaLaunchHostFunc, cudaStreamAddCallback; hostfn.c on
     * both sides).  When the proxy's runtime reaches one, the proxy writes its
     * id (and status) into slot cb_posted % JITCKPT_WIRE_CB_SLOTS, advances
     * cb_posted and bumps cb_wake; the worker runs the program's function and
     * sets cb_done[slot] to the posting's sequence number + 1, bumping
     * cb_done_wake; the proxy's runtime thread waits for that. */
    JITCKPT_WIRE_LINE uint64_t cb_posted;
    uint32_t cb_wake;
    int32_t cb_status[JITCKPT_WIRE_CB_SLOTS];
    uint64_t cb_ids[JITCKPT_WIRE_CB_SLOTS];
    JITCKPT_WIRE_LINE uint64_t cb_done[JITCKPT_WIRE_CB_SLOTS];
    uint32_t cb_done_wake;
    /* The answer to the last synchronous record (valid once ring_tail passed it). */
    int32_t ret;                 /* cudaError_t, ncclResult_t, or a hand-written result */
    uint32_t rep_len;
    /* The worker's staging area for the call being marshalled (copied into the
     * ring when the call is made; never read by the proxy). */
    uint32_t fn;                 /* enum remote_fn */
    uint32_t req_len;
    JITCKPT_WIRE_LINE unsigned char req[JITCKPT_WIRE_REQ_MAX];
    unsigned char rep[JITCKPT_WIRE_REP_MAX];
};

/* Hand-written calls that are not functions of the API. */
#define JITCKPT_RFN_PARAM_SIZES 0xfff0u       /* a kernel's parameter sizes, for a launch */
#define JITCKPT_RFN_MARK 0xfff1u              /* u64 index: minibatch marker on every stream (asynchronous) */
#define JITCKPT_RFN_HOST_REGISTER 0xfff2u     /* u64 seq, u64 addr, u64 size, u32 flags: map and register the
                                                 pinned region whose descriptor the socket carries (seq) */
#define JITCKPT_RFN_HOST_UNREGISTER 0xfff3u   /* u64 addr: synchronise, unregister and unmap a pinned region */
#define JITCKPT_RFN_REWIND 0xfff4u            /* u64 dst, u64 stamp, u64 value, u32 n, n x (u64 addr, u64 bytes):
                                                 the ranges copied to dst (pinned host memory shared with the
                                                 proxy), one after another, at a minibatch boundary, then value
                                                 written to the u64 at stamp once they are (asynchronous) */
#define JITCKPT_REWIND_MAX_RANGES 2048u
#define JITCKPT_REWIND_SLOTS 8              /* saves kept: the host may run this many minibatches ahead */

/* Pinned host memory shared with the proxy (interpose/remote/pinned.c,
 * proxy_server/src/pinned.c): cudaHostAlloc's pages are a memfd, mapped at
 * the same address in both processes.  Before each JITCKPT_RFN_HOST_REGISTER
 * record the worker sends this message on the socket, with the memfd as
 * SCM_RIGHTS; the proxy takes it when it executes the record (same seq). */
struct jitckpt_wire_pinned_fd {
    uint32_t magic;              /* JITCKPT_WIRE_PINNED_MAGIC */
    uint32_t reserved;
    uint64_t seq;
    uint64_t addr;
    uint64_t size;
};
#define JITCKPT_WIRE_PINNED_MAGIC 0x4e49504au     /* "JPIN" */
/* A host buffer inside a region the proxy has mapped crosses as its pointer:
 * size 0, and this tag as its arena offset; the proxy checks that the
 * pointer lies in one of its pinned regions.  | JITCKPT_WIRE_PINNED_COMPLETE:
 * a copy into it completes before the call answers (as for an arena buffer). */
#define JITCKPT_WIRE_PINNED 0x6a6b70696e000000ull
#define JITCKPT_WIRE_PINNED_COMPLETE 1ull
/* Where the worker places pinned regions (first fit; a region that does not
 * fit, or whose address is taken, goes wherever mmap puts it): a range no
 * process normally uses, so that the proxy usually finds it free too. */
#define JITCKPT_WIRE_PINNED_BASE (64ull << 40)
#define JITCKPT_WIRE_PINNED_SIZE (1ull << 40)

/* A synchronous call's result meaning "recover first, then make this call
 * again" (an asynchronous NCCL error the program would otherwise see), and
 * "dropped by an abort" (recover.c).  Never returned to the program. */
#define JITCKPT_RET_RECOVER ((int32_t)0x6a6b0001)
#define JITCKPT_RET_DROPPED ((int32_t)0x6a6b0002)

/* cuBLASLt descriptors on the wire (issue 19; interpose/remote/blaslt.c, proxy_server/src/blaslt.c).
 * A matmul descriptor, matrix layout or matmul preference is kept in the worker; a call that uses one
 * carries it: this head, then n_attrs times (u32 attribute, u32 length, that many bytes of its value),
 * in the order the program set them.  The proxy creates the real object, sets the attributes, makes
 * the call and destroys it. */
enum jitckpt_lt_kind { JITCKPT_LT_MATMUL_DESC = 1, JITCKPT_LT_LAYOUT, JITCKPT_LT_PREFERENCE };
struct jitckpt_lt_head {
    uint32_t kind;          /* enum jitckpt_lt_kind */
    uint32_t n_attrs;
    uint64_t a, b, c;       /* matmul: compute type, scale type; layout: data type, rows, cols */
    int64_t d;              /* layout: leading dimension */
};
#define JITCKPT_LT_ATTR_MAX 64u      /* the largest attribute value the worker keeps (bytes) */
#define JITCKPT_LT_MAX_ATTRS 64u
struct jitckpt_lt_attr_size { uint32_t kind, id, size; };   /* generated from cublasLt.h (size 0: any) */

/* cuDNN on the wire (issue 19; interpose/remote/dnn.c, proxy_server/src/dnn.c).
 *
 * A legacy tensor descriptor (cudnnTensorDescriptor_t) is kept in the worker; a call that uses one carries
 * this structure (set 0: a NULL descriptor), from which the proxy makes a temporary descriptor for the call.
 *
 * A backend descriptor is a virtual handle (VH_DNN_DESC).  cudnnBackendSetAttribute and GetAttribute carry
 * (u64 id, u32 name, u32 type, i64 count, u32 has_array, u32 want_count) and a set's elements; an element of
 * type CUDNN_TYPE_BACKEND_DESCRIPTOR or CUDNN_TYPE_HANDLE is a virtual id, which the proxy maps (an unknown
 * one to NULL, for cuDNN to judge).  A get of descriptors fills, in the proxy, the descriptors the worker
 * names.  A variant pack is kept in the worker as the list of its sets: cudnnBackendExecute carries the
 * handle and two descriptor arguments (u32 kind: 0 NULL, 1 a u64 id, 2 a pack: u32 sets, u32 finalized,
 * then per set u32 name, u32 type, i64 count, u32 has_array, the elements); a pack's question (a set or a
 * finalize the worker does not answer itself, any get) travels as a pack argument, then u32 op
 * (enum jitckpt_dnn_pack_op) and the attribute call as above. */
#define JITCKPT_DNN_DIM_MAX 8
struct jitckpt_dnn_tensor {
    int32_t set, data_type, nb_dims, pad;
    int32_t dims[JITCKPT_DNN_DIM_MAX], strides[JITCKPT_DNN_DIM_MAX];
};
enum jitckpt_dnn_pack_op { JITCKPT_DNN_PACK_SET, JITCKPT_DNN_PACK_GET, JITCKPT_DNN_PACK_FINALIZE };
#define JITCKPT_DNN_PACK_MAX 64           /* tensors of one variant pack */

#endif
