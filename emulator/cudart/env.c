/* env.c -- the environment variables that shape the emulated devices.
 *
 *   JITCKPT_SIMDEV_DEVICES   number of emulated devices (default 1, max 16)
 *   CUDA_VISIBLE_DEVICES     honoured as by the real runtime: a comma list of
 *                            emulated ids; the list ends at the first invalid
 *                            entry
 *   JITCKPT_SIMDEV_MEMORY    memory per device, e.g. 16G, 512M (default 16G)
 *   JITCKPT_SIMDEV_TRACE     1: log every failing call with its reason
 *   RANK                     the process's rank for fault matching (default 0)
 *
 * Kernel twins (JITCKPT_SIMDEV_KERNELS) are read in twin.c and faults
 * (JITCKPT_SIMDEV_FAULT) in fault.c. */

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"

struct simdev_config simdev_config;

size_t simdev_parse_size(const char *text, int *ok)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    *ok = 0;
    if (end == text || errno)
        return 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': v <<= 10; end++; break;
    case 'M': v <<= 20; end++; break;
    case 'G': v <<= 30; end++; break;
    case 'T': v <<= 40; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b' || *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return 0;
    *ok = 1;
    return (size_t)v;
}

static int parse_int(const char *text, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

void simdev_config_load(void)
{
    const char *s;
    long total = 1;

    simdev_trace_enabled = (s = getenv("JITCKPT_SIMDEV_TRACE")) && *s && strcmp(s, "0") != 0;

    if ((s = getenv("JITCKPT_SIMDEV_DEVICES")) && *s) {
        if (!parse_int(s, 0, SIMDEV_MAX_DEVICES, &total))
            simdev_fatal_config("JITCKPT_SIMDEV_DEVICES=%s is not a number of devices "
                                "between 0 and %d", s, SIMDEV_MAX_DEVICES);
    }

    simdev_config.ndevices = 0;
    s = getenv("CUDA_VISIBLE_DEVICES");
    if (s == NULL) {
        for (int i = 0; i < total; i++)
            simdev_config.physical[simdev_config.ndevices++] = i;
    } else {
        /* Like the real runtime: take entries up to the first invalid one. */
        char buf[256];
        strncpy(buf, s, sizeof buf - 1);
        buf[sizeof buf - 1] = '\0';
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            while (isspace((unsigned char)*tok))
                tok++;
            long id;
            if (!parse_int(tok, 0, total - 1, &id))
                break;
            int dup = 0;
            for (int i = 0; i < simdev_config.ndevices; i++)
                dup |= simdev_config.physical[i] == id;
            if (dup)
                break;
            simdev_config.physical[simdev_config.ndevices++] = (int)id;
        }
    }

    simdev_config.memory_bytes = (size_t)16 << 30;
    if ((s = getenv("JITCKPT_SIMDEV_MEMORY")) && *s) {
        int ok;
        size_t v = simdev_parse_size(s, &ok);
        if (!ok || v == 0)
            simdev_fatal_config("JITCKPT_SIMDEV_MEMORY=%s is not a size (examples: 16G, 512M)", s);
        simdev_config.memory_bytes = v;
    }

    simdev_config.process_rank = 0;
    long rank;
    if ((s = getenv("RANK")) && *s && parse_int(s, 0, 1 << 30, &rank))
        simdev_config.process_rank = (int)rank;
}
