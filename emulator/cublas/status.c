/* status.c -- cublasGetStatusName/cublasGetStatusString, and the one place
 * that logs a rejected call (the reason goes to stderr through the emulated
 * runtime's log, since a cublasStatus_t alone rarely says what was wrong).
 *
 * The names come from the cublasStatus_t enum of the cublas_api.h the library
 * is built against (tools/gen_cublas_status.py generates the table, which
 * libcublasLt uses too); the texts are cublasGetStatusString's.  A value the
 * header does not define is "CUBLAS_STATUS_UNKNOWN", "unknown error". */

#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

#include "cublas_status.inc"

const char *CUBLASWINAPI cublasGetStatusName(cublasStatus_t status)
{
    return status_name(status);
}

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status)
{
    return status_description(status);
}

cublasStatus_t report(cublasStatus_t status, const char *api, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jitckpt_simdev_log("cuBLAS %s: %s (%s)", api, msg, cublasGetStatusName(status));
    return status;
}
