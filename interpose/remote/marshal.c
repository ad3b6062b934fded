/* marshal.c -- the worker's half of the wire format (jitckpt_remote_wire.h):
 * arguments into the request, host buffers into the arena (or, inside pinned
 * memory shared with the proxy, as their own pointers), results out of the
 * response.  The proxy's half is proxy_server/src/rdisp.c. */

#include <stdlib.h>
#include <string.h>

#include "remote.h"

void rc_put(struct rcall *c, const void *p, size_t n)
{
    if (c->req + n > JITCKPT_WIRE_REQ_MAX) {
        c->overflow = 1;
        return;
    }
    memcpy(c->w->req + c->req, p, n);
    c->req += n;
}

void rc_put_handle(struct rcall *c, const void *handle)
{
    uint64_t id = (uint64_t)(uintptr_t)handle;
    rc_put(c, &id, sizeof id);
}

void rc_put_flag(struct rcall *c, int on)
{
    unsigned char b = on != 0;
    rc_put(c, &b, 1);
}

void rc_put_string(struct rcall *c, const char *s)
{
    uint32_t n = s ? (uint32_t)strlen(s) : UINT32_MAX;
    rc_put(c, &n, sizeof n);
    if (s)
        rc_put(c, s, n);
}

/* Reserves n bytes of the arena (client.c: a ring, 8-byte aligned); writes size and offset.
 * A buffer `host` that lies in a pinned region the proxy has mapped (pinned.c)
 * takes no arena: it crosses as its pointer, which the caller sent before
 * (size 0, offset JITCKPT_WIRE_PINNED); *direct says so. */
static void *reserve(struct rcall *c, const void *host, size_t n, int out, int *direct)
{
    uint64_t size = n, off = 0;
    void *p = NULL;
    *direct = host && n && remote_pinned_shared(host, n);
    if (*direct) {
        size = 0;
        off = JITCKPT_WIRE_PINNED;
        /* A copy into pinned memory is asynchronous, unless a replay would have
         * to know whether the program already saw its bytes (recovery on: the
         * replay never writes the program's buffer, README "Pinned host memory"),
         * or every call waits (JITCKPT_REMOTE_SYNC=1). */
        if (out && !remote_capturing_now() && (remote_sync_all || remote_recovery_active()))
            off |= JITCKPT_WIRE_PINNED_COMPLETE;     /* (a captured copy runs only at the graph's launch) */
    } else if (n && (p = remote_arena_alloc(c, n, &off)) == NULL) {
        c->overflow = 1;
        size = 0;
    }
    if (c->nbuf < 4 && c->req + 16 <= JITCKPT_WIRE_REQ_MAX) {   /* for replay and retries (recover.c) */
        c->buf_pos[c->nbuf] = (uint32_t)c->req;
        c->buf_out[c->nbuf] = (uint32_t)out;
        c->buf_direct[c->nbuf] = (uint32_t)*direct;
        c->buf_len[c->nbuf] = *direct ? n : size;
        c->buf_ptr[c->nbuf++] = *direct ? (void *)host : p;
    } else {
        c->log_in_over = 1;
    }
    rc_put(c, &size, sizeof size);
    rc_put(c, &off, sizeof off);
    if (out && (p || (off & JITCKPT_WIRE_PINNED_COMPLETE)))
        c->has_out = 1;
    return p;
}

/* The call log (calllog.c) keeps the bytes of every host input: from the arena,
 * or a direct one's from the program's buffer (what the device reads, if the
 * program keeps CUDA's rule of not changing it until the copy completed). */
static void log_input(struct rcall *c, const void *bytes, size_t n)
{
    if (!c->log)
        return;
    if (c->log_nin < 4) {
        c->log_in[c->log_nin] = bytes;
        c->log_in_len[c->log_nin++] = n;
    } else {
        c->log_in_over = 1;
    }
}

static void put_in(struct rcall *c, const void *p, size_t n, int may_be_direct)
{
    int direct;
    void *to = reserve(c, may_be_direct ? p : NULL, n, 0, &direct);
    if (to)
        memcpy(to, p, n);
    if (to || direct)
        log_input(c, to ? to : p, n);
}

void rc_put_in(struct rcall *c, const void *p, size_t n)
{
    put_in(c, p, n, 0);
}

void rc_put_host_in(struct rcall *c, const void *p, size_t n)
{
    put_in(c, p, n, 1);
}

void *rc_put_out(struct rcall *c, size_t n)
{
    int direct;
    return reserve(c, NULL, n, 1, &direct);
}

void *rc_put_host_out(struct rcall *c, const void *p, size_t n)
{
    int direct;
    return reserve(c, p, n, 1, &direct);     /* NULL when direct: nothing to copy back */
}

void *rc_put_host_inout(struct rcall *c, const void *p, size_t n)
{
    int direct;
    void *to = reserve(c, p, n, 1, &direct);
    if (to)
        memcpy(to, p, n);
    return to;
}

void rc_get_out(struct rcall *c, void *dst, const void *from, size_t n)
{
    if (c->ret == 0 && from && n)
        memcpy(dst, from, n);
}

int rc_get(struct rcall *c, void *p, size_t n)
{
    if (c->rep + n > c->w->rep_len)
        return -1;                      /* the proxy sent no such output (an early error) */
    memcpy(p, c->w->rep + c->rep, n);
    c->rep += n;
    return 0;
}

void rc_get_handle(struct rcall *c, void **handle)
{
    uint64_t id;
    if (rc_get(c, &id, sizeof id) == 0)
        *handle = (void *)(uintptr_t)id;
}

/* Strings the proxy returned, kept for the life of the process (the API's
 * strings, such as kernel names, are never freed either). */
struct kept { struct kept *next; char s[]; };
static struct kept *kept;

const char *rc_get_string(struct rcall *c)
{
    uint32_t n;
    if (rc_get(c, &n, sizeof n) != 0 || n == UINT32_MAX || c->rep + n > c->w->rep_len)
        return NULL;
    const char *s = (const char *)c->w->rep + c->rep;
    c->rep += n;
    for (struct kept *k = kept; k; k = k->next)        /* under the call lock */
        if (strlen(k->s) == n && memcmp(k->s, s, n) == 0)
            return k->s;
    struct kept *k = malloc(sizeof *k + n + 1);
    if (!k)
        return NULL;
    memcpy(k->s, s, n);
    k->s[n] = '\0';
    k->next = kept;
    kept = k;
    return k->s;
}
