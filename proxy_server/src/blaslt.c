/* blaslt.c -- the proxy's half of cuBLASLt (issue 19; the worker's: interpose/remote/blaslt.c).
 *
 * The worker keeps every matmul descriptor, matrix layout and preference and
 * sends those a call uses (jitckpt_remote_wire.h: struct jitckpt_lt_head).
 * Here each is created in the real cuBLASLt, given its attributes in the order
 * the program set them, used for the one call and destroyed: no descriptor
 * outlives its request, so a restarted proxy has none to re-create and a
 * replayed request is complete.  The handle is a cuBLAS handle (a virtual
 * VH_BLAS id), which cuBLAS documents as a valid cublasLtHandle_t.  A
 * cublasLtMatmul is work on its stream: watch.c holds it back while that
 * stream waits for an unfinished collective, as it does a kernel launch. */

#include "dispatch.h"

#ifdef JITCKPT_REMOTE_CUBLASLT

#include <cublasLt.h>
#include <stdlib.h>

static __typeof__(cublasLtMatmulDescCreate) *r_desc_create;
static __typeof__(cublasLtMatmulDescDestroy) *r_desc_destroy;
static __typeof__(cublasLtMatmulDescSetAttribute) *r_desc_set;
static __typeof__(cublasLtMatmulDescGetAttribute) *r_desc_get;
static __typeof__(cublasLtMatrixLayoutCreate) *r_layout_create;
static __typeof__(cublasLtMatrixLayoutDestroy) *r_layout_destroy;
static __typeof__(cublasLtMatrixLayoutSetAttribute) *r_layout_set;
static __typeof__(cublasLtMatrixLayoutGetAttribute) *r_layout_get;
static __typeof__(cublasLtMatmulPreferenceCreate) *r_pref_create;
static __typeof__(cublasLtMatmulPreferenceDestroy) *r_pref_destroy;
static __typeof__(cublasLtMatmulPreferenceSetAttribute) *r_pref_set;
static __typeof__(cublasLtMatmulPreferenceGetAttribute) *r_pref_get;
static __typeof__(cublasLtMatmul) *r_matmul;
static __typeof__(cublasLtMatmulAlgoGetHeuristic) *r_heuristic;
static int resolved;

/* 0, or CUBLAS_STATUS_NOT_INITIALIZED when no cuBLASLt is loaded or it lacks a function (said once). */
static int32_t resolve(void)
{
    if (resolved)
        return resolved > 0 ? 0 : CUBLAS_STATUS_NOT_INITIALIZED;
#define R(var, name) (var = (__typeof__(name) *)proxy_sym(cublaslt, #name)) != NULL
    int ok = cublaslt && R(r_desc_create, cublasLtMatmulDescCreate) && R(r_desc_destroy, cublasLtMatmulDescDestroy) &&
             R(r_desc_set, cublasLtMatmulDescSetAttribute) && R(r_desc_get, cublasLtMatmulDescGetAttribute) &&
             R(r_layout_create, cublasLtMatrixLayoutCreate) && R(r_layout_destroy, cublasLtMatrixLayoutDestroy) &&
             R(r_layout_set, cublasLtMatrixLayoutSetAttribute) && R(r_layout_get, cublasLtMatrixLayoutGetAttribute) &&
             R(r_pref_create, cublasLtMatmulPreferenceCreate) && R(r_pref_destroy, cublasLtMatmulPreferenceDestroy) &&
             R(r_pref_set, cublasLtMatmulPreferenceSetAttribute) &&
             R(r_pref_get, cublasLtMatmulPreferenceGetAttribute) && R(r_matmul, cublasLtMatmul) &&
             R(r_heuristic, cublasLtMatmulAlgoGetHeuristic);
#undef R
    resolved = ok ? 1 : -1;
    if (!ok)
        plog("cuBLASLt calls fail: %s (set --cublaslt or " PROXY_ENV_CUBLASLT ")",
             cublaslt ? "the loaded cuBLASLt lacks a function this proxy calls" : "no cuBLASLt is loaded");
    return ok ? 0 : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* One object made from the request: *obj is NULL for a NULL one (kind 0).  0, or a cuBLAS status. */
static int32_t make(struct rdisp *d, uint32_t want_kind, void **obj, uint32_t *kind_out)
{
    struct jitckpt_lt_head h;
    *obj = NULL;
    if (rd_get(d, &h, sizeof h) || h.n_attrs > JITCKPT_LT_MAX_ATTRS)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (kind_out)
        *kind_out = h.kind;
    if (h.kind == 0)
        return 0;
    if (want_kind && h.kind != want_kind)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st;
    switch (h.kind) {
    case JITCKPT_LT_MATMUL_DESC:
        st = r_desc_create((cublasLtMatmulDesc_t *)obj, (cublasComputeType_t)h.a, (cudaDataType_t)h.b);
        break;
    case JITCKPT_LT_LAYOUT:
        st = r_layout_create((cublasLtMatrixLayout_t *)obj, (cudaDataType)h.a, h.b, h.c, h.d);
        break;
    case JITCKPT_LT_PREFERENCE:
        st = r_pref_create((cublasLtMatmulPreference_t *)obj);
        break;
    default:
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (uint32_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < h.n_attrs; i++) {
        uint32_t id, len;
        unsigned char value[JITCKPT_LT_ATTR_MAX];
        if (rd_get(d, &id, sizeof id) || rd_get(d, &len, sizeof len) || len > sizeof value || rd_get(d, value, len)) {
            st = CUBLAS_STATUS_INVALID_VALUE;
            break;
        }
        st = h.kind == JITCKPT_LT_MATMUL_DESC ? r_desc_set(*obj, (cublasLtMatmulDescAttributes_t)id, value, len)
             : h.kind == JITCKPT_LT_LAYOUT ? r_layout_set(*obj, (cublasLtMatrixLayoutAttribute_t)id, value, len)
             : r_pref_set(*obj, (cublasLtMatmulPreferenceAttributes_t)id, value, len);
    }
    if (st != CUBLAS_STATUS_SUCCESS && *obj != NULL) {
        uint32_t k = h.kind;
        void *o = *obj;
        *obj = NULL;
        if (k == JITCKPT_LT_MATMUL_DESC)
            r_desc_destroy(o);
        else if (k == JITCKPT_LT_LAYOUT)
            r_layout_destroy(o);
        else
            r_pref_destroy(o);
    }
    return (int32_t)st;
}

static void unmake(void *obj, uint32_t kind)
{
    if (obj == NULL)
        return;
    if (kind == JITCKPT_LT_MATMUL_DESC)
        r_desc_destroy(obj);
    else if (kind == JITCKPT_LT_LAYOUT)
        r_layout_destroy(obj);
    else
        r_pref_destroy(obj);
}

/* The descriptor and the four layouts a matmul or a heuristic query names; 0, or a status. */
struct problem { void *desc, *layout[4]; };

static int32_t make_problem(struct rdisp *d, struct problem *p)
{
    *p = (struct problem){0};
    int32_t st = make(d, JITCKPT_LT_MATMUL_DESC, &p->desc, NULL);
    for (int i = 0; st == 0 && i < 4; i++)
        st = make(d, JITCKPT_LT_LAYOUT, &p->layout[i], NULL);
    return st;
}

static void unmake_problem(struct problem *p)
{
    unmake(p->desc, JITCKPT_LT_MATMUL_DESC);
    for (int i = 0; i < 4; i++)
        unmake(p->layout[i], JITCKPT_LT_LAYOUT);
}

static int32_t matmul(struct rdisp *d)
{
    uint64_t handle_vid, stream_vid;
    void *handle;
    cudaStream_t stream;
    if (rd_get_handle(d, VH_BLAS, &handle_vid, &handle) != 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    struct problem p;
    int32_t st = make_problem(d, &p);
    unsigned char alpha_buf[16], beta_buf[16];
    const void *alpha = NULL, *beta = NULL;
    const void *ptrs[4];
    uint8_t has_algo = 0;
    cublasLtMatmulAlgo_t algo;
    void *workspace;
    uint64_t ws;
    if (st == 0) {
        uint8_t on_host;
        for (int i = 0; i < 2 && st == 0; i++) {
            const void **s = i ? &beta : &alpha;
            unsigned char *buf = i ? beta_buf : alpha_buf;
            uint32_t bytes = 0;     /* a host value's size: the worker's, from the descriptor's scale type */
            if (rd_get(d, &on_host, sizeof on_host) || (on_host && (rd_get(d, &bytes, sizeof bytes) || bytes > 16)))
                st = CUBLAS_STATUS_INVALID_VALUE;
            else if (on_host ? rd_get(d, buf, bytes) : rd_get(d, (void *)s, sizeof *s))
                st = CUBLAS_STATUS_INVALID_VALUE;
            else if (on_host)
                *s = buf;
        }
        if (st == 0 && (rd_get(d, ptrs, sizeof ptrs) || rd_get(d, &has_algo, sizeof has_algo) ||
                        (has_algo && rd_get(d, &algo, sizeof algo)) || rd_get(d, &workspace, sizeof workspace) ||
                        rd_get(d, &ws, sizeof ws)))
            st = CUBLAS_STATUS_INVALID_VALUE;
        if (st == 0 && rd_get_handle(d, VH_STREAM, &stream_vid, (void **)&stream) != 0)
            st = CUBLAS_STATUS_INVALID_VALUE;    /* (or dropped: an abort came while it was held back) */
    }
    if (st == 0)
        st = r_matmul((cublasLtHandle_t)handle, p.desc, alpha, ptrs[0], p.layout[0], ptrs[1], p.layout[1], beta,
                      ptrs[2], p.layout[2], (void *)ptrs[3], p.layout[3], has_algo ? &algo : NULL, workspace,
                      (size_t)ws, stream);
    unmake_problem(&p);
    return st;
}

static int32_t heuristic(struct rdisp *d)
{
    uint64_t handle_vid;
    void *handle;
    int32_t got = 0;
    if (rd_get_handle(d, VH_BLAS, &handle_vid, &handle) != 0) {
        rd_put(d, &got, sizeof got);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    struct problem p;
    void *pref = NULL;
    int32_t want = 0;
    int32_t st = make_problem(d, &p);
    if (st == 0)
        st = make(d, JITCKPT_LT_PREFERENCE, &pref, NULL);
    if (st == 0 && (rd_get(d, &want, sizeof want) || want <= 0 || want > 1024))
        st = CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulHeuristicResult_t *results = NULL;
    if (st == 0 && (results = calloc((size_t)want, sizeof *results)) == NULL)
        st = CUBLAS_STATUS_ALLOC_FAILED;
    int n = 0;
    if (st == 0)
        st = r_heuristic((cublasLtHandle_t)handle, p.desc, p.layout[0], p.layout[1], p.layout[2], p.layout[3], pref,
                         want, results, &n);
    got = n >= 0 && n <= want ? n : 0;
    rd_put(d, &got, sizeof got);
    if (got > 0)
        rd_put(d, results, (size_t)got * sizeof *results);
    free(results);
    unmake(pref, JITCKPT_LT_PREFERENCE);
    unmake_problem(&p);
    return st;
}

/* An attribute the program never set: a fresh object with the same settings answers. */
static int32_t get_attribute(struct rdisp *d)
{
    void *obj = NULL;
    uint32_t kind = 0, id;
    uint64_t size, has_buf;
    int32_t st = make(d, 0, &obj, &kind);
    if (st == 0 && (obj == NULL || rd_get(d, &id, sizeof id) || rd_get(d, &size, sizeof size) ||
                    rd_get(d, &has_buf, sizeof has_buf) || size > JITCKPT_LT_ATTR_MAX))
        st = CUBLAS_STATUS_INVALID_VALUE;
    unsigned char value[JITCKPT_LT_ATTR_MAX];
    size_t written = 0;
    if (st == 0) {
        void *buf = has_buf ? value : NULL;
        st = kind == JITCKPT_LT_MATMUL_DESC ? r_desc_get(obj, (cublasLtMatmulDescAttributes_t)id, buf, size, &written)
             : kind == JITCKPT_LT_LAYOUT ? r_layout_get(obj, (cublasLtMatrixLayoutAttribute_t)id, buf, size, &written)
             : r_pref_get(obj, (cublasLtMatmulPreferenceAttributes_t)id, buf, size, &written);
    }
    if (st == 0) {
        uint64_t n = written;
        rd_put(d, &n, sizeof n);
        if (has_buf && written <= size)
            rd_put(d, value, written);
    }
    unmake(obj, kind);
    return st;
}

int32_t dispatch_blaslt(unsigned fn, struct rdisp *d)
{
    int32_t st = resolve();
    if (st)
        return st;
    switch (fn) {
    case RFN_cublasLtMatmul: return matmul(d);
    case RFN_cublasLtMatmulAlgoGetHeuristic: return heuristic(d);
    case RFN_cublasLtMatmulDescGetAttribute:
    case RFN_cublasLtMatrixLayoutGetAttribute:
    case RFN_cublasLtMatmulPreferenceGetAttribute: return get_attribute(d);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;     /* the worker keeps the rest itself */
    }
}

#endif
