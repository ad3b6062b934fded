/* gil_release.c -- let the save run while another thread holds the GIL, hung.
 *
 * Paper §3.2: the watchdog must call the user's Python save, which needs the
 * GIL, but "the GIL may have been acquired by some other Python or C/C++
 * thread which is hung in a synchronization API, e.g. cudaStreamSynchronize
 * ... we register a signal handler, which our watchdog thread triggers by
 * raising SIGUSR1 for each thread via pthread_sigqueue.  The signal handler
 * releases the GIL."  (DESIGN.md decision 4.)
 *
 * Before a JIT event.  Every intercepted call that can block the host
 * (stream/event/device synchronisation, synchronous and pageable copies)
 * brackets the real call with blocking_enter()/blocking_exit() (interpose.h):
 * a per-thread slot, claimed once, records "inside call number seq".  A few
 * plain stores; no lock, no clock, no allocation.
 *
 * At the JIT event (jit_event.c):
 *  - gil_release_prepare() looks up PyGILState_Check, PyEval_SaveThread,
 *    PyGILState_GetThisThreadState and Py_IsInitialized with dlsym at run time
 *    (the library does not link libpython, and a process without Python
 *    simply has nothing to release);
 *  - gil_release_start() installs the SIGUSR1 handler (only now, so that the
 *    application's own SIGUSR1 handler is untouched during training; foreign
 *    SIGUSR1s are passed on to it) and starts the releaser thread.  Every few
 *    ms the releaser sends SIGUSR1, once per call, to each thread that is
 *    inside a blocking call it entered before the JIT event, with
 *    rt_tgsigqueueinfo, the system call behind pthread_sigqueue (a kernel
 *    thread id cannot dangle the way a pthread_t of an exited thread can).
 *  - The handler checks that the signal is ours (SI_QUEUE from this process,
 *    our tag and the call's sequence number) and that its thread is still
 *    inside that call.  If the thread holds the GIL, the handler releases it
 *    (PyEval_SaveThread) and returns: the thread goes on waiting inside the
 *    CUDA call, holding no lock of ours or of the runtime's that it did not
 *    hold before.  If that call ever returns, blocking_exit() parks the
 *    thread for good, so it can never run Python without the GIL, nor change
 *    the state being saved.  The process exits after the save.
 *  - A thread that is not saving and *enters* a blocking call after the JIT
 *    event while holding the GIL releases it and parks at once.
 *
 * The handler only reads its own thread's slot and calls the two Python
 * functions; the interrupted thread is inside a CUDA call, not inside the
 * interpreter's GIL code, so those calls cannot find the GIL's own mutex
 * held by the thread they interrupt. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "interpose.h"

#define MAX_THREADS 1024
#define SIGNAL_TAG 0x4A000000
#define TAG_MASK 0xFF000000
#define SEQ_MASK 0x00FFFFFF

__thread struct thread_slot *tl_slot __attribute__((tls_model("initial-exec")));
static __thread int tl_untracked __attribute__((tls_model("initial-exec")));

static struct thread_slot slots[MAX_THREADS];
static _Atomic int slots_used;              /* high-water mark */
static pthread_key_t slot_key;
static pthread_once_t slot_key_once = PTHREAD_ONCE_INIT;

static struct {
    int (*gil_check)(void);
    void *(*save_thread)(void);
    void *(*this_thread_state)(void);
    int (*is_initialized)(void);
    int ok;
} py;

static struct sigaction previous_action;

/* ---- slots ------------------------------------------------------------- */

static void release_slot(void *p)
{
    struct thread_slot *slot = p;
    atomic_store(&slot->inside, 0);
    atomic_store(&slot->owned, 0);
}

static void make_key(void)
{
    pthread_key_create(&slot_key, release_slot);
}

static struct thread_slot *claim_slot(void)
{
    pthread_once(&slot_key_once, make_key);
    for (int i = 0; i < MAX_THREADS; i++) {
        int expected = 0;
        if (atomic_load_explicit(&slots[i].owned, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&slots[i].owned, &expected, 1)) {
            struct thread_slot *slot = &slots[i];
            atomic_store(&slot->inside, 0);
            atomic_store(&slot->gil_released, 0);
            atomic_store(&slot->after_jit, 0);
            atomic_store(&slot->signaled_seq, atomic_load(&slot->seq));
            atomic_store_explicit(&slot->tid, (int)syscall(SYS_gettid), memory_order_release);
            int used = atomic_load(&slots_used);
            while (used < i + 1 && !atomic_compare_exchange_weak(&slots_used, &used, i + 1)) {
            }
            pthread_setspecific(slot_key, slot);
            tl_slot = slot;
            return slot;
        }
    }
    tl_untracked = 1;
    count(&counters.untracked);
    static _Atomic int reported;
    if (!atomic_exchange(&reported, 1))
        ilog("more than %d threads make blocking CUDA calls: the others are not tracked",
             MAX_THREADS);
    return NULL;
}

/* ---- the Python C API, looked up at run time ------------------------------ */

void gil_release_prepare(void)
{
    if (!config.gil_release)
        return;
    py.gil_check = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Check");
    py.save_thread = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    py.this_thread_state = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    py.is_initialized = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    py.ok = py.gil_check && py.save_thread && py.this_thread_state && py.is_initialized &&
            py.is_initialized();
}

static int holds_gil(void)
{
    return py.ok && py.this_thread_state() != NULL && py.gil_check();
}

static void park_forever(void)
{
    count(&counters.threads_parked);
    for (;;)
        pause();
}

/* ---- the blocking wrappers' slow paths ------------------------------------ */

struct thread_slot *blocking_enter_slow(void)
{
    struct thread_slot *slot = tl_slot;
    if (slot == NULL && !tl_untracked)
        slot = claim_slot();
    int fired = interpose_special() & MODE_FIRED;
    if (fired && config.gil_release && !this_thread_saving() && holds_gil()) {
        /* After the JIT event: this thread would block with the GIL. */
        py.save_thread();
        park_forever();
    }
    if (slot == NULL)
        return NULL;
    atomic_store_explicit(&slot->seq, atomic_load_explicit(&slot->seq, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&slot->after_jit, fired ? 1 : 0, memory_order_relaxed);
    atomic_store_explicit(&slot->inside, 1, memory_order_release);
    atomic_signal_fence(memory_order_seq_cst);
    return slot;
}

void blocking_exit_slow(struct thread_slot *slot)
{
    (void)slot;
    /* The handler released this thread's GIL while it was blocked: it must
     * not run Python again. */
    park_forever();
}

/* ---- the signal -------------------------------------------------------- */

static void pass_on(int sig, siginfo_t *info, void *context)
{
    if (previous_action.sa_flags & SA_SIGINFO) {
        if (previous_action.sa_sigaction != NULL)
            previous_action.sa_sigaction(sig, info, context);
    } else if (previous_action.sa_handler == SIG_DFL) {
        signal(sig, SIG_DFL);       /* SIGUSR1's default action: terminate */
        raise(sig);
    } else if (previous_action.sa_handler != SIG_IGN) {
        previous_action.sa_handler(sig);
    }
}

static void on_sigusr1(int sig, siginfo_t *info, void *context)
{
    int saved_errno = errno;
    int value = info->si_value.sival_int;
    if (info->si_code != SI_QUEUE || info->si_pid != getpid() ||
        (value & TAG_MASK) != SIGNAL_TAG) {
        errno = saved_errno;
        pass_on(sig, info, context);
        return;
    }
    struct thread_slot *me = tl_slot;
    if (me != NULL && atomic_load_explicit(&me->inside, memory_order_relaxed) &&
        !atomic_load_explicit(&me->after_jit, memory_order_relaxed) &&
        (atomic_load_explicit(&me->seq, memory_order_relaxed) & SEQ_MASK) ==
            ((unsigned)value & SEQ_MASK) &&
        !atomic_load_explicit(&me->gil_released, memory_order_relaxed) && !this_thread_saving() &&
        holds_gil()) {
        me->tstate = py.save_thread();
        atomic_store_explicit(&me->gil_released, 1, memory_order_relaxed);
        count(&counters.gil_released);
    }
    errno = saved_errno;
}

static int send_signal(int tid, unsigned seq)
{
    siginfo_t info;
    memset(&info, 0, sizeof info);
    info.si_signo = SIGUSR1;
    info.si_code = SI_QUEUE;
    info.si_pid = getpid();
    info.si_uid = getuid();
    info.si_value.sival_int = (int)(SIGNAL_TAG | (seq & SEQ_MASK));
    return (int)syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, SIGUSR1, &info);
}

static void *releaser_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "jitckpt-gil");
    struct timespec pause_ts = {0, 2 * 1000000L};
    for (;;) {
        int used = atomic_load(&slots_used);
        for (int i = 0; i < used; i++) {
            struct thread_slot *s = &slots[i];
            if (!atomic_load(&s->owned) || !atomic_load_explicit(&s->inside, memory_order_acquire) ||
                atomic_load(&s->after_jit) || atomic_load(&s->gil_released))
                continue;
            unsigned seq = atomic_load(&s->seq);
            if (seq == atomic_load(&s->signaled_seq))
                continue;
            atomic_store(&s->signaled_seq, seq);
            /* counted before it is sent: the handler may release the GIL and a JIT save report the
               counters before this thread runs again */
            count(&counters.signals_sent);
            if (send_signal(atomic_load(&s->tid), seq) != 0)
                atomic_fetch_sub(&counters.signals_sent, 1);
        }
        nanosleep(&pause_ts, NULL);
    }
    return NULL;
}

void gil_release_start(void)
{
    if (!config.gil_release || !py.ok)
        return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigusr1;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGUSR1, &action, &previous_action) != 0) {
        ilog("cannot install the SIGUSR1 handler (%s): a thread that holds the GIL while "
             "blocked in CUDA will keep it",
             strerror(errno));
        return;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, releaser_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        ilog("cannot start the GIL releaser thread (%s)", strerror(rc));
}
