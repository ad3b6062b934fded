/* config.c -- the library's settings, read from the environment at load time.
 *
 *   JITCKPT_HANG_TIMEOUT          seconds a watched event may stay not-ready
 *                                 before it is a JIT event (default 60; the same
 *                                 variable jit-run sets for the Python watchdog)
 *   JITCKPT_INTERPOSE_POLL_MS     watchdog polling interval (default 5 ms)
 *   JITCKPT_INTERPOSE_GIL_RELEASE 0 turns off the SIGUSR1 GIL release (default 1)
 *   JITCKPT_INTERPOSE_REDIRECT    0 turns off save-time copy redirection (default 1)
 *   JITCKPT_INTERPOSE_STATS       1 prints the counters on stderr at exit
 *
 * A malformed value stops the program with exit status 2 and a message that
 * names the variable: silently running with another timeout than the one
 * asked for would make a hang test (or a job) lie. */

#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "interpose.h"

struct interpose_config config = {
    .timeout_ns = 60LL * 1000000000,
    .poll_ms = 5,
    .gil_release = 1,
    .redirect = 1,
    .stats = 0,
};

static void bad_value(const char *name, const char *value, const char *want)
{
    ilog("%s=%s is not valid: expected %s", name, value, want);
    _exit(2);
}

static double env_seconds(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno != 0 || *end != '\0' || !isfinite(x) || x <= 0)
        bad_value(name, v, "a number of seconds > 0");
    return x;
}

static int env_int(const char *name, int dflt, int lo, int hi)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || x < lo || x > hi) {
        char want[64];
        snprintf(want, sizeof want, "an integer from %d to %d", lo, hi);
        bad_value(name, v, want);
    }
    return (int)x;
}

void config_load(void)
{
    double timeout = env_seconds("JITCKPT_HANG_TIMEOUT", 60.0);
    atomic_store(&config.timeout_ns, (int64_t)(timeout * 1e9));
    config.poll_ms = env_int("JITCKPT_INTERPOSE_POLL_MS", 5, 1, 10000);
    config.gil_release = env_int("JITCKPT_INTERPOSE_GIL_RELEASE", 1, 0, 1);
    config.redirect = env_int("JITCKPT_INTERPOSE_REDIRECT", 1, 0, 1);
    config.stats = env_int("JITCKPT_INTERPOSE_STATS", 0, 0, 1);
}
