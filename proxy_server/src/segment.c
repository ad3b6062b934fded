/* segment.c -- the shared-memory segment of one worker (jitckpt_remote_wire.h).
 *
 * An anonymous memfd, never named in the file system: the only way to it is
 * the descriptor the proxy hands its worker over the socket (listen.c).
 * Sealed against resizing, so the worker cannot shrink it under the proxy.
 * Layout: the header (with the response and the worker's staging area), the
 * request ring (JITCKPT_PROXY_RING_KIB, default 2 MiB), the bulk-data arena
 * (--arena-mib), each page-aligned. */

#include "proxy.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>


static uint64_t ring_bytes(void)
{
    const char *s = getenv(PROXY_ENV_RING_KIB);
    uint64_t n = s && *s ? strtoull(s, NULL, 10) << 10 : JITCKPT_WIRE_DEFAULT_RING;
    if (n < JITCKPT_WIRE_MIN_RING)
        n = JITCKPT_WIRE_MIN_RING;
    return (n + 4095) & ~4095ull;
}

struct jitckpt_wire *segment_create(uint64_t arena_bytes, int *fd_out)
{
    uint64_t ring_off = (sizeof(struct jitckpt_wire) + 4095) & ~4095ull;
    uint64_t ring_size = ring_bytes();
    uint64_t arena_off = ring_off + ring_size;
    uint64_t size = arena_off + ((arena_bytes + 4095) & ~4095ull);
    int fd = memfd_create("jitckpt-proxy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        plog("cannot create the shared segment (%llu bytes)", (unsigned long long)size);
        return NULL;
    }
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    struct jitckpt_wire *w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w == MAP_FAILED) {
        plog("cannot map the shared segment");
        close(fd);
        return NULL;
    }
    w->magic = JITCKPT_WIRE_MAGIC;
    w->version = JITCKPT_WIRE_VERSION;
    w->segment_size = size;
    w->ring_offset = ring_off;
    w->ring_size = ring_size;
    w->arena_offset = arena_off;
    w->arena_size = size - arena_off;
    *fd_out = fd;
    return w;
}
