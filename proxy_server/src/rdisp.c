/* rdisp.c -- the proxy's half of the wire format (jitckpt_remote_wire.h):
 * arguments out of the request, host buffers in the arena, results into the
 * response.  Every read is bounds-checked: a malformed request fails its
 * call, never the proxy. */

#include "dispatch.h"

#include <stdlib.h>


int rd_get(struct rdisp *d, void *p, size_t n)
{
    if (d->req + n > d->req_len)
        return -1;
    memcpy(p, d->w->req + d->req, n);
    d->req += n;
    return 0;
}

int rd_flag(struct rdisp *d)
{
    unsigned char b = 0;
    return rd_get(d, &b, 1) == 0 && b;
}

int rd_get_handle(struct rdisp *d, int kind, uint64_t *vid, void **real)
{
    if (rd_get(d, vid, sizeof *vid) != 0)
        return -1;
    if (vh_lookup(kind, *vid, real) != 0)
        return -1;
    return watch_handle(kind, *vid);        /* may hold the record back (watch.c), or drop it */
}

int rd_get_string(struct rdisp *d, char **out)
{
    uint32_t n;
    *out = NULL;
    if (rd_get(d, &n, sizeof n) != 0)
        return -1;
    if (n == UINT32_MAX)
        return 0;
    if (d->req + n > d->req_len)
        return -1;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return -1;
    memcpy(s, d->w->req + d->req, n);
    s[n] = '\0';
    d->req += n;
    *out = s;
    return 0;
}

/* A host buffer: size and arena offset.  Size 0: the pointer (already in *p)
 * crosses unchanged: a device address, or -- offset JITCKPT_WIRE_PINNED -- a
 * buffer in pinned memory shared with the worker, which must lie in a region
 * this proxy mapped (pinned.c); 1 if a copy into it must complete before the
 * answer, as one into the arena does. */
static int host_buffer(struct rdisp *d, const void **p)
{
    uint64_t n, off;
    if (rd_get(d, &n, sizeof n) != 0 || rd_get(d, &off, sizeof off) != 0)
        return -1;
    if (n == 0 && (off & ~JITCKPT_WIRE_PINNED_COMPLETE) == JITCKPT_WIRE_PINNED)
        return pinned_contains(*p) ? (int)(off & JITCKPT_WIRE_PINNED_COMPLETE) : -1;
    if (n == 0)
        return 0;
    if (off > d->arena_size || n > d->arena_size - off)
        return -1;
    *p = d->arena + off;
    return 1;
}

int rd_host_in(struct rdisp *d, const void **p)
{
    return host_buffer(d, p) < 0 ? -1 : 0;
}

int rd_host_out(struct rdisp *d, const void **p)
{
    int r = host_buffer(d, p);
    if (r > 0)
        d->has_out = 1;
    return r < 0 ? -1 : 0;
}

int rd_has_out(struct rdisp *d)
{
    return d->has_out;
}

void rd_put(struct rdisp *d, const void *p, size_t n)
{
    if (d->rep + n > JITCKPT_WIRE_REP_MAX)
        return;                               /* the worker then finds the output missing */
    memcpy(d->w->rep + d->rep, p, n);
    d->rep += n;
}

void rd_put_new_handle(struct rdisp *d, int kind, void *real)
{
    uint64_t vid = real != NULL ? vh_insert(kind, real) : 0;
    rd_put(d, &vid, sizeof vid);
}

void rd_put_string(struct rdisp *d, const char *s)
{
    uint32_t n = s ? (uint32_t)strlen(s) : UINT32_MAX;
    rd_put(d, &n, sizeof n);
    if (s)
        rd_put(d, s, n);
}

/* A `func` argument (cudaFuncGetParamInfo, cudaFuncGetAttributes, ...) is a host
 * stub, which crosses as itself, or a kernel handle, whose virtual id becomes the
 * runtime's handle. */
const void *rd_func(const void *func)
{
    uint64_t id = (uint64_t)(uintptr_t)func;
    void *real = NULL;
    if (JITCKPT_VH_IS_VIRTUAL(id) && JITCKPT_VH_KIND(id) == VH_KERNEL && vh_lookup(VH_KERNEL, id, &real) == 0)
        return real;
    return func;
}
