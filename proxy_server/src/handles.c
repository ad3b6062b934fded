/* handles.c -- virtual handles: the worker's ids and the runtime's handles.
 *
 * The worker never sees a real stream, event, kernel or module handle: every
 * one the runtime hands out gets a virtual id (JITCKPT_VH_MAKE: tag, kind,
 * counter), and every id the worker sends is looked up here.  Ids are never
 * reused, so a stale id is an error, not another object.  After a proxy
 * restart the worker re-creates its objects in the new proxy and rebinds the
 * same ids (vh_bind, and vh_expect for objects created by an ordinary call:
 * registrations, kernels; restore.c).  Ids 0, 1 and 2 of streams are the NULL stream, cudaStreamLegacy
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

static uint64_t expected[VH_NKINDS];    /* vh_expect: the id the next vh_insert of a kind gets */

static int bind(struct table *t, uint64_t vid, void *real)
{
    if ((t->used + 1) * 2 > t->cap && grow(t) != 0)
        return -1;
    size_t j = hash(vid, t->cap);
    while (t->slots[j].vid) {
        if (t->slots[j].vid == vid)
            return -1;                      /* already bound (or destroyed): ids are never reused */
        j = (j + 1) & (t->cap - 1);
    }
    t->slots[j] = (struct slot){vid, real};
    t->used++;
    uint64_t n = vid & ((1ull << 40) - 1);
    if (n > t->next)
        t->next = n;                        /* ids made later stay above every bound one */
    return 0;
}

/* Binds a given virtual id (one the worker had from the proxy this one replaces)
 * to a new real handle.  -1 if the id is not of this kind or already bound. */
int vh_bind(int kind, uint64_t vid, void *real)
{
    if (kind <= 0 || kind >= VH_NKINDS || !JITCKPT_VH_IS_VIRTUAL(vid) || JITCKPT_VH_KIND(vid) != kind || !real)
        return -1;
    return bind(&tables[kind], vid, real);
}

/* The next vh_insert of this kind returns vid (bound to its real handle)
 * instead of a new id: re-creating an object through the ordinary call. */
void vh_expect(int kind, uint64_t vid)
{
    if (kind > 0 && kind < VH_NKINDS)
        expected[kind] = vid;
}

uint64_t vh_insert(int kind, void *real)
{
    struct table *t = &tables[kind];
    if (expected[kind]) {
        uint64_t vid = expected[kind];
        expected[kind] = 0;
        return vh_bind(kind, vid, real) == 0 ? vid : 0;
    }
    if (kind == VH_KERNEL || kind == VH_MODULE || kind == VH_GRAPH) {   /* a graph: the capture's, then its result */
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

/* Recovery (watch.c, restore.c): the same id, a new real handle (a rebuilt
 * communicator).  -1 if the id was never bound. */
int vh_rebind(int kind, uint64_t vid, void *real)
{
    struct table *t = &tables[kind];
    if (vid == 0 || t->cap == 0 || !real)
        return -1;
    for (size_t j = hash(vid, t->cap);; j = (j + 1) & (t->cap - 1)) {
        if (t->slots[j].vid == 0)
            return -1;
        if (t->slots[j].vid == vid) {
            t->slots[j].real = real;
            return 0;
        }
    }
}

/* Calls fn for every live handle of a kind (the watcher's communicators, the
 * markers' streams).  Returns how many. */
size_t vh_each(int kind, void (*fn)(uint64_t vid, void *real, void *arg), void *arg)
{
    struct table *t = &tables[kind];
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].vid && t->slots[i].real) {
            if (fn)
                fn(t->slots[i].vid, t->slots[i].real, arg);
            n++;
        }
    return n;
}
