/* nccl_streams.c -- which streams are NCCL streams.
 *
 * Paper §3.1: "We first identify the communication / NCCL stream from the
 * intercepted NCCL APIs."  Every intercepted collective or point-to-point
 * call passes its stream to nccl_stream_note() (interpose.h), which is one
 * lock-free scan of a short array (a job has a handful of NCCL streams).  A
 * new stream is appended under a mutex; cudaStreamDestroy removes it, so a
 * destroyed NCCL stream whose handle is reused for a compute stream is not
 * mistaken for one.  Stream 0 is stored as cudaStreamLegacy (NCCL hands 0 to
 * the driver, where it means the legacy default stream).  The set itself is a
 * handle set (handle_set.c); hooks.h calls handle_set_remove on
 * cudaStreamDestroy. */

#include "interpose.h"

#define NCCL_STREAMS_MAX 64

static _Atomic(uintptr_t) stream_items[NCCL_STREAMS_MAX];
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
struct handle_set nccl_streams = HANDLE_SET(stream_items, &streams_lock, "NCCL streams");
