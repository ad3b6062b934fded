/* reduce.c -- element-wise reductions for every NCCL datatype.
 *
 * The collective code calls these in rank order, so the result of a
 * reduction is the same on every rank and in every run.  Half and bfloat16
 * values are widened to float for each operation and rounded back to
 * nearest-even, one step at a time.  ncclAvg is a sum followed by a
 * division by the number of ranks (integer division for integer types).
 * The two 8-bit float formats can be moved (broadcast, gather, send) but
 * not reduced. */

#include <math.h>
#include <string.h>

#include "internal.h"

size_t dtype_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

int dtype_reducible(ncclDataType_t t)
{
    return dtype_size(t) != 0 && t != ncclFloat8e4m3 && t != ncclFloat8e5m2;
}

/* ---- 16-bit floats --------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {                        /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            bits = sign | exp << 23 | (mant & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
    if (exp == 0xff)
        return sign | 0x7c00 | (mant ? 0x200 : 0);
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return sign | 0x7c00;
    if (e <= 0) {
        if (e < -10)
            return sign;
        mant |= 0x800000;
        int shift = 14 - e;
        uint32_t half = mant >> shift, rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1)))
            half++;
        return sign | (uint16_t)half;
    }
    uint32_t half = (uint32_t)e << 10 | mant >> 13, rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
        half++;                          /* may carry into the exponent: still correct */
    return sign | (uint16_t)half;
}

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);    /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- typed loops ------------------------------------------------------------ */

static double apply_f(double a, double b, ncclRedOp_t op)
{
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return isnan(a) || a >= b ? a : b;
    case ncclMin: return isnan(a) || a <= b ? a : b;
    default: return a + b;              /* ncclSum, ncclAvg */
    }
}

/* One loop per integer width; unsigned arithmetic keeps wrap-around defined. */
#define INT_LOOP(T, UT)                                                         \
    do {                                                                        \
        T *a = acc;                                                             \
        const T *b = src;                                                       \
        for (size_t i = 0; i < n; i++) {                                        \
            switch (op) {                                                       \
            case ncclProd: a[i] = (T)((UT)a[i] * (UT)b[i]); break;              \
            case ncclMax: a[i] = a[i] >= b[i] ? a[i] : b[i]; break;             \
            case ncclMin: a[i] = a[i] <= b[i] ? a[i] : b[i]; break;             \
            default: a[i] = (T)((UT)a[i] + (UT)b[i]); break;                    \
            }                                                                   \
        }                                                                       \
    } while (0)

void reduce_into(void *acc, const void *src, size_t n, ncclDataType_t t, ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8: INT_LOOP(int8_t, uint8_t); break;
    case ncclUint8: INT_LOOP(uint8_t, uint8_t); break;
    case ncclInt32: INT_LOOP(int32_t, uint32_t); break;
    case ncclUint32: INT_LOOP(uint32_t, uint32_t); break;
    case ncclInt64: INT_LOOP(int64_t, uint64_t); break;
    case ncclUint64: INT_LOOP(uint64_t, uint64_t); break;
    case ncclFloat32: {
        float *a = acc;
        const float *b = src;
        if (op == ncclSum || op == ncclAvg)
            for (size_t i = 0; i < n; i++)
                a[i] += b[i];
        else
            for (size_t i = 0; i < n; i++)
                a[i] = (float)apply_f(a[i], b[i], op);
        break;
    }
    case ncclFloat64: {
        double *a = acc;
        const double *b = src;
        for (size_t i = 0; i < n; i++)
            a[i] = apply_f(a[i], b[i], op);
        break;
    }
    case ncclFloat16: {
        uint16_t *a = acc;
        const uint16_t *b = src;
        for (size_t i = 0; i < n; i++)
            a[i] = float_to_half((float)apply_f(half_to_float(a[i]), half_to_float(b[i]), op));
        break;
    }
    case ncclBfloat16: {
        uint16_t *a = acc;
        const uint16_t *b = src;
        for (size_t i = 0; i < n; i++)
            a[i] = float_to_bf16((float)apply_f(bf16_to_float(a[i]), bf16_to_float(b[i]), op));
        break;
    }
    default:
        break;
    }
}

/* Reads element i of a buffer of type t as a double (integers exactly up to 2^53). */
static double load(const void *p, size_t i, ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat16: return half_to_float(((const uint16_t *)p)[i]);
    case ncclBfloat16: return bf16_to_float(((const uint16_t *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    default: return 0;
    }
}

static void store(void *p, size_t i, ncclDataType_t t, double v)
{
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)(int64_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)(int64_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)(int64_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)p)[i] = float_to_half((float)v); break;
    case ncclBfloat16: ((uint16_t *)p)[i] = float_to_bf16((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    default: break;
    }
}

void scale_copy(void *dst, const void *src, size_t n, ncclDataType_t t, const void *scale)
{
    double s = load(scale, 0, t);
    for (size_t i = 0; i < n; i++)
        store(dst, i, t, load(src, i, t) * s);
}

void scale_add(void *acc, const void *src, size_t n, ncclDataType_t t, const void *scale)
{
    double s = load(scale, 0, t);
    for (size_t i = 0; i < n; i++)
        store(acc, i, t, load(acc, i, t) + load(src, i, t) * s);
}

void divide_by(void *acc, size_t n, ncclDataType_t t, int divisor)
{
    switch (t) {
    case ncclInt8: for (size_t i = 0; i < n; i++) ((int8_t *)acc)[i] /= divisor; break;
    case ncclUint8: for (size_t i = 0; i < n; i++) ((uint8_t *)acc)[i] /= (unsigned)divisor; break;
    case ncclInt32: for (size_t i = 0; i < n; i++) ((int32_t *)acc)[i] /= divisor; break;
    case ncclUint32: for (size_t i = 0; i < n; i++) ((uint32_t *)acc)[i] /= (unsigned)divisor; break;
    case ncclInt64: for (size_t i = 0; i < n; i++) ((int64_t *)acc)[i] /= divisor; break;
    case ncclUint64: for (size_t i = 0; i < n; i++) ((uint64_t *)acc)[i] /= (unsigned)divisor; break;
    case ncclFloat32: for (size_t i = 0; i < n; i++) ((float *)acc)[i] /= (float)divisor; break;
    case ncclFloat64: for (size_t i = 0; i < n; i++) ((double *)acc)[i] /= divisor; break;
    default:
        for (size_t i = 0; i < n; i++)
            store(acc, i, t, load(acc, i, t) / divisor);
        break;
    }
}
