/* client.c -- the worker's connection to its device proxy, and the call.
 *
 * At the first CUDA call the library connects to the Unix socket named by
 * JITCKPT_PROXY_SOCKET, receives the hello and the segment's file
 * descriptor (SCM_RIGHTS), maps the segment, and keeps the socket as the
 * doorbell.  A call: fill the request (marshal.c), write one byte, read one
 * byte, read the response.  A proxy that is gone (end-of-file) makes every
 * later call fail with cudaErrorDevicesUnavailable, said once on stderr. */

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "remote.h"

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static struct jitckpt_wire *wire;
static int sock = -1;
static int dead;              /* 1: no proxy (never connected, or gone) */
static int said_dead;

static int fail(const char *what)
{
    rlog("cannot reach the device proxy: %s; every CUDA call will fail with cudaErrorDevicesUnavailable", what);
    said_dead = 1;
    dead = 1;
    return -1;
}

static int connect_proxy(void)
{
    const char *path = getenv(JITCKPT_PROXY_SOCKET_ENV);
    if (path == NULL || *path == '\0')
        return fail(JITCKPT_PROXY_SOCKET_ENV " is not set (start the program with jitckpt-proxy)");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return fail("the socket path is too long");
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        if (fd >= 0)
            close(fd);
        return fail(strerror(errno));
    }
    struct jitckpt_wire_hello hello;
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&hello, sizeof hello};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (n != (ssize_t)sizeof hello || hello.magic != JITCKPT_WIRE_MAGIC || hello.status != 0 || cm == NULL ||
        cm->cmsg_type != SCM_RIGHTS) {
        close(fd);
        return fail("the proxy refused this process (it serves one worker: its own pid check) or spoke another "
                    "protocol");
    }
    if (hello.version != JITCKPT_WIRE_VERSION) {
        close(fd);
        return fail("the proxy speaks another wire version (rebuild the proxy and this library together)");
    }
    int seg;
    memcpy(&seg, CMSG_DATA(cm), sizeof seg);
    void *p = mmap(NULL, hello.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, seg, 0);
    close(seg);
    if (p == MAP_FAILED) {
        close(fd);
        return fail("cannot map the shared segment");
    }
    wire = p;
    sock = fd;
    return 0;
}

int remote_begin(struct rcall *c, unsigned fn)
{
    pthread_mutex_lock(&call_lock);
    if (wire == NULL && !dead)
        connect_proxy();
    if (dead) {
        pthread_mutex_unlock(&call_lock);
        return -1;
    }
    memset(c, 0, sizeof *c);
    c->w = wire;
    c->arena = (unsigned char *)wire + wire->arena_offset;
    wire->fn = fn;
    return 0;
}

int32_t remote_call(struct rcall *c)
{
    if (c->overflow) {
        rlog("a call's arguments exceed the shared segment (request %u bytes, arena %llu bytes): not sent",
             JITCKPT_WIRE_REQ_MAX, (unsigned long long)c->w->arena_size);
        return c->ret = cudaErrorNotSupported;
    }
    c->w->req_len = (uint32_t)c->req;
    char b = 'c';
    if (write(sock, &b, 1) != 1 || read(sock, &b, 1) != 1) {
        dead = 1;
        if (!said_dead) {
            said_dead = 1;
            rlog("the device proxy is gone; every CUDA call will fail with cudaErrorDevicesUnavailable");
        }
        return c->ret = cudaErrorDevicesUnavailable;
    }
    c->rep = 0;
    return c->ret = c->w->ret;
}

void remote_end(struct rcall *c)
{
    (void)c;
    pthread_mutex_unlock(&call_lock);
}

cudaError_t remote_unavailable(void)
{
    return cudaErrorDevicesUnavailable;
}
