/* rewind.c -- device state a minibatch changes in place before its optimizer
 * step (proxy_server/README.md, "Recovery", "State changed in place").
 *
 * A recovery meets the device as the failure left it: the forward and
 * backward passes over, the optimizer not yet run, and replays the minibatch
 * from its call log.  That is exact for everything the minibatch writes before
 * it reads, but not for state it updates in place: BatchNorm's running mean and
 * variance, PyTorch's num_batches_tracked, a counter.  A replay would update
 * those a second time.  Replay validation (recover.c) finds them: the bytes
 * where the replayed minibatch ends differently, in memory older than the
 * minibatch.  From then on the worker has the proxy copy those byte ranges at
 * every minibatch boundary, in the device's order (proxy_server/src/watch.c,
 * JITCKPT_RFN_REWIND), into one of two slots of pinned host memory shared
 * with it (pinned.c; the slot of the minibatch's parity: the host may be one
 * minibatch ahead of the device), and a recovery writes the resumed
 * minibatch's slot back before the replay.
 *
 * The slots are host memory, so they outlive the device memory: a rank whose
 * proxy died or whose device failed takes the replica's memory and then its
 * own values of that state (BatchNorm's statistics are per rank), provided the
 * device had saved them (recover.c decides).  Until validation has learned the
 * ranges, a library call known to change state in place (dnn.c: BatchNorm in
 * training mode) holds recovery back: a failure then stops the job with the
 * reason. */

#include "remote.h"

#include <stdlib.h>
#include <string.h>

static struct rewind_range *ranges;
static size_t nranges;
static uint64_t total;               /* bytes of one slot */
static unsigned char *slots;         /* two slots, minibatch parity (pinned, shared with the proxy) */
static uint64_t valid_from;          /* the first minibatch whose start a slot holds */
static const char *unlearned;        /* a call changes state in place that validation has not learned yet */

size_t remote_rewind_ranges(const struct rewind_range **out)
{
    if (out)
        *out = ranges;
    return nranges;
}

uint64_t remote_rewind_bytes(void) { return total; }
uint64_t remote_rewind_from(void) { return nranges ? valid_from : 0; }
const char *remote_rewind_unlearned(void) { return unlearned; }
void remote_rewind_learned(void) { unlearned = NULL; }

static int covered(const void *p)
{
    for (size_t i = 0; i < nranges; i++)
        if ((uintptr_t)p >= ranges[i].addr && (uintptr_t)p < ranges[i].addr + ranges[i].bytes)
            return 1;
    return 0;
}

void remote_rewind_pending(const char *why, const void *a, const void *b)
{
    if (unlearned || !remote_recovery_active() || ((!a || covered(a)) && (!b || covered(b))))
        return;
    unlearned = why;
    const char *r = getenv("RANK");
    rlog("rank %s: %s: a replay would apply that twice.  Transparent recovery waits until replay validation has learned "
         "the state changed in place (JITCKPT_TRANSPARENT_VALIDATE_AT, default minibatch 5); a failure before "
         "then stops every rank (exit status 75) and the job falls back to its checkpoints.", r && *r ? r : "0", why);
}

/* Under the call lock: rewind `n` ranges from minibatch `from` on (its start is saved at the boundary
 * before it).  0, or -1 (no pinned memory the proxy can write: said). */
int remote_rewind_adopt(const struct rewind_range *r, size_t n, uint64_t from)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += r[i].bytes;
    struct rewind_range *copy = malloc((n ? n : 1) * sizeof *copy);
    unsigned char *p = copy ? remote_pinned_alloc_locked(2 * bytes) : NULL;
    if (!p) {
        free(copy);
        rlog("cannot have %llu bytes of pinned host memory shared with the device proxy for the state changed in "
             "place", (unsigned long long)(2 * bytes));
        return -1;
    }
    if (slots)
        remote_pinned_free_locked(slots);
    memcpy(copy, r, n * sizeof *copy);
    free(ranges);
    ranges = copy;
    nranges = n;
    total = bytes;
    slots = p;
    valid_from = from;
    return 0;
}

/* Under the call lock, at the boundary before minibatch `minibatch` (before its marker). */
void remote_rewind_save(uint64_t minibatch)
{
    if (!nranges)
        return;
    struct rcall c;
    uint64_t dst = (uintptr_t)(slots + (minibatch & 1) * total);
    uint32_t n = (uint32_t)nranges;
    remote_begin_locked(&c, JITCKPT_RFN_REWIND);
    rc_put(&c, &dst, sizeof dst);
    rc_put(&c, &n, sizeof n);
    rc_put(&c, ranges, n * sizeof *ranges);
    remote_append_raw(&c, 0);
}

/* Under the call lock: the state saved at the start of `minibatch` written back.  0, or an error. */
int32_t remote_rewind_restore(struct rcall *c, uint64_t minibatch)
{
    const unsigned char *slot = slots + (minibatch & 1) * total;
    int32_t err = 0;
    for (size_t i = 0; i < nranges && err == 0; i++) {
        err = remote_write_device(c, ranges[i].addr, slot, ranges[i].bytes);
        slot += ranges[i].bytes;
    }
    return err;
}
