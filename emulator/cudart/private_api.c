/* private_api.c -- the jitckpt_simdev_* functions that the emulated NCCL
 * uses to reach the emulated device (see jitckpt_simdev.h for why NCCL does
 * not go through the public cuda* functions). */

#include <stdarg.h>

#include "jitckpt_simdev.h"
#include "simdev.h"

cudaError_t jitckpt_simdev_enqueue(cudaStream_t stream, const char *name,
                                   void (*fn)(void *), void *arg, void (*release)(void *))
{
    simdev_init();
    return simdev_submit_call(stream, 0, name, fn, arg, release, NULL, NULL, NULL);
}

cudaError_t jitckpt_simdev_stream_join(cudaStream_t waiter, cudaStream_t waitee)
{
    simdev_init();
    return simdev_stream_join(waiter, waitee, 0);
}

cudaError_t jitckpt_simdev_device_error(int device)
{
    simdev_init();
    if (!simdev_valid_device(device))
        return cudaErrorInvalidDevice;
    return __atomic_load_n(&simdev_devices[device].fatal, __ATOMIC_ACQUIRE);
}

int jitckpt_simdev_current_device(void)
{
    simdev_init();
    return simdev_current_device();
}

void jitckpt_simdev_raise(int device, cudaError_t err, const char *why)
{
    simdev_init();
    simdev_raise(device, err, why);
}

int jitckpt_simdev_fault(const char *op, int rank, unsigned *delay_ms)
{
    simdev_init();
    if (!simdev_fault_active())
        return JITCKPT_SIMDEV_FAULT_NONE;
    struct simdev_fault_hit hit;
    simdev_fault_match(op, NULL, rank, &hit);
    if (delay_ms)
        *delay_ms = hit.delay_ms;
    switch (hit.kind) {
    case SIMDEV_FAULT_HANG: return JITCKPT_SIMDEV_FAULT_HANG;
    case SIMDEV_FAULT_STICKY: return JITCKPT_SIMDEV_FAULT_STICKY;
    case SIMDEV_FAULT_LOST: return JITCKPT_SIMDEV_FAULT_LOST;
    case SIMDEV_FAULT_SLOW: return JITCKPT_SIMDEV_FAULT_SLOW;
    default: return JITCKPT_SIMDEV_FAULT_NONE;
    }
}

cudaError_t jitckpt_simdev_check_range(const void *ptr, size_t bytes)
{
    simdev_init();
    return simdev_mem_check_device_range(ptr, bytes);
}

int jitckpt_simdev_worker_should_stop(void)
{
    return simdev_worker_should_stop();
}

void jitckpt_simdev_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    simdev_vlog(fmt, ap);
    va_end(ap);
}

cudaError_t jitckpt_simdev_malloc(void **ptr, size_t bytes)
{
    simdev_init();
    int device = simdev_current_device();
    if (!simdev_valid_device(device))
        return cudaErrorNoDevice;
    cudaError_t err = jitckpt_simdev_device_error(device);
    if (err != cudaSuccess)
        return err;
    return simdev_mem_alloc(SIMDEV_MEM_DEVICE, device, bytes ? bytes : 1, 0, ptr);
}

cudaError_t jitckpt_simdev_free(void *ptr)
{
    simdev_init();
    struct simdev_alloc a;
    if (!ptr)
        return cudaSuccess;
    if (!simdev_mem_find(ptr, &a) || a.base != (uintptr_t)ptr || a.kind != SIMDEV_MEM_DEVICE)
        return cudaErrorInvalidValue;
    cudaError_t err = simdev_device_synchronize(a.device);
    if (err != cudaSuccess)
        return err;
    return simdev_mem_release(ptr, 1u << SIMDEV_MEM_DEVICE);
}
