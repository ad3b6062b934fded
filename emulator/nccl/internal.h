/* internal.h -- declarations shared by the files of the emulated NCCL
 * (libnccl.so.2 of the jitckpt CPU device emulator).
 *
 * Transport: the ranks of a communicator are processes (or threads) on one
 * machine that share one POSIX shared-memory segment, named from the random
 * part of the ncclUniqueId.  Collectives move data through per-rank slots in
 * the segment and meet at barriers made of per-rank step counters; point to
 * point traffic uses one ring buffer per ordered pair of ranks.  Waiting uses
 * futexes on a shared word, with a short timeout so that a waiter also
 * notices an abort of its communicator, a failed or reset device, a peer that
 * aborted or a peer process that died.  Every rank reduces the slots in rank
 * order 0..n-1, so all ranks get bit-identical results on every run.
 *
 * All operations are stream work: the API call validates its arguments and
 * queues one op per communicator and group on the stream; the op blocks its
 * stream until every peer has arrived. */

#ifndef JITCKPT_SIMDEV_NCCL_INTERNAL_H
#define JITCKPT_SIMDEV_NCCL_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <nccl.h>

#include "jitckpt_simdev.h"

/* What NCCL versions after 2.27 added to nccl.h: the emulator builds against
 * every header from 2.27 on, and implements what the header it is built
 * against declares (NCCL_VERSION_CODE is that header's version). */
#define SIMDEV_NCCL_SINCE(major, minor) (NCCL_VERSION_CODE >= NCCL_VERSION(major, minor, 0))
/* ncclAlltoAll, ncclGather, ncclScatter: NCCL 2.28.  ncclTimeout: 2.30. */
#define SIMDEV_HAS_ALLTOALL_GATHER_SCATTER SIMDEV_NCCL_SINCE(2, 28)
#define SIMDEV_HAS_NCCL_TIMEOUT SIMDEV_NCCL_SINCE(2, 30)
/* The magic NCCL_CONFIG_INITIALIZER writes; the header names it from 2.29 on. */
#ifndef NCCL_API_MAGIC
#define NCCL_API_MAGIC 0xcafebeef
#endif

#define COMM_MAGIC 0x6a69746e63636c21ull
#define MAX_RANKS 1024
#define MAX_CUSTOM_OPS 64

/* ---- shm.c: the shared segment ------------------------------------------ */

struct seg_desc {               /* what a rank says it is doing, for mismatch checks */
    uint32_t kind;
    uint32_t dtype;
    uint32_t op;
    int32_t root;
    uint64_t count;
};

struct seg_rank {
    int32_t pid;                /* 0 until the rank joined */
    uint32_t aborted;
    uint64_t arrive;            /* collective steps this rank has reached */
    struct seg_desc desc[2];    /* by step parity */
    char pad[128 - 16 - 2 * sizeof(struct seg_desc)];
};

_Static_assert(sizeof(struct seg_rank) == 128, "one cache-line pair per rank");

struct seg_chan {               /* ring buffer src -> dst, byte counters */
    uint64_t head;              /* consumed by the receiver */
    uint64_t tail;              /* produced by the sender */
    char pad[112];
};

struct seg_header {
    uint64_t magic;
    int32_t nranks;             /* set by the first rank to join */
    uint32_t futex;             /* bumped (and woken) on every change */
    uint32_t joined;
    uint32_t chunk_bytes;
    uint32_t p2p_bytes;
    uint32_t pad;
};

struct seg {
    struct seg_header *hdr;
    struct seg_rank *ranks;
    struct seg_chan *chans;     /* [src * nranks + dst] */
    unsigned char *coll;        /* [2][nranks][chunk_bytes] */
    unsigned char *p2p;         /* [src][dst][p2p_bytes] */
    size_t len;
    int nranks;
    size_t chunk_bytes, p2p_bytes;
};

struct ncclComm;

/* Joins rank `rank` of an nranks communicator to the segment named in the id. */
ncclResult_t seg_join(struct ncclComm *c, const ncclUniqueId *id);
/* Waits until all ranks joined (or the timeout / an abort). */
ncclResult_t seg_wait_all_joined(struct ncclComm *c);
void seg_unmap(struct seg *s);
void seg_wake(struct seg *s);
/* One bounded futex wait on the segment word, from value `seen`. */
void seg_wait(struct seg *s, uint32_t seen, int timeout_ms);
uint32_t seg_futex_value(struct seg *s);
void seg_mark_aborted(struct ncclComm *c);

unsigned char *seg_coll_slot(struct seg *s, int buf, int rank);
unsigned char *seg_p2p_ring(struct seg *s, int src, int dst);

/* ---- comm.c --------------------------------------------------------------- */

struct custom_op {
    int used;
    ncclDataType_t dtype;
    ncclScalarResidence_t residence;
    unsigned char scalar[16];   /* host-immediate value */
    const void *device_scalar;  /* read when the op runs */
};

struct ncclComm {
    uint64_t magic;
    int rank, nranks, device;
    char name[64];              /* the shm segment name */
    struct seg seg;
    int refs;                   /* user handle + queued ops; guarded by lock */
    int pending;                /* ops queued or running */
    int running;                /* ops inside run_group */
    int finalized;
    int joined_all;
    int aborted;                /* atomic */
    int async_error;            /* ncclResult_t, atomic */
    int blocking;
    int user_released;          /* destroyed or aborted by the user */
    uint64_t coll_step;         /* steps done by this rank (executing op only) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_mutex_t exec_lock;  /* one op of this comm at a time */
    pthread_t init_thread;
    int init_thread_started;
    int peer_reported[MAX_RANKS / 32];  /* bitmap: peer failure already logged */
    struct custom_op custom[MAX_CUSTOM_OPS];
};

struct ncclComm *comm_check(ncclComm_t comm, const char *api, ncclResult_t *err);
void comm_ref(struct ncclComm *c);
void comm_unref(struct ncclComm *c);
/* Nonzero once an op must give up: aborted comm, failed or reset device. */
int comm_should_stop(struct ncclComm *c);
void comm_set_async_error(struct ncclComm *c, ncclResult_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks peers for death or abort (at most every few hundred ms). */
void comm_watch_peers(struct ncclComm *c, uint64_t *last_check_ns,
                      int (*waiting_on)(void *ctx, int rank), void *ctx);
uint64_t now_ns(void);

/* Deferred parts of ncclCommInitRank inside a group. */
ncclResult_t comm_finish_init(struct ncclComm *c);

/* ---- errors.c ------------------------------------------------------------- */
ncclResult_t report_error(ncclResult_t err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The sticky error of the comm's device as an NCCL result (or ncclSuccess). */
ncclResult_t device_result(int device);

/* ---- reduce.c ------------------------------------------------------------- */
size_t dtype_size(ncclDataType_t t);
int dtype_reducible(ncclDataType_t t);
/* acc[i] = acc[i] op src[i] for n elements; premul scaling for custom ops. */
void reduce_into(void *acc, const void *src, size_t n, ncclDataType_t t, ncclRedOp_t op);
/* acc[i] = scale * src[i] (first term of a PreMulSum). */
void scale_copy(void *dst, const void *src, size_t n, ncclDataType_t t, const void *scale);
void scale_add(void *acc, const void *src, size_t n, ncclDataType_t t, const void *scale);
/* acc[i] /= divisor (ncclAvg). */
void divide_by(void *acc, size_t n, ncclDataType_t t, int divisor);

/* ---- collective.c, p2p.c -------------------------------------------------- */
enum coll_kind {
    COLL_ALLREDUCE = 1,
    COLL_BROADCAST,
    COLL_REDUCE,
    COLL_ALLGATHER,
    COLL_REDUCESCATTER,
    COLL_ALLTOALL,
    COLL_GATHER,
    COLL_SCATTER,
};

struct coll_task {
    enum coll_kind kind;
    const char *api;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root;
};

struct p2p_task {
    int is_send;
    int peer;
    unsigned char *buf;
    size_t bytes;
    size_t done;
};

ncclResult_t run_collective(struct ncclComm *c, const struct coll_task *t);
ncclResult_t run_p2p(struct ncclComm *c, struct p2p_task *tasks, int n);

/* ---- group.c -------------------------------------------------------------- */
struct task {
    struct ncclComm *comm;
    cudaStream_t stream;
    int is_p2p;
    struct coll_task coll;
    struct p2p_task p2p;
    int hang;
    unsigned delay_ms;
};

/* Queues a task in the current group, or runs it as its own group. */
ncclResult_t group_add(struct task *t);
/* Defers the rendezvous of ncclCommInitRank called inside a group. */
ncclResult_t group_defer_init(struct ncclComm *c);
int group_depth(void);
/* Counts the call for fault injection; sticky/lost faults fail it here. */
ncclResult_t fault_at_call(struct ncclComm *c, const char *api, struct task *t);

#endif /* JITCKPT_SIMDEV_NCCL_INTERNAL_H */
