/* restart.c -- device pointers and handles survive a restart of the device
 * proxy (transparent mode, milestone 2b; proxy_server/README.md, "Device
 * pointers" and "The call log, replay and recovery").
 *
 * The worker keeps what a new proxy needs to stand in for the old one:
 *   - the live allocations (address, size, device): the proxy places every
 *     allocation in a reserved range (proxy_server/src/devmem.c), so a new
 *     proxy re-creates each one at the same address;
 *   - the registrations, in order (fatbinaries, functions, variables, kernel
 *     handles), re-made through the ordinary calls with each created handle
 *     bound to its old virtual id;
 *   - streams (flags, priority), events (flags), communicators (one rank),
 *     each with its device, re-created behind the same virtual ids;
 *   - the current device;
 *   - pinned host memory (pinned.c): its pages are the worker's own memfds,
 *     shared again with the new proxy as soon as it is connected.
 *
 * Two ways in:
 *   jitckpt_remote_restart_proxy()  the "suspected driver corruption" case of
 *       the paper's section 4.2: synchronise, copy every live allocation and
 *       device variable out to host memory, SIGKILL the proxy, start a new one,
 *       re-create everything, copy the bytes back, return 0.  Also reached by
 *       JITCKPT_REMOTE_RESTART_AT=N (before the program's Nth CUDA call; fault
 *       injection for tests).
 *   a proxy found dead at a call (remote_restart_proxy_lost): the same restart
 *       and re-creation, but the bytes could not be copied out of a dead
 *       process: the device memory is lost.  The process stops, with a message
 *       naming what was lost, and exit status JITCKPT_REMOTE_EXIT_MEMORY_LOST
 *       (75), rather than go on with wrong data.  (The call log and the
 *       replica copy that would refill it are later milestones.)
 *
 * The new proxy is the old one's executable with the old one's options and
 * environment (read from /proc at connection), serving this process
 * (--worker-pid) on the same socket path; it is started detached (double
 * fork), so it is never this program's child.  In spawn mode the proxy killed
 * is the supervisor's serving child, never the process the launcher waits on
 * (proxy_server/src/main.c). */

#include "track.h"          /* first: remote.h defines _GNU_SOURCE */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jitckpt_remote_restart.h"

#define JITCKPT_REMOTE_EXIT_MEMORY_LOST 75
#define CHUNK (8u << 20)

/* ---- the tables (under the call lock) ------------------------------------------- */

struct alloc { uint64_t addr, size; int device; void *saved; uint64_t minibatch; };
struct object { uint64_t vid; unsigned flags; int priority, device, nranks, rank; };
enum reg_kind { REG_FATBIN, REG_FUNCTION, REG_VAR, REG_END, REG_INIT, REG_KERNEL, REG_FUNC };
struct reg {
    enum reg_kind kind;
    uint64_t module;             /* virtual id; the kernel's for REG_KERNEL, the function's for REG_FUNC */
    const void *image;           /* REG_FATBIN: the program's own image (kept by nvcc's code) */
    size_t n;                    /* REG_FATBIN: bytes; REG_VAR: size */
    const void *key;             /* host stub / host shadow */
    char *device_fun, *device_name;
    int thread_limit, ext, constant, global, dead;
    void *saved;                 /* REG_VAR: its bytes during a restart */
};

#define TABLE(type, name) static struct type *name; static size_t n_##name, cap_##name
TABLE(alloc, allocs);
TABLE(object, streams);
TABLE(object, events);
TABLE(object, comms);
TABLE(reg, regs);
#define PUSH(name, value) do { \
        if (n_##name == cap_##name) { \
            size_t nc_ = cap_##name ? cap_##name * 2 : 64; \
            void *p_ = realloc(name, nc_ * sizeof *name); \
            if (!p_) { rlog("out of memory keeping the state a proxy restart needs"); abort(); } \
            name = p_; cap_##name = nc_; \
        } \
        name[n_##name++] = (value); \
    } while (0)

static int current_device;

static void drop(struct object *t, size_t *n, uint64_t vid)
{
    for (size_t i = 0; i < *n; i++)
        if (t[i].vid == vid) {
            t[i] = t[--*n];
            return;
        }
}

void remote_track_cudaSetDevice(int device) { current_device = device; }
int remote_current_device(void) { return current_device; }

void remote_track_cudaMalloc(void **devPtr, size_t size)
{
    if (devPtr && *devPtr)
        PUSH(allocs, ((struct alloc){(uintptr_t)*devPtr, size, current_device, NULL, calllog_minibatch()}));
}

void remote_track_cudaFree(void *devPtr)
{
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].addr == (uintptr_t)devPtr) {
            if (allocs[i].minibatch < calllog_minibatch())  /* a replay could not bring its bytes back */
                calllog_set_noreplay("it frees device memory allocated before it");
            remote_rewind_freed(allocs[i].addr, allocs[i].size);
            /* Keep the order of allocation (recover.c frees and a replay re-makes them in order). */
            memmove(&allocs[i], &allocs[i + 1], (n_allocs - i - 1) * sizeof *allocs);
            n_allocs--;
            return;
        }
}

/* ---- for recovery (recover.c) ------------------------------------------------------- */

size_t restart_n_allocs(void) { return n_allocs; }

void restart_alloc(size_t i, uint64_t *addr, uint64_t *size, uint64_t *minibatch)
{
    *addr = allocs[i].addr;
    *size = allocs[i].size;
    *minibatch = allocs[i].minibatch;
}

size_t restart_n_comms(void) { return n_comms; }

void restart_comm(size_t i, uint64_t *vid, int *nranks, int *rank, int *device)
{
    *vid = comms[i].vid;
    *nranks = comms[i].nranks;
    *rank = comms[i].rank;
    *device = comms[i].device;
}

void remote_track_cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority)
{
    if (pStream)
        PUSH(streams, ((struct object){(uintptr_t)*pStream, flags, priority, current_device, 0, 0}));
}
void remote_track_cudaStreamCreate(cudaStream_t *p) { remote_track_cudaStreamCreateWithPriority(p, 0, 0); }
void remote_track_cudaStreamCreateWithFlags(cudaStream_t *p, unsigned int flags)
{
    remote_track_cudaStreamCreateWithPriority(p, flags, 0);
}
void remote_track_cudaStreamDestroy(cudaStream_t s) { drop(streams, &n_streams, (uintptr_t)s); }

void remote_track_cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (event)
        PUSH(events, ((struct object){(uintptr_t)*event, flags, 0, current_device, 0, 0}));
}
void remote_track_cudaEventCreate(cudaEvent_t *e) { remote_track_cudaEventCreateWithFlags(e, 0); }
void remote_track_cudaEventDestroy(cudaEvent_t e) { drop(events, &n_events, (uintptr_t)e); }

void remote_track_ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    (void)commId;
    if (comm)
        PUSH(comms, ((struct object){(uintptr_t)*comm, 0, 0, current_device, nranks, rank}));
}
/* A configured communicator comes back as a plain (blocking) one after a restart. */
void remote_track_ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                         ncclConfig_t *config)
{
    (void)config;
    remote_track_ncclCommInitRank(comm, nranks, commId, rank);
}
void remote_track_ncclCommDestroy(ncclComm_t c) { drop(comms, &n_comms, (uintptr_t)c); }
void remote_track_ncclCommAbort(ncclComm_t c) { drop(comms, &n_comms, (uintptr_t)c); }

/* Other allocators: the proxy places them in its reserved range as it does cudaMalloc
 * (proxy_server/src/alloc.c); a pitched allocation is pitch * height bytes. */
void remote_track_cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    (void)width;
    if (pitch)
        remote_track_cudaMalloc(devPtr, *pitch * height);
}
void remote_track_cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s) { (void)s; remote_track_cudaMalloc(devPtr, size); }
void remote_track_cudaFreeAsync(void *devPtr, cudaStream_t s) { (void)s; remote_track_cudaFree(devPtr); }
void remote_track_ncclMemAlloc(void **ptr, size_t size) { remote_track_cudaMalloc(ptr, size); }
void remote_track_ncclMemFree(void *ptr) { remote_track_cudaFree(ptr); }

/* 1 if p lies in a live device allocation (cudaMemcpyDefault, copykind.c). */
int remote_is_device_ptr(const void *p)
{
    uint64_t a = (uintptr_t)p;
    for (size_t i = 0; i < n_allocs; i++)
        if (a >= allocs[i].addr && a - allocs[i].addr < allocs[i].size)
            return 1;
    return 0;
}

/* Settings that outlive their call (gen_remote.py's SETTINGS: device flags and limits,
 * a kernel's attributes): the request as it was sent, given again to a new proxy on the
 * device that was current then. */
struct setting { unsigned fn; int device; uint32_t len; unsigned char *req; };
TABLE(setting, settings);

void remote_track_setting(struct rcall *c)
{
    unsigned char *copy = malloc(c->req ? c->req : 1);
    if (!copy) {
        rlog("out of memory keeping the state a proxy restart needs");
        abort();
    }
    memcpy(copy, c->w->req, c->req);
    PUSH(settings, ((struct setting){c->w->fn, current_device, (uint32_t)c->req, copy}));
}

/* cudaDeviceReset: the current device's memory, streams, events and settings are gone. */
void remote_track_cudaDeviceReset(void)
{
    for (size_t i = n_allocs; i-- > 0;)
        if (allocs[i].device == current_device) {
            memmove(&allocs[i], &allocs[i + 1], (n_allocs - i - 1) * sizeof *allocs);
            n_allocs--;
        }
    for (size_t i = n_streams; i-- > 0;)
        if (streams[i].device == current_device)
            streams[i] = streams[--n_streams];
    for (size_t i = n_events; i-- > 0;)
        if (events[i].device == current_device)
            events[i] = events[--n_events];
    for (size_t i = n_settings; i-- > 0;)
        if (settings[i].device == current_device) {
            free(settings[i].req);
            memmove(&settings[i], &settings[i + 1], (n_settings - i - 1) * sizeof *settings);
            n_settings--;
        }
    calllog_set_noreplay("cudaDeviceReset destroyed the device's memory and handles");
    remote_ptds_reset();
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

void remote_track_reg_fatbin(void **module, const void *image, size_t n)
{
    PUSH(regs, ((struct reg){.kind = REG_FATBIN, .module = (uintptr_t)module, .image = image, .n = n}));
}
void remote_track_reg_function(void **module, const char *hostFun, const char *deviceFun, const char *deviceName,
                               int thread_limit)
{
    PUSH(regs, ((struct reg){.kind = REG_FUNCTION, .module = (uintptr_t)module, .key = hostFun,
                             .device_fun = dup_or_null(deviceFun), .device_name = dup_or_null(deviceName),
                             .thread_limit = thread_limit}));
}
void remote_track_reg_var(void **module, const char *hostVar, const char *deviceAddress, const char *deviceName,
                          int ext, size_t size, int constant, int global)
{
    PUSH(regs, ((struct reg){.kind = REG_VAR, .module = (uintptr_t)module, .key = hostVar, .n = size,
                             .device_fun = dup_or_null(deviceAddress), .device_name = dup_or_null(deviceName),
                             .ext = ext, .constant = constant, .global = global}));
}
void remote_track_reg_end(void **module)
{
    PUSH(regs, ((struct reg){.kind = REG_END, .module = (uintptr_t)module}));
}
void remote_track_reg_init(void **module)
{
    PUSH(regs, ((struct reg){.kind = REG_INIT, .module = (uintptr_t)module}));
}
void remote_track_reg_kernel(cudaKernel_t kernel, const void *hostFun)
{
    for (size_t i = 0; i < n_regs; i++)        /* the proxy hands out one id per kernel */
        if (regs[i].kind == REG_KERNEL && regs[i].module == (uintptr_t)kernel)
            return;
    PUSH(regs, ((struct reg){.kind = REG_KERNEL, .module = (uintptr_t)kernel, .key = hostFun}));
}
/* cudaGetFuncBySymbol's function handle, made again under the same id by a new proxy. */
void remote_track_cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr)
{
    if (!functionPtr)
        return;
    for (size_t i = 0; i < n_regs; i++)
        if (regs[i].kind == REG_FUNC && regs[i].module == (uintptr_t)*functionPtr)
            return;
    PUSH(regs, ((struct reg){.kind = REG_FUNC, .module = (uintptr_t)*functionPtr, .key = symbolPtr}));
}
/* A library unloaded: its image is gone; nothing of it is re-registered. */
void remote_track_reg_unregister(void **module)
{
    for (size_t i = 0; i < n_regs; i++)
        if (regs[i].module == (uintptr_t)module && regs[i].kind != REG_KERNEL && regs[i].kind != REG_FUNC)
            regs[i].dead = 1;
}

/* ---- the proxy's command line and environment ------------------------------------- */

static pid_t proxy_pid;
static char proxy_exe[PATH_MAX];
static char **proxy_argv, **proxy_envp;
static int restarts;

/* NUL-separated strings of a /proc file as a NULL-terminated vector. */
static char **read_vector(pid_t pid, const char *what)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, what);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t r;
    while (buf && (r = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)r;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    close(fd);
    if (!buf)
        return NULL;
    buf[len] = '\0';
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += buf[i] == '\0';
    char **v = calloc(n + 2, sizeof *v);
    if (!v)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1)
        v[k++] = buf + i;
    v[k] = NULL;
    return v;
}

void remote_restart_connected(pid_t pid)
{
    if (pid == proxy_pid)
        return;
    proxy_pid = pid;
    if (restarts)
        return;                  /* a proxy this library started: the first one's command line stays */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(path, proxy_exe, sizeof proxy_exe - 1);
    proxy_exe[n > 0 ? n : 0] = '\0';
    proxy_argv = read_vector(pid, "cmdline");
    proxy_envp = read_vector(pid, "environ");
}

/* The new proxy's argv: the old options without --socket, --worker-pid and the spawned program. */
static char **new_argv(const char *socket_path, const char *pid_text)
{
    size_t n = 0;
    while (proxy_argv && proxy_argv[n])
        n++;
    char **v = calloc(n + 6, sizeof *v);
    if (!v)
        return NULL;
    size_t k = 0;
    v[k++] = proxy_exe;
    for (size_t i = 1; i < n; i++) {
        if (strcmp(proxy_argv[i], "--") == 0)
            break;
        if (strcmp(proxy_argv[i], "--socket") == 0 || strcmp(proxy_argv[i], "--worker-pid") == 0) {
            i++;
            continue;
        }
        v[k++] = proxy_argv[i];
    }
    v[k++] = "--socket";
    v[k++] = (char *)socket_path;
    v[k++] = "--worker-pid";
    v[k++] = (char *)pid_text;
    v[k] = NULL;
    return v;
}

static char **new_envp(void)
{
    size_t n = 0;
    while (proxy_envp && proxy_envp[n])
        n++;
    char **v = calloc(n + 1, sizeof *v);
    size_t k = 0;
    for (size_t i = 0; v && i < n; i++)
        if (!(strncmp(proxy_envp[i], "LD_PRELOAD=", 11) == 0 && strstr(proxy_envp[i], "libjitckpt_remote")) &&
            strncmp(proxy_envp[i], "JITCKPT_SIMDEV_FAULT=", 21) != 0)     /* an injected fault is one event */
            v[k++] = proxy_envp[i];
    return v;
}

/* Whether a Unix socket at path is listening (/proc/net/unix: flags __SO_ACCEPTCON). */
static int listening(const char *path)
{
    FILE *f = fopen("/proc/net/unix", "re");
    if (!f)
        return 0;
    char line[PATH_MAX + 128];
    int found = 0;
    size_t pl = strlen(path);
    while (!found && fgets(line, sizeof line, f)) {
        size_t l = strlen(line);
        while (l && (line[l - 1] == '\n' || line[l - 1] == ' '))
            line[--l] = '\0';
        unsigned long flags;
        if (l > pl && strcmp(line + l - pl, path) == 0 && line[l - pl - 1] == ' ' &&
            sscanf(line, "%*s %*s %*s %lx", &flags) == 1 && (flags & 0x10000))
            found = 1;
    }
    fclose(f);
    return found;
}

/* Starts the new proxy, detached; returns its pid, or -1. */
static pid_t start_proxy(const char *socket_path)
{
    char pid_text[32];
    snprintf(pid_text, sizeof pid_text, "%d", (int)getpid());
    char **argv = new_argv(socket_path, pid_text), **envp = new_envp();
    int pfd[2];
    if (!proxy_exe[0] || !argv || !envp || pipe2(pfd, O_CLOEXEC) != 0)
        return -1;
    unlink(socket_path);
    pid_t mid = fork();
    if (mid == 0) {
        setsid();
        pid_t p = fork();
        if (p == 0) {
            /* Only stderr (its log) is shared: the program's stdin, stdout and
             * other descriptors (sockets, pipes) stay the program's. */
            int null = open("/dev/null", O_RDWR);
            if (null >= 0) {
                dup2(null, 0);
                dup2(null, 1);
            }
            for (int fd = 3; fd < 4096; fd++)
                if (fd != pfd[1])
                    close(fd);
            execve(proxy_exe, argv, envp);
            _exit(127);
        }
        (void)!write(pfd[1], &p, sizeof p);
        _exit(0);
    }
    close(pfd[1]);
    pid_t p = -1;
    if (mid > 0) {
        if (read(pfd[0], &p, sizeof p) != (ssize_t)sizeof p)
            p = -1;
        while (waitpid(mid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    close(pfd[0]);
    free(argv);
    free(envp);
    if (p <= 0)
        return -1;
    for (int i = 0; i < 6000; i++) {              /* 60 s */
        if (listening(socket_path))
            return p;
        if (kill(p, 0) != 0)
            return -1;
        struct timespec t = {0, 10 * 1000000L};
        nanosleep(&t, NULL);
    }
    kill(p, SIGKILL);
    return -1;
}

/* ---- calls of the restart protocol (under the call lock) ---------------------------- */

static int32_t call(struct rcall *c)
{
    return remote_call(c);
}

static int32_t rst_copy(struct rcall *c, unsigned fn, uint64_t where, void *host, uint64_t n)
{
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < CHUNK ? n - done : CHUNK, at = where + ((fn == JITCKPT_RFN_RST_SYM_READ ||
                                                                        fn == JITCKPT_RFN_RST_SYM_WRITE) ? 0 : done);
        if ((fn == JITCKPT_RFN_RST_SYM_READ || fn == JITCKPT_RFN_RST_SYM_WRITE) && k != n)
            return cudaErrorNotSupported;         /* a device variable larger than a chunk */
        remote_begin_locked(c, fn);
        rc_put(c, &at, sizeof at);
        rc_put(c, &k, sizeof k);
        void *out = NULL;
        if (fn == JITCKPT_RFN_RST_READ || fn == JITCKPT_RFN_RST_SYM_READ)
            out = rc_put_out(c, k);
        else
            rc_put_in(c, (char *)host + done, k);
        int32_t err = call(c);
        if (err)
            return err;
        if (out)
            rc_get_out(c, (char *)host + done, out, k);
        done += k;
    }
    return 0;
}

static int32_t rst_simple(struct rcall *c, unsigned fn, const void *a, size_t na, const void *b, size_t nb,
                          const void *e, size_t ne, const void *f, size_t nf)
{
    remote_begin_locked(c, fn);
    if (na) rc_put(c, a, na);
    if (nb) rc_put(c, b, nb);
    if (ne) rc_put(c, e, ne);
    if (nf) rc_put(c, f, nf);
    return call(c);
}

static int32_t rst_device(struct rcall *c, int want, int *cur)
{
    int32_t w = want;
    int32_t err = rst_simple(c, JITCKPT_RFN_RST_DEVICE, &w, sizeof w, NULL, 0, NULL, 0, NULL, 0);
    int32_t got = -1;
    if (err == 0 && cur && rc_get(c, &got, sizeof got) == 0)
        *cur = got;
    return err;
}

/* The same marshalling as special.c's entry points. */
static int32_t replay_reg(struct rcall *c, const struct reg *r)
{
    int32_t kind = r->kind == REG_KERNEL ? VH_KERNEL : r->kind == REG_FUNC ? VH_FUNC : VH_MODULE;
    uint64_t id = r->module;
    int32_t err = 0;
    switch (r->kind) {
    case REG_FATBIN:
    case REG_KERNEL:
    case REG_FUNC:
        if ((err = rst_simple(c, JITCKPT_RFN_RST_EXPECT, &kind, sizeof kind, &id, sizeof id, NULL, 0, NULL, 0)))
            return err;
        if (r->kind == REG_FATBIN) {
            remote_begin_locked(c, RFN___cudaRegisterFatBinary);
            rc_put_in(c, r->image, r->n);
        } else if (r->kind == REG_FUNC) {            /* the generated wire: the output's flag, the symbol */
            remote_begin_locked(c, RFN_cudaGetFuncBySymbol);
            rc_put_flag(c, 1);
            rc_put(c, &r->key, sizeof r->key);
        } else {
            remote_begin_locked(c, RFN___cudaGetKernel);
            rc_put(c, &r->key, sizeof r->key);
        }
        if ((err = call(c)))
            return err;
        uint64_t got = 0;
        rc_get(c, &got, sizeof got);
        return got == id ? 0 : cudaErrorInvalidResourceHandle;
    case REG_FUNCTION:
        remote_begin_locked(c, RFN___cudaRegisterFunction);
        rc_put_handle(c, (void *)(uintptr_t)r->module);
        rc_put(c, &r->key, sizeof r->key);
        rc_put_string(c, r->device_fun);
        rc_put_string(c, r->device_name);
        rc_put(c, &r->thread_limit, sizeof r->thread_limit);
        return call(c);
    case REG_VAR:
        remote_begin_locked(c, RFN___cudaRegisterVar);
        rc_put_handle(c, (void *)(uintptr_t)r->module);
        rc_put(c, &r->key, sizeof r->key);
        rc_put_string(c, r->device_fun);
        rc_put_string(c, r->device_name);
        rc_put(c, &r->ext, sizeof r->ext);
        rc_put(c, &r->n, sizeof r->n);
        rc_put(c, &r->constant, sizeof r->constant);
        rc_put(c, &r->global, sizeof r->global);
        return call(c);
    case REG_END:
    case REG_INIT:
        remote_begin_locked(c, r->kind == REG_END ? RFN___cudaRegisterFatBinaryEnd : RFN___cudaInitModule);
        rc_put_handle(c, (void *)(uintptr_t)r->module);
        err = call(c);
        return r->kind == REG_INIT ? 0 : err;      /* __cudaInitModule answers 1 for "initialised" */
    }
    return 0;
}

static const char *what_failed;

static int32_t set_device(struct rcall *c, int device)
{
    return rst_device(c, device, NULL);
}

static int skip_comms;          /* recovery rebuilds the communicators itself (recover.c) */

/* Everything but the bytes, in the new proxy. */
static int32_t recreate(struct rcall *c)
{
    int32_t err;
    what_failed = "re-creating an allocation at its address";
    for (size_t i = 0; i < n_allocs; i++)
        if ((err = rst_simple(c, JITCKPT_RFN_RST_ALLOC_AT, &allocs[i].addr, 8, &allocs[i].size, 8,
                              &allocs[i].device, sizeof(int), NULL, 0)))
            return err;
    what_failed = "re-loading libraries (cudaLibraryLoadData): not supported by a restart";
    if (remote_live_libraries() > 0)
        return cudaErrorNotSupported;
    what_failed = "re-making CUDA graphs (captured work): not supported by a restart";
    if (remote_live_graphs() > 0)
        return cudaErrorNotSupported;
    what_failed = "re-registering the fatbinaries, kernels and device variables";
    for (size_t i = 0; i < n_regs; i++)
        if (!regs[i].dead && (err = replay_reg(c, &regs[i])))
            return err;
    what_failed = "re-creating the streams";
    for (size_t i = 0; i < n_streams; i++)
        if ((err = rst_simple(c, JITCKPT_RFN_RST_STREAM, &streams[i].vid, 8, &streams[i].flags, 4,
                              &streams[i].priority, 4, &streams[i].device, 4)))
            return err;
    what_failed = "re-creating the events";
    for (size_t i = 0; i < n_events; i++)
        if ((err = rst_simple(c, JITCKPT_RFN_RST_EVENT, &events[i].vid, 8, &events[i].flags, 4,
                              &events[i].device, 4, NULL, 0)))
            return err;
#ifdef JITCKPT_REMOTE_CUBLAS
    what_failed = "re-creating the cuBLAS handles";
    if ((err = remote_blas_recreate(c, set_device)))
        return err;
#endif
#ifdef JITCKPT_REMOTE_CUDNN
    what_failed = "re-creating the cuDNN handles and backend descriptors";
    if ((err = remote_dnn_recreate(c, set_device)))
        return err;
#endif
    what_failed = "re-applying a device or kernel setting (cudaDeviceSetLimit, cudaFuncSetAttribute, ...)";
    for (size_t i = 0; i < n_settings; i++) {
        if ((err = rst_device(c, settings[i].device, NULL)))
            return err;
        remote_begin_locked(c, settings[i].fn);
        rc_put(c, settings[i].req, settings[i].len);
        if ((err = call(c)))
            return err;
    }
    what_failed = "re-creating the communicators";
    for (size_t i = 0; i < n_comms && !skip_comms; i++)
        if ((err = rst_simple(c, JITCKPT_RFN_RST_COMM, &comms[i].vid, 8, &comms[i].nranks, 4, &comms[i].rank, 4,
                              &comms[i].device, 4)))
            return err;
    what_failed = "restoring the current device";
    return rst_device(c, current_device, NULL);
}

static uint64_t live_bytes(void)
{
    uint64_t b = 0;
    for (size_t i = 0; i < n_allocs; i++)
        b += allocs[i].size;
    return b;
}

/* Waits (at most 10 s) until the killed proxy `pid` has exited: gone, or a zombie, whose device context and
 * memory the driver has released (on a GPU whose memory the old proxy nearly filled, a new proxy started
 * before that could not re-create the allocations).  Not a child of this process: /proc is asked. */
static void wait_gone(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    for (int i = 0; i < 5000; i++) {
        char buf[512];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        const char *state = strrchr(buf, ')');          /* "pid (comm) S ...": the comm may hold ')' */
        if (n <= 0 || !state || state[1] != ' ' || state[2] == 'Z' || state[2] == 'X')
            return;
        struct timespec t = {0, 2 * 1000000L};
        nanosleep(&t, NULL);
    }
    rlog("the old device proxy (pid %d) has not exited 10 s after SIGKILL; starting the new one anyway (its "
         "device memory may not be free yet)", (int)pid);
}

/* Kills the proxy (if alive) and waits for it to exit, starts a new one, connects.  0 or -1 (said). */
static int replace_proxy(void)
{
    const char *socket_path = getenv(JITCKPT_PROXY_SOCKET_ENV);
    if (!socket_path || !*socket_path || !proxy_exe[0]) {
        rlog("cannot restart the device proxy: its socket path or executable is unknown");
        return -1;
    }
    if (proxy_pid > 0 && kill(proxy_pid, SIGKILL) == 0)
        wait_gone(proxy_pid);
    restarts++;
    pid_t p = start_proxy(socket_path);
    if (p < 0) {
        rlog("cannot restart the device proxy (%s on %s)", proxy_exe, socket_path);
        return -1;
    }
    if (remote_reconnect() != 0)
        return -1;
    remote_pinned_reshare();          /* before anything can name pinned memory (pinned.c) */
    return 0;
}

/* Recovery (recover.c): a new proxy in place of the old (alive or not), with
 * the allocations, registrations, streams and events re-created; not the
 * communicators (rebuilt with the recovery's rendezvous) nor the bytes. */
const char *restart_replace_and_recreate(void)
{
    proxy_pid = remote_proxy_alive() ? proxy_pid : 0;
    if (replace_proxy() != 0)
        return "starting a new device proxy";
    struct rcall c;
    remote_begin_locked(&c, 0);
    skip_comms = 1;
    int32_t err = recreate(&c);
    skip_comms = 0;
    return err ? what_failed : NULL;
}

static int restarting;          /* a driver-suspect restart is under way: a dying proxy is its error */

static int32_t restart_locked_inner(struct rcall *c);

/* The driver-suspect restart, under the call lock; c is the caller's record. */
static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static double restart_started;

static int32_t restart_locked(struct rcall *c)
{
    restart_started = now_ms();
    restarting = 1;
    int32_t err = restart_locked_inner(c);
    restarting = 0;
    return err;
}

static int32_t restart_locked_inner(struct rcall *c)
{
    for (size_t i = 0; i < n_comms; i++)
        if (comms[i].nranks != 1 && remote_recovery_enabled()) {
            /* Other ranks share the communicator: the recovery's re-rendezvous (recover.c) rebuilds
             * it, with this rank's memory copied out and back around the new proxy. */
            return remote_recover(c, "the driver is suspect (a proxy restart was asked)", RECOVER_SUSPECT, 0);
        } else if (comms[i].nranks != 1) {
            rlog("proxy restart refused: a communicator of %d ranks needs the re-rendezvous of the recovery "
                 "milestone", comms[i].nranks);
            return cudaErrorNotSupported;
        }
    if (proxy_pid > 0 && getppid() == proxy_pid) {
        rlog("proxy restart refused: the proxy is this program's parent (jitckpt-proxy -- PROGRAM with "
             "JITCKPT_PROXY_NO_SUPERVISOR=1); a restart needs the supervisor (the default) or the proxy beside "
             "the worker (jitckpt-proxy --worker-pid PID)");
        return cudaErrorNotSupported;
    }
    uint32_t fixed = 0;
    int32_t err = rst_simple(c, JITCKPT_RFN_RST_INFO, NULL, 0, NULL, 0, NULL, 0, NULL, 0);
    if (err || rc_get(c, &fixed, sizeof fixed) != 0 || !fixed) {
        rlog("proxy restart refused: the proxy cannot place allocations at fixed addresses");
        return err ? err : cudaErrorNotSupported;
    }
    /* Synchronise, then copy out every live allocation and device variable. */
    if ((err = rst_simple(c, JITCKPT_RFN_RST_SYNC, NULL, 0, NULL, 0, NULL, 0, NULL, 0)) ||
        (err = rst_device(c, -1, &current_device)))
        return err;
    for (size_t i = 0; i < n_allocs && !err; i++) {
        allocs[i].saved = malloc(allocs[i].size ? allocs[i].size : 1);
        err = allocs[i].saved ? rst_copy(c, JITCKPT_RFN_RST_READ, allocs[i].addr, allocs[i].saved, allocs[i].size)
                              : cudaErrorMemoryAllocation;
    }
    for (size_t i = 0; i < n_regs && !err; i++)
        if (regs[i].kind == REG_VAR && !regs[i].dead) {
            regs[i].saved = malloc(regs[i].n ? regs[i].n : 1);
            err = regs[i].saved ? rst_copy(c, JITCKPT_RFN_RST_SYM_READ, (uintptr_t)regs[i].key, regs[i].saved,
                                           regs[i].n)
                                : cudaErrorMemoryAllocation;
        }
    if (err) {
        rlog("proxy restart refused: copying device memory out failed (error %d)", (int)err);
        for (size_t i = 0; i < n_allocs; i++) { free(allocs[i].saved); allocs[i].saved = NULL; }
        for (size_t i = 0; i < n_regs; i++) { free(regs[i].saved); regs[i].saved = NULL; }
        return err;
    }
    pid_t old = proxy_pid;
    if (replace_proxy() != 0) {
        rlog("the device proxy could not be replaced: stopping (device state is lost)");
        _exit(JITCKPT_REMOTE_EXIT_MEMORY_LOST);
    }
    remote_begin_locked(c, 0);
    err = recreate(c);
    what_failed = "copying device memory back";
    for (size_t i = 0; i < n_allocs && !err; i++)
        err = rst_copy(c, JITCKPT_RFN_RST_WRITE, allocs[i].addr, allocs[i].saved, allocs[i].size);
    for (size_t i = 0; i < n_regs && !err; i++)
        if (regs[i].saved)
            err = rst_copy(c, JITCKPT_RFN_RST_SYM_WRITE, (uintptr_t)regs[i].key, regs[i].saved, regs[i].n);
    for (size_t i = 0; i < n_allocs; i++) { free(allocs[i].saved); allocs[i].saved = NULL; }
    for (size_t i = 0; i < n_regs; i++) { free(regs[i].saved); regs[i].saved = NULL; }
    if (err) {
        rlog("the restarted device proxy failed %s (error %d): stopping (device state is lost)", what_failed,
             (int)err);
        _exit(JITCKPT_REMOTE_EXIT_MEMORY_LOST);
    }
    remote_begin_locked(c, 0);
    rlog("device proxy restarted (driver suspect): pid %d replaced by pid %d; %zu allocations (%llu bytes), "
         "%zu streams, %zu events, %zu communicators re-created at the same addresses and ids, contents copied back "
         "(%.0f ms)", (int)old, (int)proxy_pid, n_allocs, (unsigned long long)live_bytes(), n_streams, n_events,
         n_comms, now_ms() - restart_started);
    return 0;
}

EXPORT int jitckpt_remote_restart_proxy(void)
{
    struct rcall c;
    if (remote_begin(&c, 0) != 0)
        return cudaErrorDevicesUnavailable;
    int32_t err = restart_locked(&c);
    remote_end(&c);
    return err;
}

/* The proxy died under the program (SIGKILL, a crash): restart it and re-create
 * everything, then stop: the contents of device memory died with it. */
void remote_restart_proxy_lost(void)
{
    const char *s = getenv("JITCKPT_REMOTE_RESTART");
    if (s && strcmp(s, "0") == 0)
        return;                     /* the old behaviour: every later call fails */
    static int inside;
    if (restarting || inside++)
        return;
    pid_t old = proxy_pid;
    rlog("the device proxy (pid %d) is gone; restarting it", (int)old);
    proxy_pid = 0;
    int ok = replace_proxy() == 0;
    int32_t err = -1;
    if (ok) {
        struct rcall c;
        remote_begin_locked(&c, 0);
        err = recreate(&c);
    }
    if (ok && err == 0)
        rlog("device proxy restarted: pid %d replaced by pid %d; %zu allocations re-created at the same addresses, "
             "%zu streams, %zu events, %zu communicators behind the same ids -- but the contents of device memory "
             "(%llu bytes) were lost with the old proxy (refilling them from the call log or a replica is a later "
             "milestone); stopping rather than continue with wrong data (exit status %d)",
             (int)old, (int)proxy_pid, n_allocs, n_streams, n_events, n_comms, (unsigned long long)live_bytes(),
             JITCKPT_REMOTE_EXIT_MEMORY_LOST);
    else
        rlog("the device proxy (pid %d) is gone and %s failed; the contents of device memory (%llu bytes) are lost; "
             "stopping rather than continue with wrong data (exit status %d)", (int)old,
             ok ? what_failed : "restarting it", (unsigned long long)live_bytes(), JITCKPT_REMOTE_EXIT_MEMORY_LOST);
    fflush(stdout);
    _exit(JITCKPT_REMOTE_EXIT_MEMORY_LOST);
}

/* JITCKPT_REMOTE_RESTART_AT=N: a driver-suspect restart before the program's
 * Nth CUDA call (counted at remote_begin; fault injection for tests). */
static long restart_at = -1, calls_seen;

void remote_restart_count_call(struct rcall *c)
{
    if (restart_at < 0 || ++calls_seen != restart_at)
        return;
    unsigned fn = c->w->fn;
    rlog("JITCKPT_REMOTE_RESTART_AT=%ld: restarting the device proxy before this call", restart_at);
    /* A refusal happens before anything is touched: the program goes on with
     * the same proxy (a failure after the old proxy was killed stops it there). */
    if (restart_locked(c) != 0)
        rlog("JITCKPT_REMOTE_RESTART_AT=%ld: the restart was refused (above); going on with the same proxy",
             restart_at);
    remote_begin_locked(c, fn);
}

__attribute__((constructor)) static void read_restart_at(void)
{
    const char *s = getenv("JITCKPT_REMOTE_RESTART_AT");
    if (s && *s)
        restart_at = atol(s);
}
