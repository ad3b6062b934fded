/* handles.c -- virtual handles: the worker's ids and the runtime's handles.
 *
 * The worker never sees a real stream, event, kernel or module handle: every
 * one the runtime hands out gets a virtual id (JITCKPT_VH_MAKE: tag, kind,
 * counter), and every id the worker sends is looked up here.  Ids are never
 * reused, so a stale id is an error, not another object.  Replay after a
 * proxy restart (a later milestone) re-creates the objects and rebinds the
 * same ids.  Ids 0, 1 and 2 of streams are the NULL stream, cudaStreamLegacy
 * and cudaStreamPerThread and cross unchanged. */

#include "proxy.h"

#include <stdlib.h>


struct slot { uint64_t vid; void *real; };
struct table { struct slot *slots; size_t cap, used; uint64_t next; };
static struct table tables[VH_NKINDS];

static size_t hash(uint64_t vid, size_t cap)
{
    return (size_t)((vid * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

static int grow(struct table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 256, used = 0;
    struct slot *s = calloc(cap, sizeof *s);
    if (!s)
        return -1;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].vid && t->slots[i].real) {          /* tombstones are dropped */
            size_t j = hash(t->slots[i].vid, cap);
            while (s[j].vid)
                j = (j + 1) & (cap - 1);
            s[j] = t->slots[i];
            used++;
        }
    t->used = used;
    free(t->slots);
    t->slots = s;
    t->cap = cap;
    return 0;
}

/* Kernels and modules come back for the same object many times: the same id. */
static uint64_t find_real(struct table *t, void *real)
{
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].vid && t->slots[i].real == real)
            return t->slots[i].vid;
    return 0;
}

uint64_t vh_insert(int kind, void *real)
{
    struct table *t = &tables[kind];
    if (kind == VH_KERNEL || kind == VH_MODULE) {
        uint64_t vid = find_real(t, real);
        if (vid)
            return vid;
    }
    if ((t->used + 1) * 2 > t->cap && grow(t) != 0)
        return 0;
    uint64_t vid = JITCKPT_VH_MAKE(kind, ++t->next);
    size_t j = hash(vid, t->cap);
    while (t->slots[j].vid)
        j = (j + 1) & (t->cap - 1);
    t->slots[j] = (struct slot){vid, real};
    t->used++;
    return vid;
}

int vh_lookup(int kind, uint64_t vid, void **real)
{
    if (kind == VH_STREAM && vid <= 2) {
        *real = (void *)(uintptr_t)vid;
        return 0;
    }
    if (vid == 0) {
        *real = NULL;
        return 0;
    }
    struct table *t = &tables[kind];
    if (!JITCKPT_VH_IS_VIRTUAL(vid) || JITCKPT_VH_KIND(vid) != kind || t->cap == 0)
        return -1;
    for (size_t j = hash(vid, t->cap);; j = (j + 1) & (t->cap - 1)) {
        if (t->slots[j].vid == 0)
            return -1;
        if (t->slots[j].vid == vid) {
            if (t->slots[j].real == NULL)
                return -1;                    /* destroyed */
            *real = t->slots[j].real;
            return 0;
        }
    }
}

/* The slot stays (a tombstone: real NULL), so probing still finds later ids. */
void vh_forget(int kind, uint64_t vid)
{
    struct table *t = &tables[kind];
    if (vid == 0 || t->cap == 0)
        return;
    for (size_t j = hash(vid, t->cap);; j = (j + 1) & (t->cap - 1)) {
        if (t->slots[j].vid == 0)
            return;
        if (t->slots[j].vid == vid) {
            t->slots[j].real = NULL;
            return;
        }
    }
}
