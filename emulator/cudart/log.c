/* log.c -- diagnostics of the emulator on stderr.
 *
 * Every line starts with "jitckpt-simdev: " so that a test or a user can tell
 * the emulator's voice from the program's.  simdev_trace() lines appear only
 * with JITCKPT_SIMDEV_TRACE=1; simdev_fatal_config() is for configuration the
 * emulator cannot honour (a malformed fault spec, say) and ends the process. */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simdev.h"

int simdev_trace_enabled;

static void vlog(const char *fmt, va_list ap)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "jitckpt-simdev[%d]: ", (int)getpid());
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    /* One write() per line keeps lines of concurrent threads apart. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void simdev_vlog(const char *fmt, va_list ap)
{
    vlog(fmt, ap);
}

void simdev_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void simdev_trace(const char *fmt, ...)
{
    if (!simdev_trace_enabled)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void simdev_fatal_config(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
    _exit(2);
}
