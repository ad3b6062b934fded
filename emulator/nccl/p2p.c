/* p2p.c -- ncclSend/ncclRecv: byte streams through one ring buffer per
 * ordered pair of ranks.
 *
 * The sender owns the ring's tail, the receiver its head; both only ever
 * grow.  All point-to-point operations of one group progress together (a
 * ring exchange where every rank sends to its right and receives from its
 * left would deadlock if each rank finished its send first), while
 * operations between the same two ranks in the same direction complete in
 * the order they were issued, which is NCCL's matching rule. */

#include <string.h>

#include "internal.h"

#define STOPPED ((ncclResult_t)-1)

struct p2p_ctx {
    struct p2p_task *tasks;
    int n;
};

static int waiting_on_peer(void *ctx, int rank)
{
    struct p2p_ctx *p = ctx;
    for (int i = 0; i < p->n; i++)
        if (p->tasks[i].peer == rank && p->tasks[i].done < p->tasks[i].bytes)
            return 1;
    return 0;
}

static int blocked_by_earlier(const struct p2p_task *tasks, int i)
{
    for (int k = 0; k < i; k++)
        if (tasks[k].done < tasks[k].bytes && tasks[k].is_send == tasks[i].is_send &&
            tasks[k].peer == tasks[i].peer)
            return 1;
    return 0;
}

static size_t step_send(struct ncclComm *c, struct p2p_task *t)
{
    struct seg *s = &c->seg;
    struct seg_chan *ch = &s->chans[(size_t)c->rank * (size_t)c->nranks + (size_t)t->peer];
    unsigned char *ring = seg_p2p_ring(s, c->rank, t->peer);
    size_t cap = s->p2p_bytes;
    uint64_t head = __atomic_load_n(&ch->head, __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(&ch->tail, __ATOMIC_RELAXED);
    size_t space = cap - (size_t)(tail - head);
    size_t m = t->bytes - t->done < space ? t->bytes - t->done : space;
    size_t at = (size_t)(tail % cap), first = m < cap - at ? m : cap - at;
    memcpy(ring + at, t->buf + t->done, first);
    memcpy(ring, t->buf + t->done + first, m - first);
    __atomic_store_n(&ch->tail, tail + m, __ATOMIC_RELEASE);
    return m;
}

static size_t step_recv(struct ncclComm *c, struct p2p_task *t)
{
    struct seg *s = &c->seg;
    struct seg_chan *ch = &s->chans[(size_t)t->peer * (size_t)c->nranks + (size_t)c->rank];
    const unsigned char *ring = seg_p2p_ring(s, t->peer, c->rank);
    size_t cap = s->p2p_bytes;
    uint64_t tail = __atomic_load_n(&ch->tail, __ATOMIC_ACQUIRE);
    uint64_t head = __atomic_load_n(&ch->head, __ATOMIC_RELAXED);
    size_t avail = (size_t)(tail - head);
    size_t m = t->bytes - t->done < avail ? t->bytes - t->done : avail;
    size_t at = (size_t)(head % cap), first = m < cap - at ? m : cap - at;
    memcpy(t->buf + t->done, ring + at, first);
    memcpy(t->buf + t->done + first, ring, m - first);
    __atomic_store_n(&ch->head, head + m, __ATOMIC_RELEASE);
    return m;
}

ncclResult_t run_p2p(struct ncclComm *c, struct p2p_task *tasks, int n)
{
    struct p2p_ctx ctx = { tasks, n };
    uint64_t last = now_ns();
    for (;;) {
        uint32_t seen = seg_futex_value(&c->seg);
        int remaining = 0, progressed = 0;
        for (int i = 0; i < n; i++) {
            struct p2p_task *t = &tasks[i];
            if (t->done == t->bytes)
                continue;
            remaining++;
            if (blocked_by_earlier(tasks, i))
                continue;
            size_t m = t->is_send ? step_send(c, t) : step_recv(c, t);
            t->done += m;
            progressed |= m > 0;
        }
        if (!remaining)
            return ncclSuccess;
        if (progressed) {
            seg_wake(&c->seg);
            continue;
        }
        if (comm_should_stop(c))
            return STOPPED;
        comm_watch_peers(c, &last, waiting_on_peer, &ctx);
        seg_wait(&c->seg, seen, 100);
    }
}
