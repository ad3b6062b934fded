/* status.c -- cublasLtGetStatusName/cublasLtGetStatusString, and the one
 * place that logs a rejected cuBLASLt call (the reason goes to stderr through
 * the emulated runtime's log, since a cublasStatus_t alone rarely says what
 * was wrong).  The names and texts are cuBLAS's: the real cuBLASLt shares
 * cublasStatus_t with cuBLAS and reports the same strings, so this is the
 * table of cublas/status.c (tools/gen_cublas_status.py, from cublas_api.h). */

#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

#include "cublas_status.inc"

const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status)
{
    return status_name(status);
}

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status)
{
    return status_description(status);
}

cublasStatus_t lt_report(cublasStatus_t status, const char *api, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jitckpt_simdev_log("cuBLASLt %s: %s (%s)", api, msg, cublasLtGetStatusName(status));
    return status;
}
