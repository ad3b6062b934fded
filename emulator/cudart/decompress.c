/* decompress.c -- unpacking compressed device images in fatbinaries.
 *
 * nvcc 13 compresses fatbinary entries with zstd (entry flag 0x8000; the
 * default for PTX, and for cubins with --compress-mode=size or
 * -Xfatbin -compress-all) or with LZ4 in block format (flag 0x2000,
 * --compress-mode=speed).  LZ4 blocks are simple enough to decode here; zstd
 * is not, so it is loaded at run time from the system's libzstd.so.1 (every
 * Debian/Ubuntu has it), which keeps the emulator free of build-time
 * dependencies beyond the C library. */

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "simdev.h"

static int lz4_block(const unsigned char *src, size_t src_len, unsigned char *dst,
                     size_t dst_len, size_t *out_len)
{
    size_t ip = 0, op = 0;
    while (ip < src_len) {
        unsigned token = src[ip++];
        size_t lit = token >> 4;
        if (lit == 15) {
            unsigned char b;
            do {
                if (ip >= src_len)
                    return 0;
                b = src[ip++];
                lit += b;
            } while (b == 255);
        }
        if (lit > src_len - ip || lit > dst_len - op)
            return 0;
        memcpy(dst + op, src + ip, lit);
        ip += lit;
        op += lit;
        if (ip >= src_len)
            break;              /* the last sequence has literals only */
        if (src_len - ip < 2)
            return 0;
        size_t offset = (size_t)src[ip] | (size_t)src[ip + 1] << 8;
        ip += 2;
        if (offset == 0 || offset > op)
            return 0;
        size_t mlen = (token & 15) + 4;
        if ((token & 15) == 15) {
            unsigned char b;
            do {
                if (ip >= src_len)
                    return 0;
                b = src[ip++];
                mlen += b;
            } while (b == 255);
        }
        if (mlen > dst_len - op)
            return 0;
        for (size_t i = 0; i < mlen; i++, op++)   /* may overlap: byte by byte */
            dst[op] = dst[op - offset];
    }
    *out_len = op;
    return 1;
}

typedef size_t (*zstd_decompress_fn)(void *, size_t, const void *, size_t);
typedef size_t (*zstd_frame_size_fn)(const void *, size_t);
typedef unsigned (*zstd_is_error_fn)(size_t);
typedef const char *(*zstd_error_name_fn)(size_t);

static int zstd(const void *src, size_t src_len, void *dst, size_t dst_len, size_t *out_len,
                char *why, size_t why_len)
{
    static void *lib;
    static zstd_decompress_fn decompress;
    static zstd_frame_size_fn frame_size;
    static zstd_is_error_fn is_error;
    static zstd_error_name_fn error_name;
    if (!lib) {
        lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            snprintf(why, why_len, "the image is zstd-compressed and libzstd.so.1 cannot be "
                     "loaded (%s); install libzstd1 or build with --compress-mode=none",
                     dlerror());
            return 0;
        }
        decompress = (zstd_decompress_fn)dlsym(lib, "ZSTD_decompress");
        frame_size = (zstd_frame_size_fn)dlsym(lib, "ZSTD_findFrameCompressedSize");
        is_error = (zstd_is_error_fn)dlsym(lib, "ZSTD_isError");
        error_name = (zstd_error_name_fn)dlsym(lib, "ZSTD_getErrorName");
    }
    if (!decompress || !frame_size || !is_error || !error_name) {
        snprintf(why, why_len, "libzstd.so.1 lacks ZSTD_decompress");
        return 0;
    }
    size_t frame = frame_size(src, src_len);
    if (is_error(frame)) {
        snprintf(why, why_len, "bad zstd frame: %s", error_name(frame));
        return 0;
    }
    size_t n = decompress(dst, dst_len, src, frame);
    if (is_error(n)) {
        snprintf(why, why_len, "zstd: %s", error_name(n));
        return 0;
    }
    *out_len = n;
    return 1;
}

int simdev_decompress(int method, const void *src, size_t src_len, void *dst, size_t dst_len,
                      size_t *out_len, char *why, size_t why_len)
{
    if (method == SIMDEV_COMPRESS_ZSTD)
        return zstd(src, src_len, dst, dst_len, out_len, why, why_len);
    if (method == SIMDEV_COMPRESS_LZ4) {
        if (lz4_block(src, src_len, dst, dst_len, out_len))
            return 1;
        snprintf(why, why_len, "corrupt LZ4 block");
        return 0;
    }
    snprintf(why, why_len, "unknown compression method %d", method);
    return 0;
}
