/* ptds.c -- the per-thread default stream (cudaStreamPerThread, and stream 0
 * of a program built with --default-stream per-thread, whose calls arrive
 * through the _ptsz/_ptds twins).
 *
 * One proxy thread runs every call, so cudaStreamPerThread in the proxy would
 * be a single stream for all of the program's threads: their work would be
 * ordered behind each other's, and a thread waiting for another's work (a host
 * function that waits for a kernel of another thread) could wait for ever.
 * Instead each thread of the program gets a stream of its own in the proxy, per
 * device, created at its first use (cudaStreamCreate: a blocking stream, which
 * synchronises with the legacy default stream as the per-thread stream does);
 * the stubs pass that stream where the program passed cudaStreamPerThread.  It
 * is tracked like any stream (a restarted proxy re-creates it), and made again
 * after a cudaDeviceReset. */

#include "remote.h"

#define MAX_DEVICES 16

static unsigned reset_generation;              /* bumped by cudaDeviceReset (restart.c) */
static __thread cudaStream_t mine[MAX_DEVICES];
static __thread unsigned mine_generation[MAX_DEVICES];

void remote_ptds_reset(void)
{
    __atomic_add_fetch(&reset_generation, 1, __ATOMIC_SEQ_CST);
}

cudaStream_t remote_stream(cudaStream_t stream)
{
    if (stream != cudaStreamPerThread)
        return stream;
    int device = remote_current_device();
    if (device < 0 || device >= MAX_DEVICES)
        return stream;                         /* the proxy thread's own per-thread stream */
    unsigned generation = __atomic_load_n(&reset_generation, __ATOMIC_SEQ_CST);
    if (mine[device] && mine_generation[device] == generation)
        return mine[device];
    cudaStream_t created = NULL;
    if (cudaStreamCreate(&created) != cudaSuccess)
        return stream;
    mine[device] = created;
    mine_generation[device] = generation;
    return created;
}
