/* descriptors.c -- the cuBLASLt descriptors: cublasLtMatmulDesc*,
 * cublasLtMatrixLayout* and cublasLtMatmulPreference* Create, Destroy,
 * SetAttribute and GetAttribute.
 *
 * Every attribute the header declares is stored, with the size of its
 * documented data type (a table per descriptor maps the attribute to its
 * field); cublasLtMatmul and the heuristic decide later which values they
 * support.  The header's protocol:
 *   Set: buf NULL, sizeInBytes other than the attribute's size, or an unknown
 *        attribute -> CUBLAS_STATUS_INVALID_VALUE.
 *   Get: sizeInBytes == 0 -> *sizeWritten = the attribute's size (buf may be
 *        NULL; INVALID_VALUE if sizeWritten is NULL); otherwise buf NULL or a
 *        sizeInBytes other than the attribute's size -> INVALID_VALUE, else
 *        the value is copied and *sizeWritten (if given) is its size.  An
 *        unknown attribute is INVALID_VALUE either way.
 * A NULL or destroyed descriptor is INVALID_VALUE.  Destroy(NULL) succeeds. */

#include <stdlib.h>
#include <string.h>

#include "internal.h"

_Static_assert(sizeof(struct lt_matmul_desc) <= sizeof(cublasLtMatmulDescOpaque_t),
               "the matmul descriptor must fit NVIDIA's opaque storage");
_Static_assert(sizeof(struct lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t),
               "the layout descriptor must fit NVIDIA's opaque storage");
_Static_assert(sizeof(struct lt_pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t),
               "the preference descriptor must fit NVIDIA's opaque storage");

/* One attribute: its enum value, the offset of its field and its size. */
struct attr {
    int id;
    size_t offset;
    size_t size;
};

#define ATTR(ID, TYPE, FIELD) { ID, offsetof(TYPE, FIELD), sizeof(((TYPE *)0)->FIELD) }

#define MD struct lt_matmul_desc
static const struct attr matmul_attrs[] = {
    ATTR(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, MD, compute_type),
    ATTR(CUBLASLT_MATMUL_DESC_SCALE_TYPE, MD, scale_type),
    ATTR(CUBLASLT_MATMUL_DESC_POINTER_MODE, MD, pointer_mode),
    ATTR(CUBLASLT_MATMUL_DESC_TRANSA, MD, transa),
    ATTR(CUBLASLT_MATMUL_DESC_TRANSB, MD, transb),
    ATTR(CUBLASLT_MATMUL_DESC_TRANSC, MD, transc),
    ATTR(CUBLASLT_MATMUL_DESC_FILL_MODE, MD, fill_mode),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE, MD, epilogue),
    ATTR(CUBLASLT_MATMUL_DESC_BIAS_POINTER, MD, bias),
    ATTR(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, MD, bias_batch_stride),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, MD, aux),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, MD, aux_ld),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, MD, aux_batch_stride),
    ATTR(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, MD, alpha_vector_batch_stride),
    ATTR(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, MD, sm_count_target),
    ATTR(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, MD, a_scale),
    ATTR(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, MD, b_scale),
    ATTR(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, MD, c_scale),
    ATTR(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, MD, d_scale),
    ATTR(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, MD, amax_d),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, MD, aux_data_type),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, MD, aux_scale),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, MD, aux_amax),
    ATTR(CUBLASLT_MATMUL_DESC_FAST_ACCUM, MD, fast_accum),
    ATTR(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, MD, bias_data_type),
    ATTR(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, MD, a_scale_mode),
    ATTR(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, MD, b_scale_mode),
    ATTR(CUBLASLT_MATMUL_DESC_C_SCALE_MODE, MD, c_scale_mode),
    ATTR(CUBLASLT_MATMUL_DESC_D_SCALE_MODE, MD, d_scale_mode),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, MD, aux_scale_mode),
    ATTR(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, MD, d_out_scale),
    ATTR(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, MD, d_out_scale_mode),
    ATTR(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, MD, emulation_desc),
    ATTR(CUBLASLT_MATMUL_DESC_ALPHA_BATCH_STRIDE, MD, alpha_batch_stride),
    ATTR(CUBLASLT_MATMUL_DESC_BETA_BATCH_STRIDE, MD, beta_batch_stride),
    ATTR(CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS, MD, batch_invariance_flags),
};
#undef MD

#define LY struct lt_layout
static const struct attr layout_attrs[] = {
    ATTR(CUBLASLT_MATRIX_LAYOUT_TYPE, LY, type),
    ATTR(CUBLASLT_MATRIX_LAYOUT_ORDER, LY, order),
    ATTR(CUBLASLT_MATRIX_LAYOUT_ROWS, LY, rows),
    ATTR(CUBLASLT_MATRIX_LAYOUT_COLS, LY, cols),
    ATTR(CUBLASLT_MATRIX_LAYOUT_LD, LY, ld),
    ATTR(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, LY, batch_count),
    ATTR(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, LY, batch_stride),
    ATTR(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, LY, plane_offset),
    ATTR(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, LY, batch_mode),
    ATTR(CUBLASLT_GROUPED_MATRIX_LAYOUT_ROWS_ARRAY, LY, rows_array),
    ATTR(CUBLASLT_GROUPED_MATRIX_LAYOUT_COLS_ARRAY, LY, cols_array),
    ATTR(CUBLASLT_GROUPED_MATRIX_LAYOUT_LD_ARRAY, LY, ld_array),
    ATTR(CUBLASLT_GROUPED_MATRIX_LAYOUT_ROWS_COLS_ARRAY_INTEGER_WIDTH, LY, rows_cols_width),
    ATTR(CUBLASLT_GROUPED_MATRIX_LAYOUT_LD_ARRAY_INTEGER_WIDTH, LY, ld_width),
};
#undef LY

#define PF struct lt_pref
static const struct attr pref_attrs[] = {
    ATTR(CUBLASLT_MATMUL_PREF_SEARCH_MODE, PF, search_mode),
    ATTR(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, PF, max_workspace_bytes),
    ATTR(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, PF, reduction_scheme_mask),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, PF, min_alignment[0]),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, PF, min_alignment[1]),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, PF, min_alignment[2]),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, PF, min_alignment[3]),
    ATTR(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, PF, max_waves_count),
    ATTR(CUBLASLT_MATMUL_PREF_IMPL_MASK, PF, impl_mask),
    ATTR(CUBLASLT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM, PF, grouped_avg_reduction_dim),
    ATTR(CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS, PF, grouped_avg_rows),
    ATTR(CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS, PF, grouped_avg_cols),
};
#undef PF

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const struct attr *find_attr(const struct attr *table, size_t n, int id)
{
    for (size_t i = 0; i < n; i++)
        if (table[i].id == id)
            return &table[i];
    return NULL;
}

static cublasStatus_t set_attr(const char *api, void *obj, const struct attr *table, size_t n, int id,
                               const void *buf, size_t sizeInBytes)
{
    if (!obj)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "descriptor is NULL or destroyed");
    const struct attr *a = find_attr(table, n, id);
    if (!a)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "unknown attribute %d", id);
    if (!buf || sizeInBytes != a->size)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "attribute %d: buf %p, sizeInBytes %zu (its size is %zu)", id, buf,
                         sizeInBytes, a->size);
    memcpy((char *)obj + a->offset, buf, a->size);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t get_attr(const char *api, const void *obj, const struct attr *table, size_t n,
                               int id, void *buf, size_t sizeInBytes, size_t *sizeWritten)
{
    if (!obj)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "descriptor is NULL or destroyed");
    const struct attr *a = find_attr(table, n, id);
    if (!a)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api, "unknown attribute %d", id);
    if (sizeInBytes == 0) {
        if (!sizeWritten)
            return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                             "attribute %d: sizeInBytes is 0 and sizeWritten is NULL", id);
        *sizeWritten = a->size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || sizeInBytes != a->size)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, api,
                         "attribute %d: buf %p, sizeInBytes %zu (its size is %zu)", id, buf,
                         sizeInBytes, a->size);
    memcpy(buf, (const char *)obj + a->offset, a->size);
    if (sizeWritten)
        *sizeWritten = a->size;
    return CUBLAS_STATUS_SUCCESS;
}

/* Storage of NVIDIA's opaque size, zeroed, so the descriptor could equally
 * live in caller-provided opaque storage. */
static void *alloc_opaque(size_t size)
{
    return calloc(1, size);
}

/* ---- matmul descriptor ---------------------------------------------------- */

struct lt_matmul_desc *lt_matmul_desc(cublasLtMatmulDesc_t d)
{
    struct lt_matmul_desc *m = (struct lt_matmul_desc *)d;
    return m && m->magic == LT_MATMUL_DESC_MAGIC ? m : NULL;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType)
{
    if (!matmulDesc)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "matmulDesc is NULL");
    struct lt_matmul_desc *m = alloc_opaque(sizeof(cublasLtMatmulDescOpaque_t));
    if (!m)
        return CUBLAS_STATUS_ALLOC_FAILED;
    m->magic = LT_MATMUL_DESC_MAGIC;
    m->compute_type = (int32_t)computeType;
    m->scale_type = (int32_t)scaleType;
    m->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    m->transa = m->transb = m->transc = CUBLAS_OP_N;
    m->fill_mode = CUBLAS_FILL_MODE_FULL;
    m->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    m->aux_data_type = -1;
    m->bias_data_type = -1;
    m->batch_invariance_flags = CUBLASLT_BATCH_INVARIANCE_UNSET;
    *matmulDesc = (cublasLtMatmulDesc_t)m;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    if (!matmulDesc)
        return CUBLAS_STATUS_SUCCESS;
    struct lt_matmul_desc *m = lt_matmul_desc(matmulDesc);
    if (!m)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy",
                         "%p is not a live matmul descriptor", (void *)matmulDesc);
    m->magic = 0;
    free(m);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void *buf, size_t sizeInBytes)
{
    return set_attr("cublasLtMatmulDescSetAttribute", lt_matmul_desc(matmulDesc), matmul_attrs,
                    COUNT(matmul_attrs), (int)attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           void *buf, size_t sizeInBytes,
                                                           size_t *sizeWritten)
{
    return get_attr("cublasLtMatmulDescGetAttribute", lt_matmul_desc(matmulDesc), matmul_attrs,
                    COUNT(matmul_attrs), (int)attr, buf, sizeInBytes, sizeWritten);
}

/* ---- matrix layout --------------------------------------------------------- */

struct lt_layout *lt_layout(cublasLtMatrixLayout_t l)
{
    struct lt_layout *m = (struct lt_layout *)l;
    return m && m->magic == LT_LAYOUT_MAGIC ? m : NULL;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld)
{
    if (!matLayout)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "matLayout is NULL");
    struct lt_layout *l = alloc_opaque(sizeof(cublasLtMatrixLayoutOpaque_t));
    if (!l)
        return CUBLAS_STATUS_ALLOC_FAILED;
    l->magic = LT_LAYOUT_MAGIC;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    l->batch_count = 1;
    l->batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
    l->rows_cols_width = CUBLASLT_INTEGER_WIDTH_32;
    l->ld_width = CUBLASLT_INTEGER_WIDTH_32;
    *matLayout = (cublasLtMatrixLayout_t)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    if (!matLayout)
        return CUBLAS_STATUS_SUCCESS;
    struct lt_layout *l = lt_layout(matLayout);
    if (!l)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy",
                         "%p is not a live matrix layout", (void *)matLayout);
    l->magic = 0;
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void *buf, size_t sizeInBytes)
{
    return set_attr("cublasLtMatrixLayoutSetAttribute", lt_layout(matLayout), layout_attrs,
                    COUNT(layout_attrs), (int)attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             void *buf, size_t sizeInBytes,
                                                             size_t *sizeWritten)
{
    return get_attr("cublasLtMatrixLayoutGetAttribute", lt_layout(matLayout), layout_attrs,
                    COUNT(layout_attrs), (int)attr, buf, sizeInBytes, sizeWritten);
}

/* ---- matmul preference ------------------------------------------------------ */

struct lt_pref *lt_pref(cublasLtMatmulPreference_t p)
{
    struct lt_pref *m = (struct lt_pref *)p;
    return m && m->magic == LT_PREF_MAGIC ? m : NULL;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "pref is NULL");
    struct lt_pref *p = alloc_opaque(sizeof(cublasLtMatmulPreferenceOpaque_t));
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = LT_PREF_MAGIC;
    p->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    p->reduction_scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    p->max_workspace_bytes = 0;
    for (int i = 0; i < 4; i++)
        p->min_alignment[i] = 256;
    p->max_waves_count = 0.0f;
    p->impl_mask = UINT64_MAX;
    *pref = (cublasLtMatmulPreference_t)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    if (!pref)
        return CUBLAS_STATUS_SUCCESS;
    struct lt_pref *p = lt_pref(pref);
    if (!p)
        return lt_report(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy",
                         "%p is not a live matmul preference", (void *)pref);
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t sizeInBytes)
{
    return set_attr("cublasLtMatmulPreferenceSetAttribute", lt_pref(pref), pref_attrs,
                    COUNT(pref_attrs), (int)attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, void *buf,
    size_t sizeInBytes, size_t *sizeWritten)
{
    return get_attr("cublasLtMatmulPreferenceGetAttribute", lt_pref(pref), pref_attrs,
                    COUNT(pref_attrs), (int)attr, buf, sizeInBytes, sizeWritten);
}
