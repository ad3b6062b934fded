/* device.c -- device management: counting, selecting, describing,
 * synchronising and resetting the emulated devices.
 *
 * Each emulated device looks like a compute-capability 8.0 GPU with the
 * memory size set by JITCKPT_SIMDEV_MEMORY.  The current device is per
 * thread, as in the real runtime.  Attributes that describe hardware features
 * the emulator does not have (textures, surfaces, clusters, ...) read 0. */

#include <stdio.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "simdev.h"

struct simdev_device simdev_devices[SIMDEV_MAX_DEVICES];
pthread_mutex_t simdev_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t simdev_progress = PTHREAD_COND_INITIALIZER;

static __thread int tls_device = 0;

int simdev_current_device(void)
{
    return tls_device;
}

void simdev_set_thread_device(int device)
{
    tls_device = device;
}

int simdev_valid_device(int device)
{
    return device >= 0 && device < simdev_config.ndevices;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    simdev_init();
    if (!count)
        return simdev_return(cudaErrorInvalidValue);
    *count = simdev_config.ndevices;
    if (simdev_config.ndevices == 0)
        return simdev_return(cudaErrorNoDevice);
    cudaError_t err = simdev_enter("cudaGetDeviceCount", NULL);
    return simdev_return(err);
}

cudaError_t cudaSetDevice(int device)
{
    simdev_init();
    if (simdev_config.ndevices == 0)
        return simdev_return(cudaErrorNoDevice);
    if (!simdev_valid_device(device))
        return simdev_return(cudaErrorInvalidDevice);
    tls_device = device;
    return simdev_return(simdev_enter("cudaSetDevice", NULL));
}

cudaError_t cudaGetDevice(int *device)
{
    cudaError_t err = simdev_enter("cudaGetDevice", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!device)
        return simdev_return(cudaErrorInvalidValue);
    *device = tls_device;
    return cudaSuccess;
}

cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
    (void)flags;
    simdev_init();
    if (!simdev_valid_device(device))
        return simdev_return(simdev_config.ndevices ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    cudaError_t err = simdev_enter_device("cudaInitDevice", device, NULL);
    if (err == cudaSuccess) {
        pthread_mutex_lock(&simdev_lock);
        simdev_devices[device].flags = deviceFlags;
        simdev_devices[device].initialised = 1;
        pthread_mutex_unlock(&simdev_lock);
    }
    return simdev_return(err);
}

cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    cudaError_t err = simdev_enter("cudaSetDeviceFlags", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    unsigned known = cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax |
                     cudaDeviceSyncMemops;
    if (flags & ~known)
        return simdev_return(cudaErrorInvalidValue);
    pthread_mutex_lock(&simdev_lock);
    simdev_devices[tls_device].flags = flags;
    pthread_mutex_unlock(&simdev_lock);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    cudaError_t err = simdev_enter("cudaGetDeviceFlags", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!flags)
        return simdev_return(cudaErrorInvalidValue);
    pthread_mutex_lock(&simdev_lock);
    *flags = simdev_devices[tls_device].flags | cudaDeviceMapHost;
    pthread_mutex_unlock(&simdev_lock);
    return cudaSuccess;
}

static void fill_properties(struct cudaDeviceProp *p, int device)
{
    int physical = simdev_config.physical[device];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "jitckpt simulated GPU %d (CPU emulator)", physical);
    for (int i = 0; i < 16; i++)
        p->uuid.bytes[i] = (char)(0x5a ^ (i * 17) ^ physical);
    p->totalGlobalMem = simdev_config.memory_bytes;
    p->sharedMemPerBlock = 48 * 1024;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = (size_t)1 << 31;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 64 * 1024;
    p->major = 8;
    p->minor = 0;
    p->textureAlignment = 512;
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = 8;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->pciBusID = 0x10 + physical;
    p->pciDeviceID = 0;
    p->pciDomainID = 0;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 4096;
    p->l2CacheSize = 40 * 1024 * 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor = 164 * 1024;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->hostNativeAtomicSupported = 1;
    p->pageableMemoryAccess = 0;
    p->concurrentManagedAccess = 0;
    p->computePreemptionSupported = 1;
    p->canUseHostPointerForRegisteredMem = 1;
    p->sharedMemPerBlockOptin = 163 * 1024;
    p->directManagedMemAccessFromHost = 1;
    p->maxBlocksPerMultiProcessor = 32;
    p->reservedSharedMemPerBlock = 1024;
    p->hostRegisterSupported = 1;
    p->deviceNumaId = -1;
    p->hostNumaId = -1;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    simdev_init();
    if (!simdev_valid_device(device))
        return simdev_return(simdev_config.ndevices ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    cudaError_t err = simdev_enter_device("cudaGetDeviceProperties", device, NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!prop)
        return simdev_return(cudaErrorInvalidValue);
    fill_properties(prop, device);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    simdev_init();
    if (!simdev_valid_device(device))
        return simdev_return(simdev_config.ndevices ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    cudaError_t err = simdev_enter_device("cudaDeviceGetAttribute", device, NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!value || (int)attr < 1 || attr >= cudaDevAttrMax)
        return simdev_return(cudaErrorInvalidValue);
    struct cudaDeviceProp p;
    fill_properties(&p, device);
    int v = 0;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: v = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: v = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: v = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: v = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: v = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: v = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrTotalConstantMemory: v = (int)p.totalConstMem; break;
    case cudaDevAttrWarpSize: v = p.warpSize; break;
    case cudaDevAttrMaxPitch: v = 0x7fffffff; break;
    case cudaDevAttrMaxRegistersPerBlock: v = p.regsPerBlock; break;
    case cudaDevAttrClockRate: v = 1410000; break;
    case cudaDevAttrTextureAlignment: v = (int)p.textureAlignment; break;
    case cudaDevAttrGpuOverlap: v = 1; break;
    case cudaDevAttrMultiProcessorCount: v = p.multiProcessorCount; break;
    case cudaDevAttrCanMapHostMemory: v = 1; break;
    case cudaDevAttrComputeMode: v = cudaComputeModeDefault; break;
    case cudaDevAttrConcurrentKernels: v = 1; break;
    case cudaDevAttrPciBusId: v = p.pciBusID; break;
    case cudaDevAttrPciDeviceId: v = p.pciDeviceID; break;
    case cudaDevAttrPciDomainId: v = p.pciDomainID; break;
    case cudaDevAttrMemoryClockRate: v = 1215000; break;
    case cudaDevAttrGlobalMemoryBusWidth: v = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: v = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: v = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrAsyncEngineCount: v = p.asyncEngineCount; break;
    case cudaDevAttrUnifiedAddressing: v = 1; break;
    case cudaDevAttrComputeCapabilityMajor: v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: v = p.minor; break;
    case cudaDevAttrStreamPrioritiesSupported: v = 1; break;
    case cudaDevAttrGlobalL1CacheSupported: v = 1; break;
    case cudaDevAttrLocalL1CacheSupported: v = 1; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: v = p.regsPerMultiprocessor; break;
    case cudaDevAttrManagedMemory: v = 1; break;
    case cudaDevAttrHostNativeAtomicSupported: v = 1; break;
    case cudaDevAttrSingleToDoublePrecisionPerfRatio: v = 2; break;
    case cudaDevAttrComputePreemptionSupported: v = 1; break;
    case cudaDevAttrCanUseHostPointerForRegisteredMem: v = 1; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrHostRegisterSupported: v = 1; break;
    case cudaDevAttrDirectManagedMemAccessFromHost: v = 1; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: v = p.maxBlocksPerMultiProcessor; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: v = (int)p.reservedSharedMemPerBlock; break;
    case cudaDevAttrNumaId: v = -1; break;
    case cudaDevAttrHostNumaId: v = -1; break;
    default: v = 0; break;         /* a feature the emulator does not have */
    }
    *value = v;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    cudaError_t err = simdev_enter("cudaDeviceGetStreamPriorityRange", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    simdev_init();
    if (!simdev_valid_device(device))
        return simdev_return(cudaErrorInvalidDevice);
    if (!pciBusId || len <= 0)
        return simdev_return(cudaErrorInvalidValue);
    snprintf(pciBusId, (size_t)len, "00000000:%02X:00.0", 0x10 + simdev_config.physical[device]);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId)
{
    simdev_init();
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    if (!device || !pciBusId ||
        (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4 &&
         sscanf(pciBusId, "%x:%x.%x", &bus, &dev, &fn) != 3))
        return simdev_return(cudaErrorInvalidValue);
    for (int i = 0; i < simdev_config.ndevices; i++)
        if ((unsigned)(0x10 + simdev_config.physical[i]) == bus && domain == 0 && dev == 0) {
            *device = i;
            return cudaSuccess;
        }
    return simdev_return(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    simdev_init();
    if (!canAccessPeer)
        return simdev_return(cudaErrorInvalidValue);
    if (!simdev_valid_device(device) || !simdev_valid_device(peerDevice))
        return simdev_return(cudaErrorInvalidDevice);
    /* All emulated devices share the host's memory. */
    *canAccessPeer = device != peerDevice;
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    cudaError_t err = simdev_enter("cudaDeviceEnablePeerAccess", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!simdev_valid_device(peerDevice) || flags != 0)
        return simdev_return(peerDevice == tls_device ? cudaErrorInvalidDevice : cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int peerDevice)
{
    cudaError_t err = simdev_enter("cudaDeviceDisablePeerAccess", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!simdev_valid_device(peerDevice))
        return simdev_return(cudaErrorInvalidDevice);
    return cudaSuccess;
}

cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
    cudaError_t err = simdev_enter("cudaDeviceSetLimit", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if ((int)limit < 0 || (int)limit >= 16)
        return simdev_return(cudaErrorUnsupportedLimit);
    pthread_mutex_lock(&simdev_lock);
    simdev_devices[tls_device].limits[limit] = value;
    pthread_mutex_unlock(&simdev_lock);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit)
{
    cudaError_t err = simdev_enter("cudaDeviceGetLimit", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    if (!pValue)
        return simdev_return(cudaErrorInvalidValue);
    if ((int)limit < 0 || (int)limit >= 16)
        return simdev_return(cudaErrorUnsupportedLimit);
    static const size_t defaults[16] = { 1024, 1 << 20, 8 << 20, 2, 2048, 0, 32 };
    pthread_mutex_lock(&simdev_lock);
    size_t v = simdev_devices[tls_device].limits[limit];
    pthread_mutex_unlock(&simdev_lock);
    *pValue = v ? v : defaults[limit];
    return cudaSuccess;
}

cudaError_t cudaDeviceSetCacheConfig(enum cudaFuncCache cacheConfig)
{
    (void)cacheConfig;
    return simdev_return(simdev_enter("cudaDeviceSetCacheConfig", NULL));
}

cudaError_t cudaDeviceGetCacheConfig(enum cudaFuncCache *pCacheConfig)
{
    cudaError_t err = simdev_enter("cudaDeviceGetCacheConfig", NULL);
    if (err == cudaSuccess && pCacheConfig)
        *pCacheConfig = cudaFuncCachePreferNone;
    return simdev_return(err);
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t err = simdev_enter("cudaDeviceSynchronize", NULL);
    if (err != cudaSuccess)
        return simdev_return(err);
    return simdev_return(simdev_device_synchronize(tls_device));
}

cudaError_t cudaDeviceReset(void)
{
    simdev_init();
    if (simdev_config.ndevices == 0)
        return simdev_return(cudaErrorNoDevice);
    int device = tls_device;
    /* Reset works on a failed device too: it is how a program gives up its
     * work.  The sticky error itself stays, as on a GPU, where only a new
     * process clears it. */
    simdev_device_reset_streams(device);
    simdev_event_reset_device(device);
    simdev_mem_reset_device(device);
    pthread_mutex_lock(&simdev_lock);
    cudaError_t fatal = simdev_devices[device].fatal;
    simdev_devices[device].flags = 0;
    memset(simdev_devices[device].limits, 0, sizeof simdev_devices[device].limits);
    pthread_mutex_unlock(&simdev_lock);
    return simdev_return(fatal);
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return simdev_return(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return simdev_return(cudaErrorInvalidValue);
    *driverVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaProfilerStart(void)
{
    /* There is no profiler to start; the call is legal and does nothing. */
    return simdev_return(simdev_enter("cudaProfilerStart", NULL));
}

cudaError_t cudaProfilerStop(void)
{
    return simdev_return(simdev_enter("cudaProfilerStop", NULL));
}
