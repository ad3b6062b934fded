/* api.c -- the control interface (jitckpt_interpose.h), the counters, and the
 * library's constructor and destructor.
 *
 * These are the only non-CUDA, non-NCCL symbols the library exports, all in
 * version node JITCKPT_INTERPOSE_1.  jitckpt/interpose.py reaches them with
 * cffi after dlopen(RTLD_NOLOAD) of the preloaded library. */

#define _GNU_SOURCE
#include <stdio.h>

#include "interpose.h"

struct interpose_counters counters;

__attribute__((constructor)) static void interpose_init(void)
{
    config_load();
}

static void read_counters(struct jitckpt_interpose_counters *out)
{
    out->nccl_streams = atomic_load(&counters.nccl_streams);
    out->nccl_records = atomic_load(&counters.nccl_records);
    out->watches = atomic_load(&counters.watches);
    out->completions = atomic_load(&counters.completions);
    out->watchdog_started = atomic_load(&counters.watchdog_started);
    out->watchdog_polls = atomic_load(&counters.watchdog_polls);
    out->jit_events = atomic_load(&counters.jit_events);
    out->redirected_ops = atomic_load(&counters.redirected_ops);
    out->signals_sent = atomic_load(&counters.signals_sent);
    out->gil_released = atomic_load(&counters.gil_released);
    out->threads_parked = atomic_load(&counters.threads_parked);
    out->untracked = atomic_load(&counters.untracked);
    out->nccl_comms = atomic_load(&counters.nccl_comms);
    out->captured_records = atomic_load(&counters.captured_records);
    out->graph_launches = atomic_load(&counters.graph_launches);
}

__attribute__((destructor)) static void interpose_fini(void)
{
    if (!config.stats)
        return;
    struct jitckpt_interpose_counters c;
    read_counters(&c);
    ilog("stats nccl_streams=%llu nccl_records=%llu watches=%llu completions=%llu "
         "watchdog_started=%llu jit_events=%llu redirected_ops=%llu signals_sent=%llu "
         "gil_released=%llu threads_parked=%llu untracked=%llu nccl_comms=%llu "
         "captured_records=%llu graph_launches=%llu",
         (unsigned long long)c.nccl_streams, (unsigned long long)c.nccl_records,
         (unsigned long long)c.watches, (unsigned long long)c.completions,
         (unsigned long long)c.watchdog_started, (unsigned long long)c.jit_events,
         (unsigned long long)c.redirected_ops, (unsigned long long)c.signals_sent,
         (unsigned long long)c.gil_released, (unsigned long long)c.threads_parked,
         (unsigned long long)c.untracked, (unsigned long long)c.nccl_comms,
         (unsigned long long)c.captured_records, (unsigned long long)c.graph_launches);
}

EXPORT int jitckpt_interpose_api_version(void)
{
    return JITCKPT_INTERPOSE_API_VERSION;
}

EXPORT void jitckpt_interpose_set_callback(jitckpt_interpose_callback cb)
{
    jit_event_set_callback(cb);
}

EXPORT int jitckpt_interpose_set_timeout(double seconds)
{
    if (!(seconds > 0) || seconds > 1e9)
        return -1;
    atomic_store(&config.timeout_ns, (int64_t)(seconds * 1e9));
    return 0;
}

EXPORT double jitckpt_interpose_timeout(void)
{
    return (double)atomic_load(&config.timeout_ns) / 1e9;
}

EXPORT void jitckpt_interpose_save_in_progress(int on)
{
    jit_event_save_mode(on);
}

EXPORT int jitckpt_interpose_in_flight(struct jitckpt_interpose_watch *out, int max)
{
    return event_watch_list(out, max);
}

EXPORT void jitckpt_interpose_get_counters(struct jitckpt_interpose_counters *out)
{
    read_counters(out);
}
