/* marshal.c -- the worker's half of the wire format (jitckpt_remote_wire.h):
 * arguments into the request, host buffers into the arena, results out of
 * the response.  The proxy's half is proxy_server/src/rdisp.c. */

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

/* Reserves n bytes of the arena (client.c: a ring, 8-byte aligned); writes size and offset. */
static void *reserve(struct rcall *c, size_t n, int out)
{
    uint64_t size = n, off = 0;
    void *p = NULL;
    if (n && (p = remote_arena_alloc(c, n, &off)) == NULL) {
        c->overflow = 1;
        size = 0;
    }
    if (c->nbuf < 4 && c->req + 16 <= JITCKPT_WIRE_REQ_MAX) {   /* for replay and retries (recover.c) */
        c->buf_pos[c->nbuf] = (uint32_t)c->req;
        c->buf_out[c->nbuf] = (uint32_t)out;
        c->buf_len[c->nbuf] = size;
        c->buf_ptr[c->nbuf++] = p;
    } else {
        c->log_in_over = 1;
    }
    rc_put(c, &size, sizeof size);
    rc_put(c, &off, sizeof off);
    if (p && out)
        c->has_out = 1;
    return p;
}

void rc_put_in(struct rcall *c, const void *p, size_t n)
{
    void *to = reserve(c, n, 0);
    if (to)
        memcpy(to, p, n);
    if (to && c->log) {                 /* for the call log (calllog.c) */
        if (c->log_nin < 4) {
            c->log_in[c->log_nin] = to;
            c->log_in_len[c->log_nin++] = n;
        } else {
            c->log_in_over = 1;
        }
    }
}

void *rc_put_out(struct rcall *c, size_t n)
{
    return reserve(c, n, 1);
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
