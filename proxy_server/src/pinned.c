/* pinned.c -- pinned host memory shared with the worker (README.md, "Pinned
 * host memory"; the worker's half is interpose/remote/pinned.c).
 *
 * The worker sends each region's memfd on the socket (struct
 * jitckpt_wire_pinned_fd with SCM_RIGHTS), then a JITCKPT_RFN_HOST_REGISTER
 * record with the same sequence number.  Executing the record, the proxy takes
 * that descriptor -- messages read earlier wait in a short queue: the liveness
 * check drains the socket too, and a record dropped by an abort leaves its
 * message behind, closed when a later one is taken -- checks that the file is
 * sealed against shrinking and large enough (a worker cannot make the proxy
 * fault on a truncated mapping), maps it MAP_SHARED at the worker's address
 * (MAP_FIXED_NOREPLACE: an address taken here fails the call, and the worker
 * keeps that region to itself) and registers it with the runtime
 * (cudaHostRegister), so that copies from and to it are pinned-memory copies
 * of the program's own pages.  JITCKPT_RFN_HOST_UNREGISTER synchronises every
 * device (cudaFreeHost's implicit synchronisation), unregisters and unmaps.
 * rdisp.c lets a direct host pointer through only if pinned_contains() it. */

#define _GNU_SOURCE          /* before dispatch.h's system headers: F_GET_SEALS, MAP_FIXED_NOREPLACE */
#include "dispatch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define QUEUE 64

struct pending { uint64_t seq, addr, size; int fd; };
struct region { uintptr_t addr; size_t size; };

static int sock = -1;
static struct pending queue[QUEUE];
static int nqueue;
static struct region *regions;
static size_t nregions, cap;

static __typeof__(cudaHostRegister) *r_register;
static __typeof__(cudaHostUnregister) *r_unregister;
static __typeof__(cudaPeekAtLastError) *r_peek;
static __typeof__(cudaGetLastError) *r_get_error;

void pinned_set_socket(int s)
{
    sock = s;
}

/* One message from the socket into the queue: 1, 0 (none waiting) or -1 (end, error). */
static int receive_one(void)
{
    struct pollfd pfd = {sock, POLLIN, 0};
    if (sock < 0 || poll(&pfd, 1, 0) <= 0 || !(pfd.revents & POLLIN))
        return 0;
    struct jitckpt_wire_pinned_fd m;
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&m, sizeof m};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    int fd = -1;
    struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    if (n <= 0)
        return -1;                               /* end-of-file: the liveness check says it */
    if (n != (ssize_t)sizeof m || m.magic != JITCKPT_WIRE_PINNED_MAGIC || fd < 0) {
        static int said;
        if (!said && (said = 1))
            plog("the worker sent an unexpected message on the socket (%zd bytes); ignored", n);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (nqueue == QUEUE) {                       /* never taken: its record was dropped long ago */
        close(queue[0].fd);
        memmove(&queue[0], &queue[1], (QUEUE - 1) * sizeof queue[0]);
        nqueue--;
    }
    queue[nqueue++] = (struct pending){m.seq, m.addr, m.size, fd};
    return 1;
}

void pinned_receive(void)
{
    while (receive_one() > 0)
        ;
}

/* The descriptor sent for record `seq` (older ones are closed: their records were dropped), or -1. */
static int take(uint64_t seq, uint64_t addr, uint64_t size)
{
    pinned_receive();
    int fd = -1, k = 0;
    for (int i = 0; i < nqueue; i++) {
        if (queue[i].seq == seq && queue[i].addr == addr && queue[i].size == size && fd < 0)
            fd = queue[i].fd;
        else if (queue[i].seq <= seq)
            close(queue[i].fd);
        else
            queue[k++] = queue[i];
    }
    nqueue = k;
    return fd;
}

int pinned_contains(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < nregions; i++)
        if (a >= regions[i].addr && a - regions[i].addr < regions[i].size)
            return 1;
    return 0;
}

/* [p, p + n) lies in one region mapped from the worker. */
int pinned_contains_range(const void *p, uint64_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < nregions; i++)
        if (a >= regions[i].addr && a - regions[i].addr < regions[i].size)
            return n <= regions[i].size - (a - regions[i].addr);
    return 0;
}

static void resolve(void)
{
    if (r_peek)
        return;
    r_register = (__typeof__(r_register))proxy_sym(cudart, "cudaHostRegister");
    r_unregister = (__typeof__(r_unregister))proxy_sym(cudart, "cudaHostUnregister");
    r_get_error = (__typeof__(r_get_error))proxy_sym(cudart, "cudaGetLastError");
    r_peek = (__typeof__(r_peek))proxy_sym(cudart, "cudaPeekAtLastError");
}

/* A failed runtime call of our own must not become the program's last error. */
static void forget_error(cudaError_t before)
{
    if (before == cudaSuccess && r_get_error)
        r_get_error();
}

static int32_t host_register(struct rdisp *d)
{
    uint64_t seq, addr, size;
    uint32_t flags;
    if (rd_get(d, &seq, sizeof seq) || rd_get(d, &addr, sizeof addr) || rd_get(d, &size, sizeof size) ||
        rd_get(d, &flags, sizeof flags))
        return RD_BAD;
    int fd = take(seq, addr, size);
    if (fd < 0) {
        plog("pinned memory at %#llx: its descriptor did not come with the request", (unsigned long long)addr);
        return cudaErrorInvalidValue;
    }
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < size || seals < 0 || !(seals & F_SEAL_SHRINK) || size == 0 ||
        addr % page || size % page) {
        close(fd);
        plog("pinned memory at %#llx: not a sealed memfd of %llu bytes", (unsigned long long)addr,
             (unsigned long long)size);
        return cudaErrorInvalidValue;
    }
    if (nregions == cap) {
        size_t n = cap ? cap * 2 : 16;
        struct region *grown = realloc(regions, n * sizeof *grown);
        if (!grown) {
            close(fd);
            return cudaErrorMemoryAllocation;
        }
        regions = grown;
        cap = n;
    }
    void *p = mmap((void *)(uintptr_t)addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    int err = errno;
    close(fd);
    if (p != MAP_FAILED && p != (void *)(uintptr_t)addr) {        /* a kernel before 4.17: only a hint */
        munmap(p, size);
        p = MAP_FAILED;
        err = EEXIST;
    }
    if (p == MAP_FAILED) {
        plog("pinned memory at %#llx (%llu bytes) cannot be mapped at the same address in the proxy (%s): its "
             "copies go through the arena", (unsigned long long)addr, (unsigned long long)size, strerror(err));
        return cudaErrorMemoryAllocation;
    }
    resolve();
    cudaError_t before = r_peek ? r_peek() : cudaSuccess;
    cudaError_t rerr = r_register ? r_register(p, size, flags) : cudaErrorNotSupported;
    if (rerr != cudaSuccess) {
        forget_error(before);
        munmap(p, size);
        plog("pinned memory at %#llx: cudaHostRegister failed (%d): its copies go through the arena",
             (unsigned long long)addr, (int)rerr);
        return rerr;
    }
    regions[nregions++] = (struct region){(uintptr_t)addr, size};
    pdebug("pinned memory at %#llx (%llu bytes) shared with the worker", (unsigned long long)addr,
           (unsigned long long)size);
    return 0;
}

static int32_t host_unregister(struct rdisp *d)
{
    uint64_t addr;
    if (rd_get(d, &addr, sizeof addr))
        return RD_BAD;
    size_t i = 0;
    while (i < nregions && regions[i].addr != addr)
        i++;
    if (i == nregions)
        return 0;                                /* not mapped here (a retry after a recovery): nothing to do */
    int32_t err = proxy_sync_all();              /* copies in flight into it complete first */
    resolve();
    cudaError_t before = r_peek ? r_peek() : cudaSuccess;
    if (r_unregister && r_unregister((void *)regions[i].addr) != cudaSuccess)
        forget_error(before);
    munmap((void *)regions[i].addr, regions[i].size);
    regions[i] = regions[--nregions];
    return err;
}

int32_t dispatch_pinned(unsigned fn, struct rdisp *d)
{
    return fn == JITCKPT_RFN_HOST_REGISTER ? host_register(d) : host_unregister(d);
}
