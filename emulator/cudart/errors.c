/* errors.c -- error codes, the per-thread last error, sticky device errors and
 * the entry/exit helpers every API call goes through.
 *
 * CUDA keeps two kinds of error state: the per-thread "last error", which
 * cudaGetLastError returns and clears, and a per-device sticky error (an
 * illegal address, a lost device) after which every call fails with the same
 * code until the process ends.  simdev_enter() is where fault injection fires
 * and where a sticky error short-circuits a call; simdev_return() records the
 * last error. */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "simdev.h"

struct error_entry {
    int value;
    const char *name;
    const char *doc;
};

static const struct error_entry error_table[] = {
#include "cuda_errors.inc"
};

/* Short descriptions for the codes programs print most often; the rest use
 * the first sentence of the header's documentation. */
static const struct { int value; const char *text; } short_text[] = {
    { cudaSuccess, "no error" },
    { cudaErrorInvalidValue, "invalid argument" },
    { cudaErrorMemoryAllocation, "out of memory" },
    { cudaErrorInitializationError, "initialization error" },
    { cudaErrorInvalidConfiguration, "invalid configuration argument" },
    { cudaErrorInvalidSymbol, "invalid device symbol" },
    { cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy" },
    { cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable" },
    { cudaErrorInvalidDeviceFunction, "invalid device function" },
    { cudaErrorNoDevice, "no CUDA-capable device is detected" },
    { cudaErrorInvalidDevice, "invalid device ordinal" },
    { cudaErrorInvalidKernelImage, "device kernel image is invalid" },
    { cudaErrorInvalidResourceHandle, "invalid resource handle" },
    { cudaErrorNotReady, "device not ready" },
    { cudaErrorIllegalAddress, "an illegal memory access was encountered" },
    { cudaErrorLaunchFailure, "unspecified launch failure" },
    { cudaErrorNotSupported, "operation not supported" },
    { cudaErrorUnknown, "unknown error" },
};

const char *simdev_error_name(cudaError_t err)
{
    size_t lo = 0, hi = sizeof error_table / sizeof error_table[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (error_table[mid].value == (int)err)
            return error_table[mid].name;
        if (error_table[mid].value < (int)err)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *simdev_error_string(cudaError_t err)
{
    for (size_t i = 0; i < sizeof short_text / sizeof short_text[0]; i++)
        if (short_text[i].value == (int)err)
            return short_text[i].text;
    for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; i++)
        if (error_table[i].value == (int)err)
            return error_table[i].doc;
    return NULL;
}

const char *cudaGetErrorName(cudaError_t error)
{
    const char *name = simdev_error_name(error);
    return name ? name : "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t error)
{
    const char *text = simdev_error_string(error);
    return text ? text : "unrecognized error code";
}

/* ---- initialisation ---------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_all(void)
{
    simdev_config_load();
    simdev_fault_load();
}

void simdev_init(void)
{
    pthread_once(&init_once, init_all);
}

/* ---- last error and sticky errors -------------------------------------- */

static __thread cudaError_t tls_last_error = cudaSuccess;

static cudaError_t device_fatal(int device)
{
    if (!simdev_valid_device(device))
        return cudaSuccess;
    return __atomic_load_n(&simdev_devices[device].fatal, __ATOMIC_ACQUIRE);
}

cudaError_t simdev_return(cudaError_t err)
{
    if (err != cudaSuccess && err != cudaErrorNotReady)
        tls_last_error = err;
    return err;
}

cudaError_t cudaGetLastError(void)
{
    simdev_init();
    cudaError_t fatal = device_fatal(simdev_current_device());
    if (fatal != cudaSuccess)
        return fatal;
    cudaError_t err = tls_last_error;
    tls_last_error = cudaSuccess;
    return err;
}

cudaError_t cudaPeekAtLastError(void)
{
    simdev_init();
    cudaError_t fatal = device_fatal(simdev_current_device());
    if (fatal != cudaSuccess)
        return fatal;
    return tls_last_error;
}

void simdev_raise(int device, cudaError_t err, const char *why)
{
    if (!simdev_valid_device(device))
        return;
    pthread_mutex_lock(&simdev_lock);
    struct simdev_device *d = &simdev_devices[device];
    /* A lost device outranks a sticky error; the first of each kind wins. */
    if (d->fatal == cudaSuccess ||
        (d->fatal != cudaErrorDevicesUnavailable && err == cudaErrorDevicesUnavailable)) {
        __atomic_store_n(&d->fatal, err, __ATOMIC_RELEASE);
        snprintf(d->fatal_why, sizeof d->fatal_why, "%s", why);
        simdev_log("device %d is now in error state %s (%s); every later call fails with it",
                   device, cudaGetErrorName(err), why);
    }
    pthread_cond_broadcast(&simdev_progress);
    pthread_mutex_unlock(&simdev_lock);
}

void simdev_host_fault(const struct simdev_fault_hit *hit, const char *op)
{
    int device = simdev_current_device();
    if (hit->kind == SIMDEV_FAULT_SLOW) {
        struct timespec ts = { hit->delay_ms / 1000, (long)(hit->delay_ms % 1000) * 1000000L };
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
            ;
        return;
    }
    if (hit->kind != SIMDEV_FAULT_HANG)
        return;
    simdev_log("injected hang: %s on the calling thread will not return", op);
    pthread_mutex_lock(&simdev_lock);
    while (device_fatal(device) == cudaSuccess)
        pthread_cond_wait(&simdev_progress, &simdev_lock);
    pthread_mutex_unlock(&simdev_lock);
}

static cudaError_t enter(const char *op, const char *alt, int device,
                         struct simdev_fault_hit *hit)
{
    simdev_init();
    if (hit)
        memset(hit, 0, sizeof *hit);
    if (simdev_config.ndevices == 0)
        return cudaErrorNoDevice;
    if (simdev_fault_active()) {
        struct simdev_fault_hit h = { SIMDEV_FAULT_NONE, 0 };
        simdev_fault_match(op, alt, simdev_config.process_rank, &h);
        char why[200], where[160];
        if (alt)
            snprintf(where, sizeof where, "%s (%s)", op, alt);
        else
            snprintf(where, sizeof where, "%s", op);
        switch (h.kind) {
        case SIMDEV_FAULT_STICKY:
            snprintf(why, sizeof why, "injected sticky fault at %s", where);
            simdev_raise(device, cudaErrorIllegalAddress, why);
            break;
        case SIMDEV_FAULT_LOST:
            snprintf(why, sizeof why, "injected lost-device fault at %s", where);
            simdev_raise(device, cudaErrorDevicesUnavailable, why);
            break;
        case SIMDEV_FAULT_HANG:
        case SIMDEV_FAULT_SLOW:
            if (hit)
                *hit = h;
            else
                simdev_host_fault(&h, op);
            break;
        default:
            break;
        }
    }
    return device_fatal(device);
}

cudaError_t simdev_enter(const char *op, struct simdev_fault_hit *hit)
{
    simdev_init();
    return enter(op, NULL, simdev_current_device(), hit);
}

cudaError_t simdev_enter_device(const char *op, int device, struct simdev_fault_hit *hit)
{
    return enter(op, NULL, device, hit);
}

cudaError_t simdev_enter_kernel(const char *kernel_name, struct simdev_fault_hit *hit)
{
    simdev_init();
    return enter("cudaLaunchKernel", kernel_name, simdev_current_device(), hit);
}
