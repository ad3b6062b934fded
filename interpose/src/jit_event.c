/* jit_event.c -- the JIT event: what happens, once, when the watchdog gives up.
 *
 *  1. The Python C API is looked up (gil_release.c), before anything else,
 *     because it is not safe to do so later from a signal handler.
 *  2. MODE_FIRED is set.  From now on the blocking wrappers take their slow
 *     path: a thread that is not saving and enters a blocking CUDA call while
 *     holding the GIL releases it and parks instead (gil_release.c).
 *  3. The SIGUSR1 handler is installed and the GIL releaser thread starts: it
 *     signals every thread that was already blocked inside a CUDA call, and
 *     the handler releases the GIL of the one that holds it (paper §3.2).
 *  4. The registered callback runs on this (the watchdog) thread, which is
 *     marked as saving: copies it issues on the legacy default stream or on a
 *     blocked stream are redirected to a fresh stream (redirect.c).  A
 *     Python callback acquires the GIL first, which step 3 made possible.
 *
 * The library never exits the process; the callback does, after the save
 * (jitckpt/interpose.py).  Without a callback the event is only reported.
 *
 * The save mode (MODE_SAVING) is also entered without a JIT event, through
 * jitckpt_interpose_save_in_progress(): the Python runtime saves on a thread
 * of its own, which marks itself.  Save mode is always one thread's, for the
 * length of its save: another thread never has its work redirected because
 * some thread saves (it would escape the hang and change the state being
 * saved), and nothing stays in save mode after save_in_progress(0), or after
 * the saving thread exits. */

#define _GNU_SOURCE
#include "interpose.h"

_Atomic int interpose_mode;
__thread int tl_saving __attribute__((tls_model("initial-exec")));

static _Atomic(jitckpt_interpose_callback) callback;
static _Atomic int raised;

void jit_event_set_callback(jitckpt_interpose_callback cb)
{
    atomic_store(&callback, cb);
}

void jit_event_raise(int reason, const char *detail)
{
    if (atomic_exchange(&raised, 1))
        return;
    count(&counters.jit_events);
    ilog("JIT event: %s", detail);
    gil_release_prepare();
    atomic_fetch_or(&interpose_mode, MODE_FIRED);
    gil_release_start();

    jitckpt_interpose_callback cb = atomic_load(&callback);
    if (cb == NULL) {
        ilog("no JIT-event callback is registered (jitckpt.interpose.install): nothing is saved");
        return;
    }
    jit_event_save_mode(1);
    cb(reason, detail);
    jit_event_save_mode(0);
}

/* MODE_SAVING is set while at least one thread is saving.  A thread that
 * exits while saving leaves save mode through the key's destructor. */
static pthread_mutex_t save_mode_lock = PTHREAD_MUTEX_INITIALIZER;
static int saving_threads;
static pthread_key_t saving_key;
static pthread_once_t saving_key_once = PTHREAD_ONCE_INIT;

static void update_mode_locked(void)
{
    if (saving_threads > 0)
        atomic_fetch_or(&interpose_mode, MODE_SAVING);
    else
        atomic_fetch_and(&interpose_mode, ~MODE_SAVING);
}

static void saving_thread_exit(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&save_mode_lock);
    saving_threads--;
    update_mode_locked();
    pthread_mutex_unlock(&save_mode_lock);
}

static void saving_key_create(void)
{
    pthread_key_create(&saving_key, saving_thread_exit);
}

void jit_event_save_mode(int on)
{
    pthread_once(&saving_key_once, saving_key_create);
    pthread_mutex_lock(&save_mode_lock);
    if (on && !tl_saving) {
        tl_saving = 1;
        saving_threads++;
        pthread_setspecific(saving_key, (void *)1);
    } else if (!on && tl_saving) {
        tl_saving = 0;
        saving_threads--;
        pthread_setspecific(saving_key, NULL);
    }
    update_mode_locked();
    pthread_mutex_unlock(&save_mode_lock);
}
