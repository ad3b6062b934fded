/* jitckpt_simdev.h -- the small private interface that the emulated
 * libcudart.so.13 exports for the emulated libnccl.so.2.
 *
 * The real NCCL drives the GPU through the driver API, not through the
 * runtime's public functions, so an LD_PRELOAD interposer never sees NCCL's
 * own stream work.  The emulated NCCL keeps that property by reaching the
 * emulated device only through these functions (exported under the separate
 * version node JITCKPT_SIMDEV_1), never through cuda* symbols. */

#ifndef JITCKPT_SIMDEV_PRIVATE_H
#define JITCKPT_SIMDEV_PRIVATE_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fault kinds, as parsed from JITCKPT_SIMDEV_FAULT. */
#define JITCKPT_SIMDEV_FAULT_NONE   0
#define JITCKPT_SIMDEV_FAULT_HANG   1
#define JITCKPT_SIMDEV_FAULT_STICKY 2
#define JITCKPT_SIMDEV_FAULT_LOST   3
#define JITCKPT_SIMDEV_FAULT_SLOW   4

/* Runs fn(arg) on the stream's worker thread after all earlier work on the
 * stream (legacy default stream rules included).  release(arg), if given, is
 * called once fn ran or was dropped (device reset or failure). */
cudaError_t jitckpt_simdev_enqueue(cudaStream_t stream, const char *name,
                                   void (*fn)(void *), void *arg, void (*release)(void *));

/* Makes `waiter` wait for all work submitted so far to `waitee`. */
cudaError_t jitckpt_simdev_stream_join(cudaStream_t waiter, cudaStream_t waitee);

/* cudaSuccess while the device is healthy, else its sticky or lost error. */
cudaError_t jitckpt_simdev_device_error(int device);
int jitckpt_simdev_current_device(void);
/* Puts the device into a sticky (cudaErrorIllegalAddress) or lost
 * (cudaErrorDevicesUnavailable) state; `why` goes to the log. */
void jitckpt_simdev_raise(int device, cudaError_t err, const char *why);

/* Counts a call of `op` by `rank` for fault injection; returns the fault kind
 * and, for slow faults, the delay in *delay_ms. */
int jitckpt_simdev_fault(const char *op, int rank, unsigned *delay_ms);

/* cudaSuccess if [ptr, ptr+bytes) is memory the emulated device can access. */
cudaError_t jitckpt_simdev_check_range(const void *ptr, size_t bytes);

/* Device memory on the current device, as cudaMalloc/cudaFree (for
 * ncclMemAlloc/ncclMemFree). */
cudaError_t jitckpt_simdev_malloc(void **ptr, size_t bytes);
cudaError_t jitckpt_simdev_free(void *ptr);

/* Transparent mode's device proxy (proxy_server/README.md, "Device
 * pointers"): reserve one address range for device memory (no memory is
 * committed; one range per process), and allocate device memory on the
 * current device at an exact, page-aligned address -- inside the range, or
 * anywhere nothing is mapped (MAP_FIXED_NOREPLACE).  The allocation is an
 * ordinary one afterwards: cudaFree/jitckpt_simdev_free release it (inside
 * the range, its pages are unmapped and the addresses stay reserved).
 * cudaErrorInvalidValue for a bad or occupied address, cudaErrorMemoryAllocation
 * when the device is full or the address cannot be mapped. */
cudaError_t jitckpt_simdev_reserve(void *base, size_t bytes);
cudaError_t jitckpt_simdev_malloc_at(void *addr, size_t bytes);

/* Inside a stream worker: nonzero once the op should give up because its
 * device was reset or failed. */
int jitckpt_simdev_worker_should_stop(void);

/* Writes a line prefixed with "jitckpt-simdev: " to stderr. */
void jitckpt_simdev_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif

#endif /* JITCKPT_SIMDEV_PRIVATE_H */
