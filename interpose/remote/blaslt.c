/* blaslt.c -- cuBLASLt in transparent mode (issue 19): descriptors kept in the worker.
 *
 * A cuBLASLt matmul descriptor, matrix layout or matmul preference is a
 * host-only object: it holds settings, never device state.  The worker keeps
 * each one itself (struct lt_obj: how it was created and every attribute the
 * program set, in order), and a call that uses descriptors carries them
 * (jitckpt_remote_wire.h: struct jitckpt_lt_head), so the proxy holds none:
 *
 *  - PyTorch creates, sets and destroys its descriptors around every GEMM:
 *    here that costs no round trip, and one cublasLtMatmul is one request;
 *  - a proxy restart has no descriptor to re-create, and a replayed minibatch
 *    (the call log) replays self-contained matmuls;
 *  - an attribute the program never set is asked of the proxy's cuBLASLt
 *    (a fresh object with the same settings), so defaults are the library's.
 *
 * SetAttribute refuses an unknown attribute or a value of the wrong size
 * at once, as cuBLASLt does (the sizes generated from the types cublasLt.h
 * documents); what only the library can judge (a value it does not accept)
 * fails the call that carries it, with the library's status.
 *
 * A cuBLASLt handle is a cuBLAS handle: cuBLAS documents that any
 * cublasHandle_t serves as a cublasLtHandle_t, and PyTorch passes its cuBLAS
 * handle.  cublasLtCreate therefore makes one through cublasCreate_v2, which
 * a proxy restart re-creates with every other cuBLAS handle (blas.c).
 *
 * The scalars alpha and beta follow the descriptor's pointer mode: host
 * values copied with the call (their size from its scale type), or device
 * addresses, which cross unchanged. */

#include "remote.h"

#ifdef JITCKPT_REMOTE_CUBLASLT

#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LT_MAGIC 0x6a6b4c74u                        /* "jkLt" */

struct lt_attr {
    uint32_t id, len;
    unsigned char value[JITCKPT_LT_ATTR_MAX];
};

struct lt_obj {
    uint32_t magic;
    struct jitckpt_lt_head head;
    struct lt_attr attrs[JITCKPT_LT_MAX_ATTRS];
};

static struct lt_obj *lt_new(uint32_t kind, uint64_t a, uint64_t b, uint64_t c, int64_t d)
{
    struct lt_obj *o = calloc(1, sizeof *o);
    if (o) {
        o->magic = LT_MAGIC;
        o->head = (struct jitckpt_lt_head){.kind = kind, .a = a, .b = b, .c = c, .d = d};
    }
    return o;
}

static struct lt_obj *lt_of(const void *p, uint32_t kind)
{
    const struct lt_obj *o = p;
    return o && o->magic == LT_MAGIC && o->head.kind == kind ? (struct lt_obj *)o : NULL;
}

static cublasStatus_t lt_destroy(void *p, uint32_t kind)
{
    struct lt_obj *o = lt_of(p, kind);
    if (p == NULL)
        return CUBLAS_STATUS_SUCCESS;           /* as cuBLASLt: destroying NULL is a no-op */
    if (o == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    o->magic = 0;
    free(o);
    return CUBLAS_STATUS_SUCCESS;
}

static const struct lt_attr *lt_find(const struct lt_obj *o, uint32_t id)
{
    for (uint32_t i = 0; i < o->head.n_attrs; i++)
        if (o->attrs[i].id == id)
            return &o->attrs[i];
    return NULL;
}

/* remote_stubs.c, generated from cublasLt.h's attribute enums and the types their comments document */
extern const struct jitckpt_lt_attr_size remote_lt_attr_sizes[];
extern const unsigned remote_lt_attr_count;

/* 1 if cuBLASLt knows attribute `id` of `kind` and `size` is that of its documented type (size 0: any). */
static int lt_attr_ok(uint32_t kind, uint32_t id, size_t size)
{
    for (unsigned i = 0; i < remote_lt_attr_count; i++)
        if (remote_lt_attr_sizes[i].kind == kind && remote_lt_attr_sizes[i].id == id)
            return size == 0 || remote_lt_attr_sizes[i].size == 0 || remote_lt_attr_sizes[i].size == size;
    return 0;
}

static cublasStatus_t lt_set(void *p, uint32_t kind, uint32_t id, const void *buf, size_t size)
{
    struct lt_obj *o = lt_of(p, kind);
    if (o == NULL || buf == NULL || size == 0 || size > JITCKPT_LT_ATTR_MAX || !lt_attr_ok(kind, id, size))
        return CUBLAS_STATUS_INVALID_VALUE;
    struct lt_attr *a = (struct lt_attr *)lt_find(o, id);
    if (a == NULL) {
        if (o->head.n_attrs == JITCKPT_LT_MAX_ATTRS)
            return CUBLAS_STATUS_ALLOC_FAILED;
        a = &o->attrs[o->head.n_attrs++];
        a->id = id;
    }
    a->len = (uint32_t)size;
    memcpy(a->value, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

/* The object as the wire carries it (a NULL object: kind 0, which the proxy passes as NULL). */
static void put_obj(struct rcall *c, const struct lt_obj *o)
{
    struct jitckpt_lt_head none = {0};
    const struct jitckpt_lt_head *h = o ? &o->head : &none;
    rc_put(c, h, sizeof *h);
    for (uint32_t i = 0; i < h->n_attrs; i++) {
        rc_put(c, &o->attrs[i].id, sizeof o->attrs[i].id);
        rc_put(c, &o->attrs[i].len, sizeof o->attrs[i].len);
        rc_put(c, o->attrs[i].value, o->attrs[i].len);
    }
}

/* An attribute the program set is answered here; any other is asked of the proxy's cuBLASLt. */
static cublasStatus_t lt_get(const void *p, uint32_t kind, unsigned fn, uint32_t id, void *buf, size_t size,
                             size_t *written)
{
    const struct lt_obj *o = lt_of(p, kind);
    /* cuBLASLt's rules: size 0 asks for the size (into *written), else buf takes a value of its exact size */
    if (o == NULL || (size == 0 ? written == NULL : buf == NULL) || !lt_attr_ok(kind, id, size))
        return CUBLAS_STATUS_INVALID_VALUE;
    const struct lt_attr *a = lt_find(o, id);
    if (a != NULL) {
        if (size == 0) {
            *written = a->len;
            return CUBLAS_STATUS_SUCCESS;
        }
        if (size != a->len)
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(buf, a->value, a->len);
        if (written)
            *written = a->len;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (size > JITCKPT_LT_ATTR_MAX)
        size = JITCKPT_LT_ATTR_MAX;              /* no attribute is larger */
    struct rcall c;
    if (remote_begin(&c, fn) != 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    put_obj(&c, o);
    uint64_t want = size, has_buf = buf != NULL;
    rc_put(&c, &id, sizeof id);
    rc_put(&c, &want, sizeof want);
    rc_put(&c, &has_buf, sizeof has_buf);
    cublasStatus_t st = (cublasStatus_t)remote_call(&c);
    uint64_t n = 0;
    if (st == CUBLAS_STATUS_SUCCESS && rc_get(&c, &n, sizeof n) == 0) {
        if (written)
            *written = (size_t)n;
        if (buf != NULL && n <= size)
            rc_get(&c, buf, (size_t)n);
    }
    remote_end(&c);
    return st;
}

/* ---- handles ------------------------------------------------------------------------------------- */

/* The handles cublasLtCreate made: cublasLtDestroy of any other (a cuBLAS handle the program cast)
 * must not destroy the cuBLAS handle under it. */
static cublasLtHandle_t *lt_handles;
static size_t n_lt_handles, cap_lt_handles;
static pthread_mutex_t lt_handles_lock = PTHREAD_MUTEX_INITIALIZER;

EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (lightHandle == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    pthread_mutex_lock(&lt_handles_lock);
    cublasStatus_t st = CUBLAS_STATUS_ALLOC_FAILED;
    if (n_lt_handles == cap_lt_handles) {
        size_t cap = cap_lt_handles ? 2 * cap_lt_handles : 8;
        cublasLtHandle_t *more = realloc(lt_handles, cap * sizeof *more);
        if (more) {
            lt_handles = more;
            cap_lt_handles = cap;
        }
    }
    if (n_lt_handles < cap_lt_handles && (st = cublasCreate_v2((cublasHandle_t *)lightHandle)) == CUBLAS_STATUS_SUCCESS)
        lt_handles[n_lt_handles++] = *lightHandle;
    pthread_mutex_unlock(&lt_handles_lock);
    return st;
}

EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    pthread_mutex_lock(&lt_handles_lock);
    size_t i = 0;
    while (i < n_lt_handles && lt_handles[i] != lightHandle)
        i++;
    int ours = i < n_lt_handles;
    if (ours)
        lt_handles[i] = lt_handles[--n_lt_handles];
    pthread_mutex_unlock(&lt_handles_lock);
    return ours ? cublasDestroy_v2((cublasHandle_t)lightHandle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

EXPORT const char *cublasLtGetStatusName(cublasStatus_t status)
{
    return cublasGetStatusName(status);
}

EXPORT const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return cublasGetStatusString(status);
}

/* ---- descriptors --------------------------------------------------------------------------------- */

EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                               cudaDataType_t scaleType)
{
    if (matmulDesc == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct lt_obj *o = lt_new(JITCKPT_LT_MATMUL_DESC, (uint64_t)computeType, (uint64_t)scaleType, 0, 0);
    if (o == NULL)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *matmulDesc = (cublasLtMatmulDesc_t)o;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    return lt_destroy(matmulDesc, JITCKPT_LT_MATMUL_DESC);
}

EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                     cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                     size_t sizeInBytes)
{
    return lt_set(matmulDesc, JITCKPT_LT_MATMUL_DESC, (uint32_t)attr, buf, sizeInBytes);
}

EXPORT cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                     cublasLtMatmulDescAttributes_t attr, void *buf,
                                                     size_t sizeInBytes, size_t *sizeWritten)
{
    return lt_get(matmulDesc, JITCKPT_LT_MATMUL_DESC, RFN_cublasLtMatmulDescGetAttribute, (uint32_t)attr, buf,
                  sizeInBytes, sizeWritten);
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld)
{
    if (matLayout == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct lt_obj *o = lt_new(JITCKPT_LT_LAYOUT, (uint64_t)type, rows, cols, ld);
    if (o == NULL)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *matLayout = (cublasLtMatrixLayout_t)o;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    return lt_destroy(matLayout, JITCKPT_LT_LAYOUT);
}

EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                       cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                       size_t sizeInBytes)
{
    return lt_set(matLayout, JITCKPT_LT_LAYOUT, (uint32_t)attr, buf, sizeInBytes);
}

EXPORT cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                       cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                       size_t sizeInBytes, size_t *sizeWritten)
{
    return lt_get(matLayout, JITCKPT_LT_LAYOUT, RFN_cublasLtMatrixLayoutGetAttribute, (uint32_t)attr, buf,
                  sizeInBytes, sizeWritten);
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (pref == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct lt_obj *o = lt_new(JITCKPT_LT_PREFERENCE, 0, 0, 0, 0);
    if (o == NULL)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *pref = (cublasLtMatmulPreference_t)o;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    return lt_destroy(pref, JITCKPT_LT_PREFERENCE);
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr,
                                                           const void *buf, size_t sizeInBytes)
{
    return lt_set(pref, JITCKPT_LT_PREFERENCE, (uint32_t)attr, buf, sizeInBytes);
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, void *buf,
                                                           size_t sizeInBytes, size_t *sizeWritten)
{
    return lt_get(pref, JITCKPT_LT_PREFERENCE, RFN_cublasLtMatmulPreferenceGetAttribute, (uint32_t)attr, buf,
                  sizeInBytes, sizeWritten);
}

/* ---- the calls ----------------------------------------------------------------------------------- */

/* Bytes of one value of a cudaDataType_t (0: unknown). */
static size_t type_bytes(uint64_t t)
{
    switch ((cudaDataType_t)t) {
    case CUDA_R_64F: case CUDA_C_32F: return 8;
    case CUDA_C_64F: return 16;
    case CUDA_R_32F: case CUDA_R_32I: case CUDA_R_32U: case CUDA_C_16F: case CUDA_C_16BF: return 4;
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    case CUDA_R_8I: case CUDA_R_8U: return 1;
    default: return 0;
    }
}

static int32_t attr_i32(const struct lt_obj *o, uint32_t id, int32_t fallback)
{
    const struct lt_attr *a = lt_find(o, id);
    int32_t v = fallback;
    if (a && a->len == sizeof v)
        memcpy(&v, a->value, sizeof v);
    return v;
}

/* alpha or beta: u8 1, u32 size and the host value, or u8 0 and the device address. */
static void put_scalar(struct rcall *c, const void *p, int host, size_t bytes)
{
    uint8_t on_host = host && p != NULL;
    rc_put(c, &on_host, sizeof on_host);
    if (on_host) {
        uint32_t n = (uint32_t)bytes;
        rc_put(c, &n, sizeof n);
        rc_put(c, p, bytes);
    } else {
        rc_put(c, &p, sizeof p);
    }
}

EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                     const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                     const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                     const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                     cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                     void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    const struct lt_obj *desc = lt_of(computeDesc, JITCKPT_LT_MATMUL_DESC);
    const struct lt_obj *layouts[4] = {lt_of(Adesc, JITCKPT_LT_LAYOUT), lt_of(Bdesc, JITCKPT_LT_LAYOUT),
                                       lt_of(Cdesc, JITCKPT_LT_LAYOUT), lt_of(Ddesc, JITCKPT_LT_LAYOUT)};
    if (lightHandle == NULL)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (desc == NULL || !layouts[0] || !layouts[1] || !layouts[2] || !layouts[3])
        return CUBLAS_STATUS_INVALID_VALUE;
    int32_t mode = attr_i32(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
    size_t bytes = type_bytes((uint64_t)attr_i32(desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, (int32_t)desc->head.b));
    if (bytes == 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    stream = remote_stream(stream);
    struct rcall c;
    if (remote_begin(&c, RFN_cublasLtMatmul) != 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    rc_put_handle(&c, lightHandle);
    put_obj(&c, desc);
    for (int i = 0; i < 4; i++)
        put_obj(&c, layouts[i]);
    put_scalar(&c, alpha, mode == CUBLASLT_POINTER_MODE_HOST, bytes);
    put_scalar(&c, beta, mode == CUBLASLT_POINTER_MODE_HOST || mode == CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST,
               bytes);
    const void *ptrs[4] = {A, B, C, D};
    rc_put(&c, ptrs, sizeof ptrs);
    uint8_t has_algo = algo != NULL;
    rc_put(&c, &has_algo, sizeof has_algo);
    if (has_algo)
        rc_put(&c, algo, sizeof *algo);
    rc_put(&c, &workspace, sizeof workspace);
    uint64_t ws = workspaceSizeInBytes;
    rc_put(&c, &ws, sizeof ws);
    rc_put_handle(&c, stream);
    cublasStatus_t st = (cublasStatus_t)remote_call(&c);
    if (st != CUBLAS_STATUS_SUCCESS)
        calllog_unlog_last();               /* (a failed matmul changed nothing: a replay skips it) */
    remote_end(&c);
    return st;
}

EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                                     cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                     cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                     cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                                     cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                     int *returnAlgoCount)
{
    const struct lt_obj *desc = lt_of(operationDesc, JITCKPT_LT_MATMUL_DESC);
    const struct lt_obj *pref = lt_of(preference, JITCKPT_LT_PREFERENCE);
    const struct lt_obj *layouts[4] = {lt_of(Adesc, JITCKPT_LT_LAYOUT), lt_of(Bdesc, JITCKPT_LT_LAYOUT),
                                       lt_of(Cdesc, JITCKPT_LT_LAYOUT), lt_of(Ddesc, JITCKPT_LT_LAYOUT)};
    if (lightHandle == NULL)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (desc == NULL || pref == NULL || !layouts[0] || !layouts[1] || !layouts[2] || !layouts[3] ||
        requestedAlgoCount <= 0 || requestedAlgoCount > 1024 || heuristicResultsArray == NULL ||
        returnAlgoCount == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct rcall c;
    if (remote_begin(&c, RFN_cublasLtMatmulAlgoGetHeuristic) != 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    rc_put_handle(&c, lightHandle);
    put_obj(&c, desc);
    for (int i = 0; i < 4; i++)
        put_obj(&c, layouts[i]);
    put_obj(&c, pref);
    int32_t want = requestedAlgoCount;
    rc_put(&c, &want, sizeof want);
    cublasStatus_t st = (cublasStatus_t)remote_call(&c);
    int32_t got = 0;
    if (rc_get(&c, &got, sizeof got) == 0 && got >= 0 && got <= want) {
        *returnAlgoCount = got;
        if (got > 0)
            rc_get(&c, heuristicResultsArray, (size_t)got * sizeof heuristicResultsArray[0]);
    }
    remote_end(&c);
    return st;
}

#endif
