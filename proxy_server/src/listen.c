/* listen.c -- the proxy's socket: accepting its one worker.
 *
 * The socket is created owner-only (umask 077 around bind, then chmod 0600).
 * Every connection's peer credentials are read with SO_PEERCRED: the uid
 * must be the proxy's own, and the pid the expected worker's when one is
 * known (--worker-pid, or the child the proxy spawned).  A peer that fails
 * the check gets a hello with status -1 and no descriptor, and the proxy
 * goes on waiting.  The accepted worker gets the hello and the segment's
 * descriptor (SCM_RIGHTS); then the socket file is removed and the listener
 * closed, so no other process can attach. */

#include "proxy.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

pid_t proxy_worker_pid;


int listen_socket(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        plog("socket path too long: %s", path);
        return -1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    unlink(path);
    mode_t old = umask(077);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
    umask(old);
    if (rc != 0 || chmod(path, 0600) != 0 || listen(fd, 4) != 0) {
        plog("cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static void send_hello(int fd, int status, int segfd, uint64_t segsize)
{
    struct jitckpt_wire_hello hello = {JITCKPT_WIRE_MAGIC, JITCKPT_WIRE_VERSION, segsize, (int32_t)getpid(),
                                       status};
    struct iovec iov = {&hello, sizeof hello};
    char control[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (status == 0) {
        memset(control, 0, sizeof control);
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &segfd, sizeof segfd);
    }
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) < 0)
        pdebug("sendmsg: %s", strerror(errno));
}

/* Returns the worker's connection (*expected is set to the accepted pid), or
 * -1 on error, or -2 if the spawned child exited first (*child_status). */
int accept_worker(int listener, const char *path, pid_t *expected, int segfd, uint64_t segsize, pid_t child,
                  int *child_status)
{
    for (;;) {
        struct pollfd pfd = {listener, POLLIN, 0};
        if (poll(&pfd, 1, 100) == 0) {
            if (child > 0 && waitpid(child, child_status, WNOHANG) == child) {
                unlink(path);
                close(listener);
                return -2;
            }
            /* --worker-pid: a worker that is gone will never connect (a proxy started for a
             * restart whose program ended meanwhile): do not wait for ever. */
            if (child <= 0 && *expected > 0 && kill(*expected, 0) != 0 && errno == ESRCH) {
                plog("worker pid %d is gone before it connected; exiting", (int)*expected);
                unlink(path);
                close(listener);
                return -1;
            }
            continue;
        }
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            plog("accept: %s", strerror(errno));
            return -1;
        }
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            close(fd);
            continue;
        }
        if (cred.uid != geteuid() || (*expected != 0 && cred.pid != *expected)) {
            plog("refused a connection from pid %d uid %d: this proxy serves only pid %d of uid %d",
                 (int)cred.pid, (int)cred.uid, (int)*expected, (int)geteuid());
            send_hello(fd, -1, -1, 0);
            close(fd);
            continue;
        }
        send_hello(fd, 0, segfd, segsize);
        *expected = cred.pid;
        proxy_worker_pid = cred.pid;
        unlink(path);
        close(listener);
        pdebug("serving worker pid %d", (int)cred.pid);
        return fd;
    }
}
