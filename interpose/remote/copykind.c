/* copykind.c -- copies whose direction the program leaves to the runtime.
 *
 * cudaMemcpyDefault asks the runtime to tell device from host memory by the
 * address (unified addressing).  The worker can answer that itself: a device
 * pointer lies in one of its tracked allocations (restart.c); pinned and
 * managed regions are host memory shared with the proxy (pinned.c), which the
 * marshalling passes as pointers.  The stubs then send the resolved kind, so
 * a host buffer's bytes cross through the arena exactly as for an explicit
 * kind.  A host-to-host copy never needs the device: the worker waits for the
 * stream (so that earlier copies into either buffer have landed) and copies
 * in its own memory.
 *
 * cudaPointerGetAttributes of memory that is neither a device allocation nor
 * a region shared with the proxy is the worker's own host memory: the proxy
 * would look the address up in its own address space, where it may mean
 * something else, so the worker answers (pageable, as the runtime says). */

#include "remote.h"

#include <string.h>

enum cudaMemcpyKind remote_default_kind(const void *dst, const void *src)
{
    struct rcall c;
    remote_begin_quiet(&c, 0);          /* the call lock, for the allocation table */
    int dst_dev = dst == NULL || remote_is_device_ptr(dst);
    int src_dev = src == NULL || remote_is_device_ptr(src);
    remote_end(&c);
    if (dst_dev && src_dev)
        return cudaMemcpyDeviceToDevice;
    if (dst_dev)
        return cudaMemcpyHostToDevice;
    return src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
}

cudaError_t remote_copy_h2h(void *dst, const void *src, size_t count, cudaStream_t stream)
{
    if (count && (dst == NULL || src == NULL))
        return cudaErrorInvalidValue;
    cudaError_t err = cudaStreamSynchronize(stream);
    if (err == cudaSuccess && count)
        memmove(dst, src, count);
    return err;
}

int remote_pointer_attributes_here(struct cudaPointerAttributes *attributes, const void *ptr)
{
    if (attributes == NULL)
        return -1;                          /* the runtime's own error */
    struct rcall c;
    remote_begin_quiet(&c, 0);
    int proxy_knows = ptr != NULL && (remote_is_device_ptr(ptr) || remote_pinned_shared(ptr, 1));
    int managed = ptr != NULL && remote_pinned_is_managed(ptr);
    int registered = ptr != NULL && remote_registered_range(ptr);
    int device = remote_current_device();
    remote_end(&c);
    if (managed) {                          /* registered host memory in the proxy; managed memory to the program */
        memset(attributes, 0, sizeof *attributes);
        attributes->type = cudaMemoryTypeManaged;
        attributes->device = device;
        attributes->devicePointer = attributes->hostPointer = (void *)ptr;
        return cudaSuccess;
    }
    if (proxy_knows)
        return -1;
    memset(attributes, 0, sizeof *attributes);
    if (registered) {                       /* page-locked host memory to the program; no device pointer */
        attributes->type = cudaMemoryTypeHost;
        attributes->device = device;
        attributes->hostPointer = (void *)ptr;
        return cudaSuccess;
    }
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    return cudaSuccess;
}
