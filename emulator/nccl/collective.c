/* collective.c -- executing one collective on a stream worker.
 *
 * Every collective is expressed as the same pattern: each rank streams a
 * "contribution" (its send buffer, or nothing for non-roots of a broadcast
 * or scatter) through its slot in the shared segment, one chunk per step;
 * after each step's barrier every rank reads the slots it needs.  Slots are
 * double-buffered by step parity: a rank may fill buffer b for step k only
 * after all ranks reached step k-1, that is after all of them finished
 * reading buffer b of step k-2, so one barrier per chunk is enough.
 *
 * Reductions always combine slot 0, 1, ..., n-1 in that order: results are
 * identical on all ranks and on every run.  At the first step every rank
 * also publishes what it is doing (kind, count, datatype, op, root); a
 * mismatch between ranks becomes ncclInvalidUsage with a message naming both
 * calls, on every rank, instead of silent garbage. */

#include <string.h>

#include "internal.h"

#define STOPPED ((ncclResult_t)-1)

struct wait_ctx {
    struct ncclComm *c;
    uint64_t step;
};

static int not_arrived(void *ctx, int r)
{
    struct wait_ctx *w = ctx;
    return __atomic_load_n(&w->c->seg.ranks[r].arrive, __ATOMIC_ACQUIRE) < w->step;
}

/* Announces step `step` and waits until every rank has reached it. */
static int barrier(struct ncclComm *c, uint64_t step)
{
    struct seg *s = &c->seg;
    __atomic_store_n(&s->ranks[c->rank].arrive, step, __ATOMIC_RELEASE);
    seg_wake(s);
    struct wait_ctx ctx = { c, step };
    uint64_t last = now_ns();
    for (;;) {
        uint32_t seen = seg_futex_value(s);
        int all = 1;
        for (int r = 0; r < c->nranks && all; r++)
            all = !not_arrived(&ctx, r);
        if (all)
            return 1;
        if (comm_should_stop(c))
            return 0;
        comm_watch_peers(c, &last, not_arrived, &ctx);
        seg_wait(s, seen, 100);
    }
}

static const char *kind_name(uint32_t k)
{
    static const char *names[] = { "?", "ncclAllReduce", "ncclBroadcast", "ncclReduce",
                                   "ncclAllGather", "ncclReduceScatter", "ncclAlltoAll",
                                   "ncclGather", "ncclScatter" };
    return k < sizeof names / sizeof names[0] ? names[k] : "?";
}

static int check_descs(struct ncclComm *c, int parity)
{
    const struct seg_desc *mine = &c->seg.ranks[c->rank].desc[parity];
    for (int r = 0; r < c->nranks; r++) {
        const struct seg_desc *d = &c->seg.ranks[r].desc[parity];
        if (memcmp(d, mine, sizeof *d) == 0)
            continue;
        comm_set_async_error(c, ncclInvalidUsage,
                             "collective mismatch: rank %d called %s(count=%llu, datatype=%u, "
                             "op=%u, root=%d) while rank %d called %s(count=%llu, datatype=%u, "
                             "op=%u, root=%d)", c->rank, kind_name(mine->kind),
                             (unsigned long long)mine->count, mine->dtype, mine->op, mine->root, r,
                             kind_name(d->kind), (unsigned long long)d->count, d->dtype, d->op,
                             d->root);
        return 0;
    }
    return 1;
}

/* dst[0..len) = slot_0 op slot_1 op ... op slot_{n-1}, elements [from, from+len). */
static void reduce_slots(struct ncclComm *c, const struct coll_task *t, int buf, size_t from,
                         size_t len, void *dst, const void *scale)
{
    size_t es = dtype_size(t->dtype);
    const unsigned char *first = seg_coll_slot(&c->seg, buf, 0) + from * es;
    if (scale)
        scale_copy(dst, first, len, t->dtype, scale);
    else
        memcpy(dst, first, len * es);
    for (int r = 1; r < c->nranks; r++) {
        const unsigned char *src = seg_coll_slot(&c->seg, buf, r) + from * es;
        if (scale)
            scale_add(dst, src, len, t->dtype, scale);
        else
            reduce_into(dst, src, len, t->dtype, t->op);
    }
    if (t->op == ncclAvg)
        divide_by(dst, len, t->dtype, c->nranks);
}

ncclResult_t run_collective(struct ncclComm *c, const struct coll_task *t)
{
    struct seg *s = &c->seg;
    const int n = c->nranks, me = c->rank;
    const size_t es = dtype_size(t->dtype);
    size_t total = t->count;
    int root_only = t->kind == COLL_BROADCAST || t->kind == COLL_SCATTER;
    if (t->kind == COLL_REDUCESCATTER || t->kind == COLL_ALLTOALL || t->kind == COLL_SCATTER)
        total = t->count * (size_t)n;
    if (total == 0)
        return ncclSuccess;

    unsigned char scale[16];
    const void *scale_ptr = NULL;
    if ((int)t->op >= ncclNumOps) {
        struct custom_op *o = &c->custom[(int)t->op - ncclNumOps];
        memcpy(scale, o->residence == ncclScalarHostImmediate ? o->scalar : o->device_scalar,
               es);
        scale_ptr = scale;
    }

    const unsigned char *send = t->send;
    unsigned char *recv = t->recv;
    const size_t per = s->chunk_bytes / es;
    const size_t seg_lo = (size_t)me * t->count, seg_hi = seg_lo + t->count;
    int first = 1;
    for (size_t off = 0; off < total; off += per) {
        size_t len = total - off < per ? total - off : per;
        uint64_t step = c->coll_step + 1;
        int buf = (int)(step & 1);
        if (!root_only || me == t->root)
            memcpy(seg_coll_slot(s, buf, me), send + off * es, len * es);
        if (first) {
            struct seg_desc *d = &s->ranks[me].desc[buf];
            memset(d, 0, sizeof *d);
            d->kind = t->kind;
            d->dtype = t->dtype;
            d->op = t->op;
            d->root = root_only || t->kind == COLL_REDUCE || t->kind == COLL_GATHER ? t->root : 0;
            d->count = t->count;
        }
        if (!barrier(c, step))
            return STOPPED;
        c->coll_step = step;
        if (first && !check_descs(c, buf))
            return ncclInvalidUsage;
        first = 0;

        size_t lo = off > seg_lo ? off : seg_lo;
        size_t hi = off + len < seg_hi ? off + len : seg_hi;
        switch (t->kind) {
        case COLL_ALLREDUCE:
            reduce_slots(c, t, buf, 0, len, recv + off * es, scale_ptr);
            break;
        case COLL_REDUCE:
            if (me == t->root)
                reduce_slots(c, t, buf, 0, len, recv + off * es, scale_ptr);
            break;
        case COLL_BROADCAST:
            memcpy(recv + off * es, seg_coll_slot(s, buf, t->root), len * es);
            break;
        case COLL_ALLGATHER:
        case COLL_GATHER:
            if (t->kind == COLL_GATHER && me != t->root)
                break;
            for (int r = 0; r < n; r++)
                memcpy(recv + ((size_t)r * total + off) * es, seg_coll_slot(s, buf, r), len * es);
            break;
        case COLL_REDUCESCATTER:
            if (lo < hi)
                reduce_slots(c, t, buf, lo - off, hi - lo, recv + (lo - seg_lo) * es, scale_ptr);
            break;
        case COLL_ALLTOALL:
            if (lo < hi)
                for (int r = 0; r < n; r++)
                    memcpy(recv + ((size_t)r * t->count + (lo - seg_lo)) * es,
                           seg_coll_slot(s, buf, r) + (lo - off) * es, (hi - lo) * es);
            break;
        case COLL_SCATTER:
            if (lo < hi)
                memcpy(recv + (lo - seg_lo) * es, seg_coll_slot(s, buf, t->root) + (lo - off) * es,
                       (hi - lo) * es);
            break;
        }
    }
    return ncclSuccess;
}
