/* rewind.c -- device state a minibatch changes in place before its optimizer
 * step (proxy_server/README.md, "Replay validation", "State changed in place").
 *
 * A recovery meets the device as the failure left it: the forward and
 * backward passes over, the optimizer not yet run, and replays the minibatch
 * from its call log.  That is exact for everything the minibatch writes before
 * it reads, but not for state it updates in place: BatchNorm's running mean and
 * variance, PyTorch's num_batches_tracked, a counter.  A replay would update
 * those a second time.  Replay validation (recover.c) finds them: the bytes
 * where the replayed minibatch ends differently, in memory older than the
 * minibatch, together with what library calls announce (dnn.c: BatchNorm's
 * statistics, whole).  From then on the worker has the proxy copy those byte
 * ranges at every minibatch boundary, in the device's order
 * (proxy_server/src/watch.c, JITCKPT_RFN_REWIND), into a ring of
 * JITCKPT_REWIND_SLOTS slots of pinned host memory shared with it (pinned.c;
 * slot minibatch % SLOTS: the host may be ahead of the device), and a recovery
 * writes the resumed minibatch's slot back before the replay.
 *
 * The slots are host memory, so they outlive the device memory: a rank whose
 * proxy died or whose device failed takes the replica's memory and then its
 * own values of that state (BatchNorm's statistics are per rank), provided the
 * device had saved them (recover.c decides).  Until validation has learned the
 * ranges, a library call known to change state in place holds recovery back,
 * and so does freeing memory that holds such state: a failure then stops the
 * job with the reason. */

#include "remote.h"

#include <stdlib.h>
#include <string.h>

static struct rewind_range *ranges;  /* sorted by address, disjoint */
static size_t nranges;
static uint64_t total;               /* bytes of one slot */
static unsigned char *slots;         /* JITCKPT_REWIND_SLOTS slots (pinned, shared with the proxy) */
static uint64_t *stamps;             /* before them: the minibatch each slot holds, once saved (else ~0) */
#define STAMP_BYTES (JITCKPT_REWIND_SLOTS * sizeof(uint64_t))
static uint64_t valid_from;          /* the first minibatch whose start a slot holds */
static const char *unlearned;        /* state changed in place that validation has not learned (yet) */
static struct rewind_range *hints;   /* what library calls said they change in place */
static size_t nhints, cap_hints;

static int covered(uint64_t addr, uint64_t bytes);

size_t remote_rewind_ranges(const struct rewind_range **out)
{
    if (out)
        *out = ranges;
    return nranges;
}

size_t remote_rewind_hints(const struct rewind_range **out)
{
    if (out)
        *out = hints;
    return nhints;
}

uint64_t remote_rewind_bytes(void) { return total; }
uint64_t remote_rewind_from(void) { return nranges ? valid_from : 0; }
const char *remote_rewind_unlearned(void) { return unlearned; }
/* Every range a library call announced is rewound. */
int remote_rewind_hints_covered(void)
{
    for (size_t i = 0; i < nhints; i++)
        if (!covered(hints[i].addr, hints[i].bytes))
            return 0;
    return 1;
}

void remote_rewind_learned(void)
{
    if (remote_rewind_hints_covered())
        unlearned = NULL;
}

/* The slots are mapped by the current proxy (a replacement may not have managed to). */
int remote_rewind_intact(void)
{
    return !nranges || remote_pinned_shared(stamps, STAMP_BYTES + JITCKPT_REWIND_SLOTS * total);
}

/* Every byte of [addr, addr + bytes) lies in a range. */
static int covered(uint64_t addr, uint64_t bytes)
{
    for (size_t i = 0; i < nranges && bytes; i++)
        if (addr >= ranges[i].addr && addr < ranges[i].addr + ranges[i].bytes) {
            uint64_t upto = ranges[i].addr + ranges[i].bytes;
            if (addr + bytes <= upto)
                return 1;
            bytes -= upto - addr;
            addr = upto;
        }
    return bytes == 0;
}

static void say_unlearned(const char *why)
{
    const char *r = getenv("RANK");
    unlearned = why;
    rlog("rank %s: %s: a replay would apply that twice.  Transparent recovery waits until replay validation has "
         "learned the state changed in place (JITCKPT_TRANSPARENT_VALIDATE_AT, default minibatch 5, then every "
         "JITCKPT_TRANSPARENT_VALIDATE_EVERY); a failure before then stops every rank (exit status 75) and the job "
         "falls back to its checkpoints.", r && *r ? r : "0", why);
}

/* Under the call lock: a library call changed `bytes` at `addr` in place (dnn.c). */
void remote_rewind_hint(const char *why, uint64_t addr, uint64_t bytes)
{
    if (!addr || !bytes || !remote_recovery_active())
        return;
    size_t i = 0;
    while (i < nhints && !(hints[i].addr == addr && hints[i].bytes == bytes))
        i++;
    if (i == nhints) {
        if (nhints == cap_hints) {
            size_t nc = cap_hints ? 2 * cap_hints : 16;
            struct rewind_range *g = realloc(hints, nc * sizeof *g);
            if (!g)
                return;
            hints = g;
            cap_hints = nc;
        }
        hints[nhints++] = (struct rewind_range){addr, bytes};
    }
    if (!unlearned && !covered(addr, bytes))
        say_unlearned(why);
}

/* Under the call lock (restart.c): the program freed [addr, addr + size).  State saved there is gone with it. */
void remote_rewind_freed(uint64_t addr, uint64_t size)
{
    int hit = 0;
    for (size_t i = 0; i < nranges; i++)
        hit |= ranges[i].addr < addr + size && addr < ranges[i].addr + ranges[i].bytes;
    for (size_t i = 0; i < nhints;)
        if (hints[i].addr < addr + size && addr < hints[i].addr + hints[i].bytes)
            hints[i] = hints[--nhints];
        else
            i++;
    if (!hit)
        return;
    nranges = 0;
    total = 0;
    if (!unlearned)
        say_unlearned("the program freed device memory holding state it changes in place");
}

/* Under the call lock: rewind `n` ranges from minibatch `from` on (its start is saved at the boundary
 * before it).  0, or -1 (no pinned memory the proxy can write: said). */
int remote_rewind_adopt(const struct rewind_range *r, size_t n, uint64_t from)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += r[i].bytes;
    struct rewind_range *copy = malloc((n ? n : 1) * sizeof *copy);
    unsigned char *p = copy ? remote_pinned_alloc_locked(STAMP_BYTES + JITCKPT_REWIND_SLOTS * bytes) : NULL;
    if (!p) {
        free(copy);
        rlog("cannot have %llu bytes of pinned host memory shared with the device proxy for the state changed in "
             "place", (unsigned long long)(JITCKPT_REWIND_SLOTS * bytes));
        return -1;
    }
    if (stamps)
        remote_pinned_free_locked(stamps);
    stamps = (uint64_t *)(void *)p;
    for (int i = 0; i < JITCKPT_REWIND_SLOTS; i++)
        stamps[i] = ~0ull;
    if (n)
        memcpy(copy, r, n * sizeof *copy);
    free(ranges);
    ranges = copy;
    nranges = n;
    total = bytes;
    slots = p + STAMP_BYTES;
    valid_from = from;
    return 0;
}

static unsigned char *slot_of(uint64_t minibatch)
{
    return slots + (minibatch % JITCKPT_REWIND_SLOTS) * total;
}

/* Under the call lock, at the boundary before minibatch `minibatch` (before its marker). */
void remote_rewind_save(uint64_t minibatch)
{
    if (!nranges || !remote_rewind_intact() || !remote_recovery_active())
        return;                     /* (a recovery refuses: recover.c asks remote_rewind_intact) */
    struct rcall c;
    uint64_t dst = (uintptr_t)slot_of(minibatch), stamp = (uintptr_t)&stamps[minibatch % JITCKPT_REWIND_SLOTS];
    uint32_t n = (uint32_t)nranges;
    __atomic_store_n(&stamps[minibatch % JITCKPT_REWIND_SLOTS], ~0ull, __ATOMIC_RELEASE);   /* not saved yet */
    remote_begin_locked(&c, JITCKPT_RFN_REWIND);
    rc_put(&c, &dst, sizeof dst);
    rc_put(&c, &stamp, sizeof stamp);
    rc_put(&c, &minibatch, sizeof minibatch);
    rc_put(&c, &n, sizeof n);
    rc_put(&c, ranges, n * sizeof *ranges);
    remote_append_raw(&c, 0);
}

/* The newest minibatch whose start is saved (its stamp written after the copies: watch.c), or 0: none.  The
 * saves are made in order, so the JITCKPT_REWIND_SLOTS minibatches up to it are saved too (those from
 * remote_rewind_from() on). */
uint64_t remote_rewind_saved_upto(void)
{
    uint64_t newest = 0;
    for (int i = 0; nranges && i < JITCKPT_REWIND_SLOTS; i++) {
        uint64_t v = __atomic_load_n(&stamps[i], __ATOMIC_ACQUIRE);
        if (v != ~0ull && v >= valid_from && v > newest)
            newest = v;
    }
    return newest;
}

/* Under the call lock: the state saved at the start of `minibatch` written back.  0, or an error. */
int32_t remote_rewind_restore(struct rcall *c, uint64_t minibatch)
{
    const unsigned char *slot = nranges ? slot_of(minibatch) : NULL;
    int32_t err = 0;
    for (size_t i = 0; i < nranges && err == 0; i++) {
        err = remote_write_device(c, ranges[i].addr, slot, ranges[i].bytes);
        slot += ranges[i].bytes;
    }
    return err;
}
