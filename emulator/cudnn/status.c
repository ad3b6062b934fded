/* status.c -- cudnnGetErrorString and cudnnGetLastErrorString, and the one
 * place that reports a refused call.
 *
 * The names come from the cudnnStatus_t enum of the cudnn_graph.h the library
 * is built against (tools/gen_cudnn_status.py generates the table; a value
 * that several names share maps to its current, non-deprecated name).  As in
 * cuDNN, cudnnGetErrorString returns the enumerator's name; a value the
 * header does not define gives "CUDNN_UNKNOWN_STATUS_FOUND".
 *
 * A refused call is logged on stderr ("jitckpt-simdev: cuDNN <api>: <why>
 * (<status>)"), since a status alone rarely says what was wrong, and its
 * message is kept per thread for cudnnGetLastErrorString. */

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#include "cudnn_status.inc"

const char *CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status)
{
    return status_name(status);
}

static __thread char last_error[512];

/* The message of the latest refused call on this thread ("" if none); it is
 * not cleared by reading. */
void CUDNNWINAPI cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (!message || max_size == 0)
        return;
    snprintf(message, max_size, "%s", last_error);
}

cudnnStatus_t dnn_report(cudnnStatus_t status, const char *api, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%s: %s (%s)", api, msg, status_name(status));
    jitckpt_simdev_log("cuDNN %s: %s (%s)", api, msg, status_name(status));
    return status;
}
