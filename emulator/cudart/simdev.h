/* simdev.h -- internal declarations shared by the files of the emulated
 * CUDA runtime (libcudart.so.13 of the jitckpt CPU device emulator).
 *
 * The emulator compiles against the real CUDA 13 headers, so every public
 * signature, struct and enum here is NVIDIA's.  Everything declared in this
 * file is internal: names start with simdev_ and the linker version script
 * keeps them out of the dynamic symbol table.
 *
 * Locking model, in one paragraph: one global mutex (simdev_lock) guards
 * devices, streams and events; one condition variable (simdev_progress) is
 * broadcast whenever any stream finishes an operation, an event completes or
 * a device changes state, and every blocking wait in the runtime re-checks
 * its predicate on it.  The allocation table has its own mutex (memory.c),
 * and so does the kernel registry (registry.c).  Work on a stream runs on that
 * stream's worker thread without holding any lock. */

#ifndef JITCKPT_SIMDEV_H
#define JITCKPT_SIMDEV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cuda_runtime_api.h>

#define SIMDEV_MAX_DEVICES 16
#define SIMDEV_MAX_PARAMS 256

/* ---- log.c ------------------------------------------------------------- */
#include <stdarg.h>
void simdev_vlog(const char *fmt, va_list ap);
void simdev_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void simdev_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void simdev_fatal_config(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
extern int simdev_trace_enabled;

/* ---- env.c ------------------------------------------------------------- */
struct simdev_config {
    int ndevices;                        /* devices visible to this process */
    int physical[SIMDEV_MAX_DEVICES];    /* emulated id behind each ordinal */
    size_t memory_bytes;                 /* per device */
    int process_rank;                    /* RANK, or 0 */
};
extern struct simdev_config simdev_config;
void simdev_config_load(void);
size_t simdev_parse_size(const char *text, int *ok);

/* ---- init / errors (errors.c) ------------------------------------------ */
void simdev_init(void);
const char *simdev_error_name(cudaError_t err);
const char *simdev_error_string(cudaError_t err);

/* Faults matched at the start of an API call that must act on a stream. */
enum simdev_fault_kind {
    SIMDEV_FAULT_NONE = 0,
    SIMDEV_FAULT_HANG,
    SIMDEV_FAULT_STICKY,
    SIMDEV_FAULT_LOST,
    SIMDEV_FAULT_SLOW,
};
struct simdev_fault_hit {
    enum simdev_fault_kind kind;
    unsigned delay_ms;
};

/* Starts an API call: initialises the emulator, counts the call for fault
 * injection and returns the current device's sticky error, if any.  With
 * hit == NULL a hang or slow fault is served on the calling thread; otherwise
 * it is handed back so that the caller puts it on the stream. */
cudaError_t simdev_enter(const char *op, struct simdev_fault_hit *hit);
/* Like simdev_enter, for calls addressed to an explicit device. */
cudaError_t simdev_enter_device(const char *op, int device, struct simdev_fault_hit *hit);
/* For launches: a fault may name the API (cudaLaunchKernel) or the kernel. */
cudaError_t simdev_enter_kernel(const char *kernel_name, struct simdev_fault_hit *hit);
/* Records err as the thread's last error (unless cudaSuccess/NotReady). */
cudaError_t simdev_return(cudaError_t err);
/* Puts a device into a sticky (IllegalAddress) or lost state. */
void simdev_raise(int device, cudaError_t err, const char *why);
/* Serve a hang or slow fault on the calling thread. */
void simdev_host_fault(const struct simdev_fault_hit *hit, const char *op);

/* ---- fault.c ----------------------------------------------------------- */
void simdev_fault_load(void);
int simdev_fault_active(void);
/* Counts one call of `op` by `rank` and reports the fault it triggers.  The
 * kernel name, when given, is matched as an alternative op name. */
void simdev_fault_match(const char *op, const char *alt_op, int rank,
                        struct simdev_fault_hit *hit);

/* ---- devices (device.c) ------------------------------------------------ */
struct simdev_stream;

struct simdev_device {
    cudaError_t fatal;          /* sticky or lost error; cudaSuccess if healthy */
    char fatal_why[200];
    struct simdev_stream *legacy;    /* legacy default stream, created lazily */
    struct simdev_stream *streams;   /* every stream whose worker is alive */
    uint64_t epoch;             /* bumped by cudaDeviceReset */
    unsigned flags;             /* cudaSetDeviceFlags */
    size_t limits[16];          /* cudaDeviceSetLimit, indexed by cudaLimit */
    int initialised;
};

extern struct simdev_device simdev_devices[SIMDEV_MAX_DEVICES];
extern pthread_mutex_t simdev_lock;
extern pthread_cond_t simdev_progress;

int simdev_current_device(void);
void simdev_set_thread_device(int device);   /* stream workers: their stream's device */
int simdev_valid_device(int device);

/* ---- memory.c ---------------------------------------------------------- */
enum simdev_mem_kind {
    SIMDEV_MEM_DEVICE = 1,      /* cudaMalloc, cudaMallocPitch, cudaMallocAsync */
    SIMDEV_MEM_HOST,            /* cudaMallocHost, cudaHostAlloc (pinned) */
    SIMDEV_MEM_REGISTERED,      /* cudaHostRegister */
    SIMDEV_MEM_MANAGED,         /* cudaMallocManaged, __managed__ variables */
    SIMDEV_MEM_SYMBOL,          /* storage of __device__ / __constant__ variables */
};

struct simdev_alloc {
    uintptr_t base;
    size_t size;
    enum simdev_mem_kind kind;
    int device;
    unsigned flags;
};

cudaError_t simdev_mem_alloc(enum simdev_mem_kind kind, int device, size_t size,
                             unsigned flags, void **out);
cudaError_t simdev_mem_register(enum simdev_mem_kind kind, int device, void *base,
                                size_t size, unsigned flags);
/* Removes the allocation starting at ptr if its kind is in kinds_mask
 * (bit 1<<kind); frees the memory unless it was registered. */
cudaError_t simdev_mem_release(void *ptr, unsigned kinds_mask);
int simdev_mem_find(const void *ptr, struct simdev_alloc *out);
/* cudaSuccess if [ptr, ptr+n) lies inside one allocation the device can
 * access (device, pinned, registered, managed or symbol memory). */
cudaError_t simdev_mem_check_device_range(const void *ptr, size_t n);
size_t simdev_mem_used(int device);
void simdev_mem_reset_device(int device);

/* ---- streams (stream.c) ------------------------------------------------ */
enum simdev_op_kind {
    SIMDEV_OP_CALL,             /* run fn(arg) */
    SIMDEV_OP_WAIT_STREAM,      /* wait until another stream completed a sequence number */
    SIMDEV_OP_WAIT_EVENT,       /* wait until an event reached a record generation */
    SIMDEV_OP_RECORD_EVENT,     /* complete an event record */
    SIMDEV_OP_HANG,             /* fault injection: never complete */
    SIMDEV_OP_DELAY,            /* fault injection: complete after delay_ms */
};

struct simdev_event;

struct simdev_op {
    struct simdev_op *next;
    enum simdev_op_kind kind;
    const char *name;
    void (*fn)(void *arg);
    void *arg;
    void (*release)(void *arg);
    struct simdev_stream *wait_stream;
    uint64_t wait_seq;
    struct simdev_event *event;
    uint64_t event_gen;
    unsigned delay_ms;
};

enum simdev_stream_role {
    SIMDEV_STREAM_USER,
    SIMDEV_STREAM_LEGACY,
    SIMDEV_STREAM_PER_THREAD,
};

struct simdev_stream {
    struct simdev_stream *next_on_device;
    struct simdev_stream *next_handle;     /* registry of user-visible handles */
    enum simdev_stream_role role;
    int device;
    unsigned flags;
    int priority;
    unsigned long long id;
    uint64_t epoch;                        /* device epoch at creation */
    struct simdev_op *head, *tail;
    uint64_t enqueued, completed;
    uint64_t legacy_waited;                /* legacy sequence already waited for */
    int refs;
    int destroyed;                         /* no handle any more; exit when drained */
    int cancelled;                         /* device reset: drop work */
    int worker_alive;
    pthread_t thread;
    pthread_cond_t wake;
    struct simdev_capture *capture;        /* graph capture this stream is part of (graph.c) */
};

struct simdev_op *simdev_op_new(enum simdev_op_kind kind, const char *name);
/* Drops an op's references and frees it (running its release function, for
 * which it drops and retakes simdev_lock). */
void simdev_op_discard_locked(struct simdev_op *op);
/* Resolves a handle (0, cudaStreamLegacy, cudaStreamPerThread or a created
 * stream).  Caller holds simdev_lock. */
cudaError_t simdev_stream_resolve_locked(cudaStream_t handle, int ptds,
                                         struct simdev_stream **out);
/* Appends op to the stream named by handle, applying the legacy default
 * stream rules and a fault hit; returns the op's sequence number in *seq and a
 * referenced stream in *stream_out (if not NULL; drop with simdev_stream_unref). */
cudaError_t simdev_stream_submit(cudaStream_t handle, int ptds, struct simdev_op *op,
                                 const struct simdev_fault_hit *hit,
                                 struct simdev_stream **stream_out, uint64_t *seq);
/* The same with simdev_lock held.  On failure the op is discarded, which may
 * drop and retake the lock to run its release function. */
cudaError_t simdev_stream_submit_locked(cudaStream_t handle, int ptds, struct simdev_op *op,
                                        const struct simdev_fault_hit *hit,
                                        struct simdev_stream **stream_out, uint64_t *seq);
/* Blocks until the stream has completed sequence number seq, or its device
 * failed.  Does not hold simdev_lock on entry. */
cudaError_t simdev_stream_wait(struct simdev_stream *s, uint64_t seq);
void simdev_stream_unref(struct simdev_stream *s);
void simdev_stream_unref_locked(struct simdev_stream *s);
cudaError_t simdev_device_synchronize(int device);
void simdev_device_reset_streams(int device);
/* Submits fn(arg) with the stream rules; convenience over simdev_stream_submit. */
cudaError_t simdev_submit_call(cudaStream_t handle, int ptds, const char *name,
                               void (*fn)(void *), void *arg, void (*release)(void *),
                               const struct simdev_fault_hit *hit,
                               struct simdev_stream **stream_out, uint64_t *seq);
/* Makes stream `waiter` wait for everything submitted so far to `waitee`. */
cudaError_t simdev_stream_join(cudaStream_t waiter, cudaStream_t waitee, int ptds);
/* True inside a worker whose current op should give up (device reset or failed). */
int simdev_worker_should_stop(void);
extern __thread struct simdev_stream *simdev_tls_worker;

/* Implementations shared by the plain and the per-thread-default-stream
 * (_ptds/_ptsz) entry points. */
cudaError_t simdev_stream_synchronize(cudaStream_t stream, int ptds);
cudaError_t simdev_stream_query(cudaStream_t stream, int ptds);
cudaError_t simdev_stream_get_flags(cudaStream_t stream, int ptds, unsigned int *flags);
cudaError_t simdev_stream_get_priority(cudaStream_t stream, int ptds, int *priority);
cudaError_t simdev_stream_get_device(cudaStream_t stream, int ptds, int *device);
cudaError_t simdev_stream_get_id(cudaStream_t stream, int ptds, unsigned long long *id);
cudaError_t simdev_stream_is_capturing(cudaStream_t stream, int ptds,
                                       enum cudaStreamCaptureStatus *status);

/* ---- events (event.c) -------------------------------------------------- */
struct simdev_event {
    struct simdev_event *next_handle;
    int device;
    unsigned flags;
    uint64_t recorded;          /* generation of the latest record */
    uint64_t done;              /* generation completed on the device */
    struct timespec when;       /* time of the latest completed record */
    int refs;
    int destroyed;
    unsigned long long captured_id;  /* last recorded in this capture sequence (graph.c); 0 if not */
};

void simdev_event_complete_locked(struct simdev_event *e, uint64_t gen);
void simdev_event_unref_locked(struct simdev_event *e);
void simdev_event_reset_device(int device);
cudaError_t simdev_event_record(cudaEvent_t event, cudaStream_t stream, int ptds,
                                unsigned flags);
cudaError_t simdev_stream_wait_event(cudaStream_t stream, cudaEvent_t event, int ptds,
                                     unsigned flags);

/* ---- stream capture and graphs (graph.c); callers hold simdev_lock ------ */
struct simdev_capture;
/* Records op into the graph that s captures instead of running it.
 * wants_wait: the caller would wait for the op (a synchronous call), which a
 * capture forbids. */
cudaError_t simdev_capture_add_locked(struct simdev_stream *s, struct simdev_op *op,
                                      const struct simdev_fault_hit *hit, int wants_wait);
/* Stream s waits for an event recorded in capture `id`: s joins that capture. */
cudaError_t simdev_capture_join_locked(struct simdev_stream *s, unsigned long long id);
void simdev_capture_invalidate_locked(struct simdev_capture *c);
void simdev_capture_invalidate_id_locked(unsigned long long id);
unsigned long long simdev_capture_id_locked(const struct simdev_capture *c);
cudaError_t simdev_stream_begin_capture(cudaStream_t stream, enum cudaStreamCaptureMode mode,
                                        int ptds);
cudaError_t simdev_stream_end_capture(cudaStream_t stream, cudaGraph_t *pGraph, int ptds);
cudaError_t simdev_stream_capture_info(cudaStream_t stream, int ptds,
                                       enum cudaStreamCaptureStatus *status,
                                       unsigned long long *id, cudaGraph_t *graph,
                                       const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                       size_t *ndeps, const char *op);
cudaError_t simdev_graph_launch(cudaGraphExec_t exec, cudaStream_t stream, int ptds);

/* ---- copies (copy.c) --------------------------------------------------- */
cudaError_t simdev_memcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                          cudaStream_t stream, int ptds, int async, const char *op);
cudaError_t simdev_memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t height, enum cudaMemcpyKind kind,
                            cudaStream_t stream, int ptds, int async, const char *op);
cudaError_t simdev_memset(void *dst, int value, size_t n, cudaStream_t stream, int ptds,
                          int async, const char *op);
cudaError_t simdev_memset2d(void *dst, size_t pitch, int value, size_t width, size_t height,
                            cudaStream_t stream, int ptds, int async, const char *op);
cudaError_t simdev_memcpy_symbol(const void *symbol, void *host, size_t count, size_t offset,
                                 enum cudaMemcpyKind kind, int to_symbol, cudaStream_t stream,
                                 int ptds, int async, const char *op);

/* ---- kernels (registry.c, fatbin.c, twin.c, launch.c) ------------------ */
typedef void (*simdev_twin_fn)(dim3 grid, dim3 block, size_t shared_mem, void **args);

struct simdev_module;

struct simdev_param_layout {
    int known;                  /* 0: the fatbinary said nothing about this kernel */
    int nparams;
    size_t total;               /* bytes of the parameter buffer */
    uint16_t offset[SIMDEV_MAX_PARAMS];
    uint16_t size[SIMDEV_MAX_PARAMS];
};

struct simdev_kernel {
    struct simdev_kernel *next;
    const void *host_fun;       /* the host stub nvcc registered */
    const char *name;           /* the registered device (mangled) name */
    struct simdev_module *module;
    int resolved;               /* twin and layout looked up */
    simdev_twin_fn twin;
    cudaError_t resolve_error;
    struct simdev_param_layout layout;
    int max_dynamic_shared;
};

struct simdev_var {
    struct simdev_var *next;
    const void *host_var;       /* the host shadow nvcc registered */
    const char *name;
    size_t size;
    int constant;
    int managed;
    void **managed_slot;        /* __managed__: where the host reads the pointer */
    void *storage;              /* emulated device storage */
    struct simdev_module *module;
};

struct simdev_module {
    struct simdev_module *next;
    const void *wrapper;        /* __fatBinC_Wrapper_t, or the library's code copy */
    int is_library;             /* loaded by cudaLibraryLoadData */
    int twin;                   /* registered by a JITCKPT_SIMDEV_KERNELS library as it loaded (twin.c) */
    int unregistered;
    struct simdev_kernel *library_kernels;   /* kernels without host stubs */
};

struct simdev_kernel *simdev_kernel_by_host_fun(const void *host_fun);
struct simdev_kernel *simdev_kernel_by_handle(const void *handle);
/* Looks up twin and parameter layout once; returns the error a launch gets. */
cudaError_t simdev_kernel_prepare(struct simdev_kernel *k);
cudaError_t simdev_var_lookup(const void *symbol, struct simdev_var **out);
/* 1 while twin.c loads the JITCKPT_SIMDEV_KERNELS libraries: modules they register are twins' copies */
extern int simdev_loading_twins;
/* cudaLibrary* support (library.c). */
struct simdev_module *simdev_library_new(const void *code);
struct simdev_module *simdev_library_check(const void *handle);
void simdev_library_unload(struct simdev_module *m);
/* The kernel `name` of a library, created on first use (NULL if absent). */
struct simdev_kernel *simdev_library_kernel(struct simdev_module *m, const char *name);

/* fatbin.c: what the device images in a fatbinary say about a kernel. */
int simdev_fatbin_param_layout(const void *wrapper, const char *kernel,
                               struct simdev_param_layout *out);
/* Copies the initial value of a device variable into dst (size bytes);
 * returns 1 if the image holds one, 0 if the variable starts zeroed. */
int simdev_fatbin_var_init(const void *wrapper, const char *var, void *dst, size_t size);

/* Size in bytes of a raw fatbinary, cubin or PTX text (for copying it). */
size_t simdev_code_size(const void *code);
/* Drops the parse of a library that is being unloaded. */
void simdev_fatbin_forget(const void *wrapper);
int simdev_fatbin_kernels(const void *wrapper, void (*fn)(const char *name, void *ctx), void *ctx);

/* decompress.c */
int simdev_decompress(int method, const void *src, size_t src_len, void *dst, size_t dst_len,
                      size_t *out_len, char *why, size_t why_len);
#define SIMDEV_COMPRESS_LZ4 1
#define SIMDEV_COMPRESS_ZSTD 2

/* twin.c */
simdev_twin_fn simdev_twin_lookup(const char *kernel_name, const void *host_fun,
                                  char *searched, size_t searched_len);

/* elfsym.c: address of a symbol in the static symbol table of a loaded object */
void *simdev_elf_symbol(const char *path, uintptr_t load_bias, const char *name);

cudaError_t simdev_launch(struct simdev_kernel *k, dim3 grid, dim3 block, void **args,
                          size_t shared_mem, cudaStream_t stream, int ptds);
cudaError_t simdev_launch_host_func(cudaStream_t stream, cudaHostFn_t fn, void *user_data,
                                    int ptds, const char *op);
cudaError_t simdev_stream_add_callback(cudaStream_t stream, cudaStreamCallback_t cb,
                                       void *user_data, unsigned flags, int ptds);
cudaError_t simdev_launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args,
                             int ptds);

/* memory.c, stream-ordered allocation */
cudaError_t simdev_malloc_async(void **ptr, size_t size, cudaStream_t stream, int ptds);
cudaError_t simdev_free_async(void *ptr, cudaStream_t stream, int ptds);

#endif /* JITCKPT_SIMDEV_H */
