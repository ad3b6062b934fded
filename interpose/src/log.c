/* log.c -- diagnostics on stderr, and the clock the library uses.
 *
 * Every message starts with "jitckpt-interpose[pid]: " so that it can be told
 * apart from the program's own output and from the emulator's
 * ("jitckpt-simdev[pid]: ").  Messages are rare (start-up problems, the JIT
 * event); nothing on a hot path prints. */

#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "interpose.h"

void ilog(const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "jitckpt-interpose[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = 0;
    while (line[len] != '\0')
        len++;
    line[len++] = '\n';
    /* One write(2): lines from several threads or ranks do not interleave. */
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
}

int64_t now_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
