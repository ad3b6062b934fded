/* fault.c -- fault injection from JITCKPT_SIMDEV_FAULT.
 *
 * Syntax: faults separated by ';', each a comma list of key=value:
 *
 *     rank=2,op=ncclAllReduce,call=37,kind=hang
 *     op=cudaMemcpy,call=3+,kind=slow,delay_ms=200
 *
 *   op        API name (cudaMemcpyAsync, ncclAllReduce, ...) or, for kernel
 *             launches, cudaLaunchKernel or the kernel's registered name
 *   kind      hang   the operation never completes on its stream (or never
 *                    returns, for calls that are not stream work)
 *             sticky this call and every later one fail with a sticky error
 *                    (cudaErrorIllegalAddress / ncclUnhandledCudaError)
 *             lost   the device is gone: cudaErrorDevicesUnavailable (NCCL:
 *                    ncclUnhandledCudaError) from this call on
 *             slow   the operation is delayed by delay_ms (default 1000)
 *   call      N: only the N-th call of op in this process (1-based);
 *             N+: the N-th and every later call; omitted: every call
 *   rank      only in the process whose rank matches: the communicator rank
 *             for NCCL calls, the RANK environment variable otherwise
 *   delay_ms  for kind=slow
 *
 * A malformed spec ends the process with a message that shows the syntax:
 * silently ignoring a fault a test asked for would make the test lie. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"

#define MAX_FAULTS 32

struct fault {
    char op[128];
    enum simdev_fault_kind kind;
    int rank;                   /* -1: any */
    unsigned long call;         /* 0: every call */
    int from_call_on;           /* "N+" */
    unsigned delay_ms;
    unsigned long count;        /* calls of op seen so far */
    int logged;                 /* slow faults are logged once */
};

static struct fault faults[MAX_FAULTS];
static int nfaults;

static const char SYNTAX[] =
    "syntax: op=NAME,kind=hang|sticky|lost|slow[,rank=R][,call=N|N+][,delay_ms=MS], "
    "several separated by ';'";

static unsigned long parse_ulong(const char *spec, const char *key, const char *v)
{
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, 10);
    if (end == v || *end != '\0' || errno)
        simdev_fatal_config("bad JITCKPT_SIMDEV_FAULT entry '%s': %s=%s is not a number (%s)",
                            spec, key, v, SYNTAX);
    return n;
}

static void parse_entry(char *spec)
{
    char copy[512];
    strncpy(copy, spec, sizeof copy - 1);
    copy[sizeof copy - 1] = '\0';
    if (nfaults == MAX_FAULTS)
        simdev_fatal_config("JITCKPT_SIMDEV_FAULT has more than %d faults", MAX_FAULTS);
    struct fault *f = &faults[nfaults];
    memset(f, 0, sizeof *f);
    f->rank = -1;
    f->delay_ms = 1000;
    char *save = NULL;
    for (char *item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        char *eq = strchr(item, '=');
        if (!eq)
            simdev_fatal_config("bad JITCKPT_SIMDEV_FAULT entry '%s': '%s' is not key=value (%s)",
                                copy, item, SYNTAX);
        *eq = '\0';
        char *key = item, *val = eq + 1;
        size_t vl = strlen(val);
        while (vl && val[vl - 1] == ' ')
            val[--vl] = '\0';
        if (strcmp(key, "op") == 0) {
            if (!*val || vl >= sizeof f->op)
                simdev_fatal_config("bad JITCKPT_SIMDEV_FAULT entry '%s': empty or too long op (%s)",
                                    copy, SYNTAX);
            strcpy(f->op, val);
        } else if (strcmp(key, "kind") == 0) {
            if (strcmp(val, "hang") == 0) f->kind = SIMDEV_FAULT_HANG;
            else if (strcmp(val, "sticky") == 0) f->kind = SIMDEV_FAULT_STICKY;
            else if (strcmp(val, "lost") == 0) f->kind = SIMDEV_FAULT_LOST;
            else if (strcmp(val, "slow") == 0) f->kind = SIMDEV_FAULT_SLOW;
            else
                simdev_fatal_config("bad JITCKPT_SIMDEV_FAULT entry '%s': unknown kind '%s' (%s)",
                                    copy, val, SYNTAX);
        } else if (strcmp(key, "rank") == 0) {
            f->rank = (int)parse_ulong(copy, key, val);
        } else if (strcmp(key, "call") == 0) {
            if (vl && val[vl - 1] == '+') {
                f->from_call_on = 1;
                val[--vl] = '\0';
            }
            f->call = parse_ulong(copy, key, val);
            if (f->call == 0)
                simdev_fatal_config("bad JITCKPT_SIMDEV_FAULT entry '%s': call counts from 1 (%s)",
                                    copy, SYNTAX);
        } else if (strcmp(key, "delay_ms") == 0) {
            f->delay_ms = (unsigned)parse_ulong(copy, key, val);
        } else {
            simdev_fatal_config("bad JITCKPT_SIMDEV_FAULT entry '%s': unknown key '%s' (%s)",
                                copy, key, SYNTAX);
        }
    }
    if (!f->op[0] || f->kind == SIMDEV_FAULT_NONE)
        simdev_fatal_config("bad JITCKPT_SIMDEV_FAULT entry '%s': op and kind are required (%s)",
                            copy, SYNTAX);
    nfaults++;
}

void simdev_fault_load(void)
{
    const char *env = getenv("JITCKPT_SIMDEV_FAULT");
    if (!env || !*env)
        return;
    char *buf = strdup(env);
    char *save = NULL;
    for (char *spec = strtok_r(buf, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
        while (*spec == ' ')
            spec++;
        if (*spec)
            parse_entry(spec);
    }
    free(buf);
}

int simdev_fault_active(void)
{
    return nfaults > 0;
}

static const char *kind_name(enum simdev_fault_kind k)
{
    switch (k) {
    case SIMDEV_FAULT_HANG: return "hang";
    case SIMDEV_FAULT_STICKY: return "sticky";
    case SIMDEV_FAULT_LOST: return "lost";
    case SIMDEV_FAULT_SLOW: return "slow";
    default: return "none";
    }
}

void simdev_fault_match(const char *op, const char *alt_op, int rank,
                        struct simdev_fault_hit *hit)
{
    hit->kind = SIMDEV_FAULT_NONE;
    hit->delay_ms = 0;
    for (int i = 0; i < nfaults; i++) {
        struct fault *f = &faults[i];
        if (strcmp(f->op, op) != 0 && !(alt_op && strcmp(f->op, alt_op) == 0))
            continue;
        unsigned long n = __atomic_add_fetch(&f->count, 1, __ATOMIC_RELAXED);
        if (hit->kind != SIMDEV_FAULT_NONE)
            continue;               /* keep counting the other entries */
        if (f->rank >= 0 && f->rank != rank)
            continue;
        if (f->call && !(n == f->call || (f->from_call_on && n > f->call)))
            continue;
        hit->kind = f->kind;
        hit->delay_ms = f->delay_ms;
        if (f->kind != SIMDEV_FAULT_SLOW || !f->logged)
            simdev_log("injecting fault kind=%s at %s call %lu (rank %d)", kind_name(f->kind),
                       f->op, n, rank);
        f->logged = 1;
    }
}
