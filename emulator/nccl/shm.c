/* shm.c -- the shared-memory segment that connects the ranks of a
 * communicator, and the futex word they sleep on.
 *
 * The segment is named "/jitckpt-nccl-<32 hex digits>" after the random part
 * of the ncclUniqueId, so the id alone is all a peer needs to find it.  The
 * first rank to arrive creates it (the file only ever grows, so a rank with a
 * different idea of nranks cannot truncate it under another's mapping), every
 * rank claims its slot, and once all nranks have joined the name is unlinked:
 * the mappings stay, /dev/shm stays clean.
 *
 * Environment: JITCKPT_SIMDEV_NCCL_TIMEOUT (seconds, default 300) bounds the
 * wait for all ranks in ncclCommInitRank; JITCKPT_SIMDEV_NCCL_CHUNK (bytes,
 * default 1 MiB) is the per-rank slot size of a collective step. */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define SEG_MAGIC 0x3147455356444d53ull
#define ID_MAGIC "JITCKPT-SIMDEV-NCCL"
#define PAGE 4096u

static size_t round_page(size_t n)
{
    return (n + PAGE - 1) / PAGE * PAGE;
}

static size_t env_size(const char *name, size_t dflt, size_t lo, size_t hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v < lo || v > hi) {
        jitckpt_simdev_log("%s=%s is out of range [%zu, %zu]; using %zu", name, s, lo, hi, dflt);
        return dflt;
    }
    return (size_t)v;
}

static void layout(struct seg *s, int nranks)
{
    s->nranks = nranks;
    s->chunk_bytes = env_size("JITCKPT_SIMDEV_NCCL_CHUNK", 1u << 20, 64, 1u << 30) / 64 * 64;
    size_t pairs = (size_t)nranks * (size_t)nranks;
    s->p2p_bytes = 1u << 20;
    if (pairs > 64) {
        size_t budget = (64u << 20) / pairs;
        s->p2p_bytes = budget < 65536 ? 65536 : budget / PAGE * PAGE;
    }
    size_t off = PAGE;                                         /* header */
    off += round_page((size_t)nranks * sizeof(struct seg_rank));
    off += round_page(pairs * sizeof(struct seg_chan));
    off += round_page(2 * (size_t)nranks * s->chunk_bytes);
    off += pairs * s->p2p_bytes;
    s->len = off;
}

static void place(struct seg *s, unsigned char *base)
{
    size_t pairs = (size_t)s->nranks * (size_t)s->nranks;
    size_t off = PAGE;
    s->hdr = (struct seg_header *)base;
    s->ranks = (struct seg_rank *)(base + off);
    off += round_page((size_t)s->nranks * sizeof(struct seg_rank));
    s->chans = (struct seg_chan *)(base + off);
    off += round_page(pairs * sizeof(struct seg_chan));
    s->coll = base + off;
    off += round_page(2 * (size_t)s->nranks * s->chunk_bytes);
    s->p2p = base + off;
}

unsigned char *seg_coll_slot(struct seg *s, int buf, int rank)
{
    return s->coll + ((size_t)buf * (size_t)s->nranks + (size_t)rank) * s->chunk_bytes;
}

unsigned char *seg_p2p_ring(struct seg *s, int src, int dst)
{
    return s->p2p + ((size_t)src * (size_t)s->nranks + (size_t)dst) * s->p2p_bytes;
}

uint32_t seg_futex_value(struct seg *s)
{
    return __atomic_load_n(&s->hdr->futex, __ATOMIC_ACQUIRE);
}

void seg_wake(struct seg *s)
{
    __atomic_add_fetch(&s->hdr->futex, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &s->hdr->futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void seg_wait(struct seg *s, uint32_t seen, int timeout_ms)
{
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
    syscall(SYS_futex, &s->hdr->futex, FUTEX_WAIT, seen, &ts, NULL, 0);
}

void seg_unmap(struct seg *s)
{
    if (s->hdr)
        munmap(s->hdr, s->len);
    s->hdr = NULL;
}

void seg_mark_aborted(struct ncclComm *c)
{
    if (!c->seg.hdr)
        return;
    __atomic_store_n(&c->seg.ranks[c->rank].aborted, 1, __ATOMIC_RELEASE);
    seg_wake(&c->seg);
}

/* ---- unique ids ---------------------------------------------------------- */

struct id_layout {
    char magic[20];
    unsigned char secret[16];
    int32_t creator_pid;
};

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return report_error(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    struct id_layout id;
    memset(&id, 0, sizeof id);
    memcpy(id.magic, ID_MAGIC, sizeof ID_MAGIC);
    size_t got = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, id.secret, sizeof id.secret);
        got = n > 0 ? (size_t)n : 0;
        close(fd);
    }
    if (got != sizeof id.secret)
        return report_error(ncclSystemError, "ncclGetUniqueId: cannot read /dev/urandom");
    id.creator_pid = (int32_t)getpid();
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &id, sizeof id);
    return ncclSuccess;
}

static int id_to_name(const ncclUniqueId *uid, char *name, size_t len)
{
    struct id_layout id;
    memcpy(&id, uid->internal, sizeof id);
    if (memcmp(id.magic, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return 0;
    int n = snprintf(name, len, "/jitckpt-nccl-");
    for (size_t i = 0; i < sizeof id.secret; i++)
        n += snprintf(name + n, len - (size_t)n, "%02x", id.secret[i]);
    return 1;
}

/* ---- joining --------------------------------------------------------------- */

static int cas32(int32_t *p, int32_t expect, int32_t want, int32_t *seen)
{
    int32_t e = expect;
    int ok = __atomic_compare_exchange_n(p, &e, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    *seen = ok ? want : e;
    return ok;
}

ncclResult_t seg_join(struct ncclComm *c, const ncclUniqueId *id)
{
    if (!id_to_name(id, c->name, sizeof c->name))
        return report_error(ncclInvalidArgument, "ncclCommInitRank: the ncclUniqueId was not made "
                          "by this library's ncclGetUniqueId (bad magic)");
    layout(&c->seg, c->nranks);
    int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return report_error(ncclSystemError, "ncclCommInitRank: shm_open(%s): %s", c->name,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 ||
        ((size_t)st.st_size < c->seg.len && ftruncate(fd, (off_t)c->seg.len) != 0)) {
        int e = errno;
        close(fd);
        return report_error(ncclSystemError, "ncclCommInitRank: cannot size %s to %zu bytes: %s",
                          c->name, c->seg.len, strerror(e));
    }
    void *base = mmap(NULL, c->seg.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED)
        return report_error(ncclSystemError, "ncclCommInitRank: mmap of %s: %s", c->name,
                          strerror(errno));
    place(&c->seg, base);
    struct seg_header *h = c->seg.hdr;

    uint64_t expect = 0;
    __atomic_compare_exchange_n(&h->magic, &expect, SEG_MAGIC, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    int32_t seen;
    if (!cas32(&h->nranks, 0, c->nranks, &seen) && seen != c->nranks) {
        seg_unmap(&c->seg);
        return report_error(ncclInvalidUsage, "ncclCommInitRank: rank %d says nranks=%d but a rank "
                          "that joined earlier said nranks=%d", c->rank, c->nranks, seen);
    }
    if (!cas32((int32_t *)&h->chunk_bytes, 0, (int32_t)c->seg.chunk_bytes, &seen) &&
        seen != (int32_t)c->seg.chunk_bytes) {
        seg_unmap(&c->seg);
        return report_error(ncclInvalidUsage, "ncclCommInitRank: rank %d uses "
                          "JITCKPT_SIMDEV_NCCL_CHUNK=%zu but another rank uses %d; set the same "
                          "value in every rank", c->rank, c->seg.chunk_bytes, seen);
    }
    __atomic_store_n(&h->p2p_bytes, (uint32_t)c->seg.p2p_bytes, __ATOMIC_RELEASE);
    if (!cas32(&c->seg.ranks[c->rank].pid, 0, (int32_t)getpid(), &seen)) {
        seg_unmap(&c->seg);
        return report_error(ncclInvalidUsage, "ncclCommInitRank: rank %d of this communicator was "
                          "already claimed (by pid %d); every rank must be unique", c->rank, seen);
    }
    __atomic_add_fetch(&h->joined, 1, __ATOMIC_ACQ_REL);
    seg_wake(&c->seg);
    return ncclSuccess;
}

ncclResult_t seg_wait_all_joined(struct ncclComm *c)
{
    size_t timeout_s = env_size("JITCKPT_SIMDEV_NCCL_TIMEOUT", 300, 1, 1u << 30);
    uint64_t deadline = now_ns() + (uint64_t)timeout_s * 1000000000ull;
    struct seg_header *h = c->seg.hdr;
    for (;;) {
        uint32_t seen = seg_futex_value(&c->seg);
        if (__atomic_load_n(&h->joined, __ATOMIC_ACQUIRE) >= (uint32_t)c->nranks)
            break;
        if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
            return report_error(ncclInvalidUsage, "ncclCommInitRank: communicator aborted while "
                              "waiting for its peers");
        if (now_ns() > deadline) {
            char missing[256] = "";
            size_t n = 0;
            for (int r = 0; r < c->nranks && n < sizeof missing - 16; r++)
                if (__atomic_load_n(&c->seg.ranks[r].pid, __ATOMIC_ACQUIRE) == 0)
                    n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%d", n ? "," : "", r);
            shm_unlink(c->name);
            return report_error(ncclSystemError, "ncclCommInitRank: rank %d waited %zu s "
                              "(JITCKPT_SIMDEV_NCCL_TIMEOUT) and ranks [%s] of %d never joined",
                              c->rank, timeout_s, missing, c->nranks);
        }
        seg_wait(&c->seg, seen, 100);
    }
    shm_unlink(c->name);        /* everyone has it mapped; ENOENT if a peer was first */
    return ncclSuccess;
}
