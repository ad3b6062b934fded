/* internal.h -- declarations shared by the files of the emulated cuDNN 9
 * (libcudnn.so.9 of the jitckpt CPU device emulator).
 *
 * Like the emulated cuBLAS, it reaches the emulated device only through the
 * private interface of the emulated libcudart (jitckpt_simdev.h) and imports
 * no cuda* symbol (the real libcudnn.so.9 imports none either).
 *
 * Two APIs are implemented:
 *   - the backend ("graph") API that cudnn_frontend, and with it PyTorch's
 *     convolutions, use: descriptors (backend.c), and cudnnBackendExecute,
 *     which queues one convolution job on the handle's stream (execute.c,
 *     conv.c);
 *   - the legacy tensor descriptors and batch normalization that PyTorch's
 *     BatchNorm uses (tensor.c, batchnorm.c).
 * Every computation is stream work with a fixed summation order
 * (emulator/README.md, "cuDNN"), so results are bit-reproducible. */

#ifndef JITCKPT_SIMDEV_CUDNN_INTERNAL_H
#define JITCKPT_SIMDEV_CUDNN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

#include "jitckpt_simdev.h"

#define DNN_MAX_DIMS CUDNN_DIM_MAX      /* 8 */
#define DNN_MAX_SPATIAL 3               /* convolutions: 1 to 3 spatial dimensions */

/* ---- status.c ------------------------------------------------------------ */

/* Logs "cuDNN <api>: <message> (<status name>)", keeps the message for
 * cudnnGetLastErrorString (per thread) and returns `status`. */
cudnnStatus_t dnn_report(cudnnStatus_t status, const char *api, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- handle.c -------------------------------------------------------------- */

/* What a call needs from a handle, copied under the lock. */
struct dnn_handle_state {
    int device;
    cudaStream_t stream;
};

/* CUDNN_STATUS_SUCCESS and the handle's state if `h` is a live handle, else
 * CUDNN_STATUS_BAD_PARAM (NULL, never created or destroyed). */
cudnnStatus_t dnn_handle_state(cudnnHandle_t h, struct dnn_handle_state *out);

/* ---- data types -------------------------------------------------------------- */

enum dnn_type { DNN_F32, DNN_F64 };

/* Bytes per element of a cuDNN data type, or 0 if the emulator does not know it. */
size_t dnn_type_size(int32_t dtype);

/* The [lowest, highest] element offsets (in elements) that `nd` dims and
 * strides reach; 0 on success, -1 on overflow. */
int dnn_extent(int nd, const int64_t *dims, const int64_t *strides, int64_t *lo, int64_t *hi);

/* CUDNN_STATUS_SUCCESS if the tensor (dims, strides, element size) at `p` lies
 * inside one allocation of the emulated device, else BAD_PARAM with a message
 * naming `what`. */
cudnnStatus_t dnn_check_tensor(const char *api, const char *what, const void *p, int nd,
                               const int64_t *dims, const int64_t *strides, size_t es);

/* ---- tensor.c: legacy tensor descriptors ------------------------------------------ */

struct legacy_tensor {
    int32_t dtype;                  /* cudnnDataType_t */
    int nd;
    int64_t dims[DNN_MAX_DIMS], strides[DNN_MAX_DIMS];
    int set;                        /* nonzero once a Set function succeeded */
};

/* cudnnTensorDescriptor_t points to one of these. */
struct cudnnTensorStruct {
    uint64_t magic;
    struct cudnnTensorStruct *next;
    struct legacy_tensor t;
};

/* Nonzero, and a copy of the descriptor in *out (if not NULL), if `t` is a
 * live tensor descriptor. */
int dnn_legacy_tensor(cudnnTensorDescriptor_t t, struct legacy_tensor *out);

/* ---- backend.c: the descriptors ------------------------------------------------ */

struct dnn_tensor {
    int64_t uid;
    int32_t dtype;                  /* cudnnDataType_t */
    int nd, nd_strides;
    int64_t dims[DNN_MAX_DIMS], strides[DNN_MAX_DIMS];
    int64_t alignment;
    int is_virtual, is_by_value;
    int64_t vector_count, vectorized_dim;
    int32_t reordering;             /* cudnnBackendTensorReordering_t */
    unsigned set;                   /* TENSOR_SET_* bits */
};

struct dnn_conv {
    int32_t comp_type;              /* cudnnDataType_t */
    int32_t mode;                   /* cudnnConvolutionMode_t */
    int64_t spatial;
    int n_dil, n_stride, n_pre, n_post;
    int64_t dil[DNN_MAX_DIMS], stride[DNN_MAX_DIMS], pre[DNN_MAX_DIMS], post[DNN_MAX_DIMS];
    unsigned set;
};

enum dnn_conv_kind { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER };

/* A convolution operation.  x, w, y are the roles of the forward
 * convolution: for backward data x is dx, for backward filter w is dw, and y
 * is dy for both. */
struct dnn_op {
    int kind;                       /* enum dnn_conv_kind */
    double alpha, beta;
    int32_t alpha_type, beta_type;  /* CUDNN_TYPE_FLOAT or CUDNN_TYPE_DOUBLE, as set */
    struct dnn_conv conv;
    struct dnn_tensor x, w, y;
    void *ref_conv, *ref_x, *ref_w, *ref_y;     /* as set; copied at finalize */
    unsigned set;
};

struct dnn_graph {
    cudnnHandle_t handle;
    int nops;
    struct dnn_op op;               /* the one operation */
    void *ref_ops[16];              /* as set; copied at finalize */
    int dynamic_shape, override_shape;
    int32_t mode;                   /* cudnnBackendOperationGraphMode_t */
    unsigned set;
};

struct dnn_engine {
    struct dnn_graph graph;
    int64_t index;
    int32_t sm_count, shared_memory_limit;
    void *ref_graph;
    unsigned set;
};

struct dnn_knob_choice {
    int32_t type;                   /* cudnnBackendKnobType_t */
    int64_t value;
    unsigned set;
};

struct dnn_cfg {
    struct dnn_engine engine;
    int nknobs;
    struct dnn_knob_choice knobs[CUDNN_KNOB_TYPE_COUNTS];
    void *ref_engine;
    unsigned set;
};

struct dnn_heur {
    struct dnn_graph graph;
    int32_t mode;                   /* cudnnBackendHeurMode_t */
    int32_t sm_count, shared_memory_limit;
    void *ref_graph;
    unsigned set;
};

struct dnn_plan {
    cudnnHandle_t handle;
    struct dnn_cfg cfg;
    int64_t workspace;
    int32_t graph_retention;        /* cudnnCudaGraphRetention_t, recorded */
    void *ref_cfg;
    unsigned set;
};

struct dnn_variant {
    int n_uids, n_ptrs;
    int64_t *uids;
    void **ptrs;
    void *workspace;
    unsigned set;
};

struct dnn_layout_info {
    int64_t uid;
    int32_t type;                   /* cudnnBackendLayoutType_t */
};

/* Every backend descriptor: cudnnBackendDescriptor_t points to one. */
struct dnn_desc {
    uint64_t magic;
    int32_t type;                   /* cudnnBackendDescriptorType_t */
    int finalized;
    union {
        struct dnn_tensor tensor;
        struct dnn_conv conv;
        struct dnn_op op;
        struct dnn_graph graph;
        struct dnn_engine engine;
        struct dnn_cfg cfg;
        struct dnn_heur heur;
        struct dnn_plan plan;
        struct dnn_variant variant;
        struct dnn_knob_choice knob;
        struct dnn_layout_info layout;
    } u;
};

/* The live descriptor behind `d` (registered by cudnnBackendCreateDescriptor
 * and not destroyed), or NULL. */
struct dnn_desc *dnn_desc_lookup(cudnnBackendDescriptor_t d);

/* Whether the emulator's one engine computes this graph; if not, *why says
 * why and the status is the one to report (NOT_SUPPORTED and its kin). */
cudnnStatus_t dnn_graph_supported(const struct dnn_graph *g, const char **why);

/* Workspace bytes the one engine needs for the graph (nonzero for backward
 * filter: the accumulators). */
int64_t dnn_graph_workspace(const struct dnn_graph *g);

/* ---- conv.c: the job that runs on the stream worker ---------------------------- */

/* A convolution normalised to 3 spatial dimensions (missing ones have size 1,
 * stride 1, dilation 1, padding 0).  Strides are in elements. */
struct conv_job {
    int kind;                       /* enum dnn_conv_kind */
    enum dnn_type type;
    int flip;                       /* CUDNN_CONVOLUTION: the filter is mirrored */
    int64_t N, C, K;
    int64_t in[3], out[3], filt[3];
    int64_t stride[3], pre[3], dil[3];
    int64_t xs[5], ws[5], ys[5];    /* n/k, c, d, h, w strides of x, w, y */
    void *x, *w, *y;                /* data pointers by role (dx, dw, dy for the backward kinds) */
    void *workspace;
    double alpha, beta;
};

void conv_job_run(void *job);
void conv_job_release(void *job);

#endif /* JITCKPT_SIMDEV_CUDNN_INTERNAL_H */
