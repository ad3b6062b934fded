/* serve.c -- the proxy's loop: wait for the doorbell, execute the call,
 * answer.  End-of-file on the socket means the worker is gone; the loop
 * returns and the proxy exits.
 *
 * Milestone 1 executes every call at once and in order on this one thread,
 * and answers when the runtime returned: an asynchronous call (a launch, a
 * copy from pinned memory) is then queued on its stream by the runtime, so
 * the worker waits for the enqueue, not for the work. */

#include "dispatch.h"

#include <errno.h>
#include <unistd.h>


static void execute(struct jitckpt_wire *w, uint64_t arena_size)
{
    struct rdisp d = {.w = w, .arena = (unsigned char *)w + w->arena_offset, .arena_size = arena_size};
    uint32_t req_len = w->req_len;
    d.req_len = req_len <= JITCKPT_WIRE_REQ_MAX ? req_len : 0;
    unsigned fn = w->fn;
    int32_t ret;
    int handled = 0;
    ret = dispatch_special(fn, &d, &handled);
    if (!handled) {
        if (fn < RFN_count && dispatch_generated[fn].fn) {
            ret = dispatch_generated[fn].fn(&d);
            pdebug("%s -> %d", dispatch_generated[fn].name, ret);
        } else {
            plog("the worker sent unknown function id %u (is it built from the same sources?)", fn);
            ret = cudaErrorNotSupported;
        }
    }
    w->ret = ret;
    w->rep_len = (uint32_t)d.rep;
}

int serve(int sock, struct jitckpt_wire *w)
{
    uint64_t arena_size = w->arena_size;         /* before the worker can touch it */
    for (;;) {
        char b;
        ssize_t n = read(sock, &b, 1);
        if (n == 0)
            return 0;                            /* the worker exited */
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == ECONNRESET ? 0 : -1;
        }
        execute(w, arena_size);
        if (write(sock, &b, 1) != 1)
            return 0;
    }
}
