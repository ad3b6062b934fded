/* track.h -- what the worker keeps so that a restarted device proxy can be
 * given back the same state (restart.c; proxy_server/README.md, "Device
 * pointers" and "The call log, replay and recovery").
 *
 * The generated stubs of the functions in gen_remote.py's TRACKED call
 * remote_track_<name>(their arguments) after a successful call, under the
 * call lock; the hand-written registration entry points (special.c) call the
 * remote_track_reg_* functions. */
#ifndef JITCKPT_REMOTE_TRACK_H
#define JITCKPT_REMOTE_TRACK_H

#include "remote.h"         /* first: it defines _GNU_SOURCE */

#include <sys/types.h>

void remote_track_cudaSetDevice(int device);
void remote_track_cudaMalloc(void **devPtr, size_t size);
void remote_track_cudaFree(void *devPtr);
void remote_track_cudaStreamCreate(cudaStream_t *pStream);
void remote_track_cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
void remote_track_cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority);
void remote_track_cudaStreamDestroy(cudaStream_t stream);
void remote_track_cudaEventCreate(cudaEvent_t *event);
void remote_track_cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
void remote_track_cudaEventDestroy(cudaEvent_t event);
void remote_track_ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
void remote_track_ncclCommDestroy(ncclComm_t comm);
void remote_track_ncclCommAbort(ncclComm_t comm);
void remote_track_cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
void remote_track_cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
void remote_track_cudaFreeAsync(void *devPtr, cudaStream_t hStream);
void remote_track_ncclMemAlloc(void **ptr, size_t size);
void remote_track_ncclMemFree(void *ptr);
void remote_track_cudaDeviceReset(void);
void remote_track_cudaLibraryUnload(cudaLibrary_t library);
/* graphs.c */
void remote_track_cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
void remote_track_cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
void remote_track_cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags);
void remote_track_cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                unsigned long long flags);
void remote_track_cudaGraphExecDestroy(cudaGraphExec_t graphExec);
void remote_track_cudaGraphDestroy(cudaGraph_t graph);
void remote_track_cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library, const char *name);
void remote_track_cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr);
void remote_track_ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                         ncclConfig_t *config);
void remote_track_setting(struct rcall *c);          /* a setting's request, sent again to a new proxy */

/* registrations, in the order they were made (special.c) */
void remote_track_reg_fatbin(void **module, const void *image, size_t n);
void remote_track_reg_function(void **module, const char *hostFun, const char *deviceFun, const char *deviceName,
                               int thread_limit);
void remote_track_reg_var(void **module, const char *hostVar, const char *deviceAddress, const char *deviceName,
                          int ext, size_t size, int constant, int global);
void remote_track_reg_end(void **module);
void remote_track_reg_init(void **module);
void remote_track_reg_kernel(cudaKernel_t kernel, const void *hostFun);
void remote_track_reg_unregister(void **module);

/* client.c calls these */
void remote_restart_connected(pid_t proxy_pid);    /* after a connection (the hello's proxy pid) */
void remote_restart_proxy_lost(void);              /* the proxy is gone (under the call lock); may not return */

/* client.c provides these to restart.c (under the call lock) */
int remote_reconnect(void);                        /* drop the connection, connect to the proxy now at the socket */
void remote_begin_locked(struct rcall *c, unsigned fn);

#endif
