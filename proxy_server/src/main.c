/* main.c -- jitckpt-proxy: options, start-up, and the one worker's life.
 *
 *   jitckpt-proxy --socket PATH [options] [-- PROGRAM ARGS...]
 *
 * With a PROGRAM the proxy spawns its worker itself (spawn mode): the child
 * gets LD_PRELOAD=<the remote library> and JITCKPT_PROXY_SOCKET=PATH, only
 * that child may attach, and the proxy exits with the child's status.  In
 * spawn mode this process is only the supervisor: the proxy that loads the
 * runtime and serves the worker is a child of its own (supervise()), so that
 * the worker can restart it (milestone 2b, README.md) while the launcher
 * keeps waiting on the same process.
 * Without one it waits for the worker given by --worker-pid (or, without
 * that, the first process of its own uid that connects) and exits 0 when the
 * worker disconnects.
 *
 * Options (each also an environment variable where named):
 *   --socket PATH        the Unix socket to listen on (required).  In spawn
 *                        mode, %r in PATH is replaced by the RANK environment
 *                        variable and %l by LOCAL_RANK (each 0 when unset), %%
 *                        by a literal %: torchrun gives every local worker the
 *                        same argv, so `--socket DIR/rank-%r.sock` names one
 *                        socket per rank.  Without a PROGRAM (--worker-pid, and
 *                        a proxy the worker restarted, which is given the
 *                        expanded path) PATH is taken as it is.
 *   --cudart PATH        the CUDA runtime to load    (JITCKPT_PROXY_CUDART)
 *   --nccl PATH          NCCL                         (JITCKPT_PROXY_NCCL)
 *   --preload PATH       spawn mode: the worker's interposer, default
 *                        libjitckpt_remote.so next to this build (JITCKPT_PROXY_PRELOAD)
 *   --worker-pid PID     only this process may attach
 *   --arena-mib N        the bulk-data arena, default 64
 *   --verbose            log every call on stderr */

#include "dispatch.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>


int proxy_verbose;

void plog(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(buf, sizeof buf, "jitckpt-proxy[%d]: ", (int)getpid());
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", buf);
}

void pdebug(const char *fmt, ...)
{
    if (!proxy_verbose)
        return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    plog("%s", buf);
}

static void usage(void)
{
    fprintf(stderr, "usage: jitckpt-proxy --socket PATH [--cudart PATH] [--nccl PATH] [--cublas PATH] [--cublaslt PATH] [--cudnn PATH] [--preload PATH]\n"
                    "                     [--worker-pid PID] [--arena-mib N] [--verbose] [-- PROGRAM ARGS...]\n"
                    "  in --socket PATH: %%r = $RANK, %%l = $LOCAL_RANK (0 when unset), %%%% = %%\n");
    exit(2);
}

/* The value of a rank variable for --socket: its digits, "0" when unset or
 * empty; NULL (after saying why) when it is not a non-negative integer. */
static const char *rank_variable(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return "0";
    if (strlen(v) > 10 || strspn(v, "0123456789") != strlen(v)) {
        fprintf(stderr, "jitckpt-proxy: --socket: %s=%s is not a rank (a non-negative integer)\n", name, v);
        return NULL;
    }
    return v;
}

/* Spawn mode's --socket PATH with %r, %l and %% expanded (see the options above); exits 2
 * with a message for another %-sequence, a bad RANK/LOCAL_RANK, or a result
 * that does not fit a Unix socket address (sun_path: 108 bytes with the NUL). */
static const char *expand_socket_path(const char *path)
{
    static char out[sizeof ((struct sockaddr_un *)0)->sun_path];
    size_t n = 0;
    for (const char *p = path; *p; p++) {
        const char *piece;
        char one[2] = {*p, '\0'};
        if (*p != '%') {
            piece = one;
        } else if (p[1] == '%') {
            piece = "%";
            p++;
        } else if (p[1] == 'r' || p[1] == 'l') {
            piece = rank_variable(p[1] == 'r' ? "RANK" : "LOCAL_RANK");
            if (!piece)
                exit(2);
            p++;
        } else {
            fprintf(stderr, "jitckpt-proxy: --socket %s: %s%.1s%s (%%r: RANK, %%l: LOCAL_RANK, "
                            "%%%%: a literal %%)\n", path, p[1] ? "unknown %-sequence '%" : "a lone % at the end",
                    p + 1, p[1] ? "'" : "");
            exit(2);
        }
        size_t len = strlen(piece);
        if (n + len >= sizeof out) {
            fprintf(stderr, "jitckpt-proxy: --socket %s: the socket path is longer than a Unix socket "
                            "address allows (%zu bytes at most); use a shorter directory\n",
                    path, sizeof out - 1);
            exit(2);
        }
        memcpy(out + n, piece, len);
        n += len;
    }
    out[n] = '\0';
    return out;
}

static void parse(int argc, char **argv, struct proxy_options *o)
{
    memset(o, 0, sizeof *o);
    o->arena_bytes = JITCKPT_WIRE_DEFAULT_ARENA;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--") == 0) {
            o->program = i + 1 < argc ? argv + i + 1 : NULL;
            break;
        }
        if (strcmp(a, "--verbose") == 0) {
            o->verbose = 1;
            continue;
        }
        if (!v)
            usage();
        if (strcmp(a, "--socket") == 0)
            o->socket_path = v;
        else if (strcmp(a, "--cudart") == 0)
            o->cudart_path = v;
        else if (strcmp(a, "--nccl") == 0)
            o->nccl_path = v;
        else if (strcmp(a, "--cublas") == 0)
            o->cublas_path = v;
        else if (strcmp(a, "--cublaslt") == 0)
            o->cublaslt_path = v;
        else if (strcmp(a, "--cudnn") == 0)
            o->cudnn_path = v;
        else if (strcmp(a, "--preload") == 0)
            o->preload_path = v;
        else if (strcmp(a, "--worker-pid") == 0)
            o->worker_pid = (pid_t)atoi(v);
        else if (strcmp(a, "--arena-mib") == 0)
            o->arena_bytes = (uint64_t)strtoull(v, NULL, 10) << 20;
        else
            usage();
        i++;
    }
    if (!o->socket_path || o->arena_bytes == 0)
        usage();
    if (o->program)
        o->socket_path = expand_socket_path(o->socket_path);
}

static pid_t spawn(const struct proxy_options *o)
{
    const char *preload = o->preload_path ? o->preload_path : getenv(PROXY_ENV_PRELOAD);
    if (!preload || !*preload)
        preload = default_sibling("../../interpose/build/libjitckpt_remote.so", "../interpose/libjitckpt_remote.so");
    if (!preload) {
        plog("no remote interposer found: pass --preload PATH to libjitckpt_remote.so");
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        setenv("LD_PRELOAD", preload, 1);
        setenv(JITCKPT_PROXY_SOCKET_ENV, o->socket_path, 1);
        execvp(o->program[0], o->program);
        fprintf(stderr, "jitckpt-proxy: cannot run %s: %s\n", o->program[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Spawn mode, the serving child: says when it listens, learns the worker's
 * pid, says when the worker connected (supervise()). */
static int supervisor_fd = -1;

static void to_supervisor(char what)
{
    if (supervisor_fd >= 0 && write(supervisor_fd, &what, 1) != 1)
        pdebug("the supervisor is gone");
}

/* Spawn mode: the serving proxy is a child; spawn the worker once it listens,
 * exit with the worker's status.  A proxy the worker restarted is the
 * worker's business (detached); the original one is reaped here. */
static int supervise(struct proxy_options *o)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 1;
    pid_t server = fork();
    if (server < 0)
        return 1;
    if (server == 0) {
        close(sv[0]);
        supervisor_fd = sv[1];
        return -1;                                  /* main() goes on as the serving proxy */
    }
    close(sv[1]);
    char c = 0;
    int status = 0;
    if (read(sv[0], &c, 1) != 1 || c != 'R') {      /* it failed to start (it said why) */
        waitpid(server, &status, 0);
        return 1;
    }
    pid_t child = spawn(o);
    if (child < 0 || write(sv[0], &child, sizeof child) != (ssize_t)sizeof child) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
        return 1;
    }
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    /* A server that accepted the worker exits on its own at end-of-file; one
     * still waiting for it (the program made no CUDA call) is stopped. */
    int connected = recv(sv[0], &c, 1, MSG_DONTWAIT) == 1 && c == 'C';
    for (int i = 0; connected && i < 1000 && waitpid(server, NULL, WNOHANG) == 0; i++)
        usleep(10000);
    if (waitpid(server, NULL, WNOHANG) == 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
    unlink(o->socket_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
    struct proxy_options o;
    parse(argc, argv, &o);
    proxy_verbose = o.verbose;
    signal(SIGPIPE, SIG_IGN);
    if (o.program && getenv("JITCKPT_PROXY_NO_SUPERVISOR") == NULL) {
        int rc = supervise(&o);
        if (rc >= 0)
            return rc;
        o.program = NULL;                           /* the serving child */
    }
    if (libs_load(&o) != 0)
        return 1;
    /* What the loaded NCCL (or runtime) lacks fails when the program calls it (missing.c);
     * nvcc's hidden entry points every CUDA runtime has. */
    dispatch_resolve(cudart, nccl, cublas, cudnn);
    const char *missing = special_resolve(cudart);
    if (missing) {
        plog("the CUDA runtime lacks %s", missing);
        return 1;
    }
    int segfd;
    struct jitckpt_wire *w = segment_create(o.arena_bytes, &segfd);
    if (!w)
        return 1;
    int listener = listen_socket(o.socket_path);
    if (listener < 0)
        return 1;
    pid_t child = 0, expected = o.worker_pid;
    if (supervisor_fd >= 0) {
        to_supervisor('R');
        if (read(supervisor_fd, &expected, sizeof expected) != (ssize_t)sizeof expected)
            return 1;
    }
    if (o.program) {
        child = spawn(&o);
        if (child < 0)
            return 1;
        expected = child;
    }
    int status = 0;
    int sock = accept_worker(listener, o.socket_path, &expected, segfd, w->segment_size, child, &status);
    close(segfd);
    if (sock == -2)                     /* the program ran no CUDA call, or failed to start */
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (sock < 0)
        return 1;
    to_supervisor('C');
    int rc = serve(sock, w);
    close(sock);
    pdebug("worker pid %d disconnected", (int)expected);
    if (child > 0) {
        while (waitpid(child, &status, 0) < 0 && errno == EINTR)
            ;
        if (WIFEXITED(status))
            return WEXITSTATUS(status);
        return 128 + WTERMSIG(status);
    }
    return rc == 0 ? 0 : 1;
}
