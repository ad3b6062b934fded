/* fatbin.c -- reading what the emulator needs from a fatbinary's device
 * images: each kernel's parameter layout and each variable's initial value.
 *
 * Why parameter layouts: a launch passes `void **args`, pointers into the
 * caller's stack, and returns before the kernel runs.  The emulator must copy
 * the argument values at launch time, and only the device image knows their
 * sizes.  A GPU runtime reads the same facts from the same place.
 *
 * Layout of a fatbinary (as nvcc 13 writes it; fields we do not need are
 * skipped):
 *   wrapper  { u32 magic 0x466243b1; u32 version; u64 *data; void *prelinked }
 *            version 2 (-rdc=true) lists further fatbinaries in `prelinked`
 *   header   { u32 magic 0xba55ed50; u16 version; u16 header_size; u64 size }
 *   entries  { u16 kind (1 PTX, 2 ELF cubin); u16 version; u32 header_size;
 *              u64 payload_size; u32 compressed_size @0x10; ...;
 *              u64 flags @0x28 (0x2000 LZ4, 0x8000 zstd);
 *              u64 uncompressed_size @0x38 } followed by the payload
 * In a cubin, section ".nv.info.<kernel>" holds attribute records
 * { u8 format; u8 attribute; u16 value-or-size; [size bytes] }; attribute
 * 0x17 (EIATTR_KPARAM_INFO) carries { u32 index; u16 ordinal; u16 offset;
 * u32 bits, size = bits >> 18 } per parameter.  A PTX image is the fallback:
 * the .param list of ".entry <kernel>(...)". */

#include <ctype.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"

#define WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xba55ed50u
#define KIND_PTX 1
#define KIND_ELF 2
#define FLAG_LZ4 0x2000u
#define FLAG_ZSTD 0x8000u
#define EIATTR_KPARAM_INFO 0x17
#define EIATTR_CBANK_PARAM_SIZE 0x19
#define EIFMT_HVAL 3
#define EIFMT_SVAL 4

struct image {
    int kind;
    const unsigned char *data;
    size_t len;
    unsigned char *owned;       /* decompressed copy, freed by simdev_fatbin_forget */
};

struct parsed {
    struct parsed *next;
    const void *wrapper;
    int nimages;
    struct image images[64];
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct parsed *cache;

static uint16_t rd16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void add_entries(struct parsed *pm, const unsigned char *fb)
{
    if (!fb || rd32(fb) != FATBIN_MAGIC)
        return;
    size_t hs = rd16(fb + 6);
    uint64_t size = rd64(fb + 8);
    const unsigned char *p = fb + hs, *end = fb + hs + size;
    while (p + 0x40 <= end && pm->nimages < (int)(sizeof pm->images / sizeof pm->images[0])) {
        int kind = rd16(p);
        uint32_t ehs = rd32(p + 4);
        uint64_t psize = rd64(p + 8);
        uint32_t csize = rd32(p + 0x10);
        uint64_t flags = rd64(p + 0x28);
        uint64_t usize = rd64(p + 0x38);
        const unsigned char *payload = p + ehs;
        if (ehs < 0x40 || payload + psize > end)
            break;
        if (kind == KIND_PTX || kind == KIND_ELF) {
            struct image *im = &pm->images[pm->nimages];
            im->kind = kind;
            if (flags & (FLAG_LZ4 | FLAG_ZSTD)) {
                unsigned char *out = malloc(usize + 1);
                size_t got = 0;
                char why[256];
                int method = (flags & FLAG_ZSTD) ? SIMDEV_COMPRESS_ZSTD : SIMDEV_COMPRESS_LZ4;
                size_t in_len = csize && csize <= psize ? csize : psize;
                if (out && simdev_decompress(method, payload, in_len, out, usize, &got, why,
                                             sizeof why)) {
                    out[got] = '\0';
                    im->owned = out;
                    im->data = out;
                    im->len = got;
                    pm->nimages++;
                } else {
                    simdev_log("cannot unpack a %s image of a fatbinary: %s",
                               kind == KIND_ELF ? "cubin" : "PTX", out ? why : "out of memory");
                    free(out);
                }
            } else {
                im->data = payload;
                im->len = psize;
                pm->nimages++;
            }
        }
        p = payload + psize;
    }
}

static int is_elf(const unsigned char *p)
{
    return p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F';
}

size_t simdev_code_size(const void *code)
{
    const unsigned char *p = code;
    if (!p)
        return 0;
    if (rd32(p) == FATBIN_MAGIC)
        return rd16(p + 6) + (size_t)rd64(p + 8);
    if (is_elf(p)) {
        const Elf64_Ehdr *eh = code;
        if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shentsize != sizeof(Elf64_Shdr))
            return 0;
        size_t end = eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr);
        const Elf64_Shdr *sh = (const Elf64_Shdr *)(p + eh->e_shoff);
        for (unsigned i = 0; i < eh->e_shnum; i++)
            if (sh[i].sh_type != SHT_NOBITS && sh[i].sh_offset + sh[i].sh_size > end)
                end = sh[i].sh_offset + sh[i].sh_size;
        return end;
    }
    return strlen(code) + 1;    /* PTX text */
}

/* Parses a fatbinary wrapper (what nvcc registers), or the code forms that
 * cudaLibraryLoadData accepts: a raw fatbinary, a cubin, or PTX text. */
static struct parsed *parse(const void *wrapper)
{
    pthread_mutex_lock(&cache_lock);
    struct parsed *pm;
    for (pm = cache; pm; pm = pm->next)
        if (pm->wrapper == wrapper)
            break;
    if (!pm && (pm = calloc(1, sizeof *pm)) != NULL) {
        pm->wrapper = wrapper;
        const unsigned char *w = wrapper;
        if (w && rd32(w) == WRAPPER_MAGIC) {
            const unsigned char *data;
            memcpy(&data, w + 8, sizeof data);
            add_entries(pm, data);
            if (rd32(w + 4) == 2) {
                void **prelinked;
                memcpy(&prelinked, w + 16, sizeof prelinked);
                for (int i = 0; prelinked && prelinked[i]; i++)
                    add_entries(pm, prelinked[i]);
            }
        } else if (w && rd32(w) == FATBIN_MAGIC) {
            add_entries(pm, w);
        } else if (w && is_elf(w)) {
            pm->images[0].kind = KIND_ELF;
            pm->images[0].data = w;
            pm->images[0].len = simdev_code_size(w);
            pm->nimages = 1;
        } else if (w) {
            pm->images[0].kind = KIND_PTX;
            pm->images[0].data = w;
            pm->images[0].len = strlen((const char *)w);
            pm->nimages = 1;
        }
        pm->next = cache;
        cache = pm;
    }
    pthread_mutex_unlock(&cache_lock);
    return pm;
}

void simdev_fatbin_forget(const void *wrapper)
{
    pthread_mutex_lock(&cache_lock);
    for (struct parsed **pp = &cache; *pp; pp = &(*pp)->next)
        if ((*pp)->wrapper == wrapper) {
            struct parsed *pm = *pp;
            *pp = pm->next;
            for (int i = 0; i < pm->nimages; i++)
                free(pm->images[i].owned);
            free(pm);
            break;
        }
    pthread_mutex_unlock(&cache_lock);
}

/* ---- ELF cubins ---------------------------------------------------------- */

static const Elf64_Shdr *section(const struct image *im, unsigned i)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->data;
    if (i >= eh->e_shnum || eh->e_shoff + (uint64_t)(i + 1) * sizeof(Elf64_Shdr) > im->len)
        return NULL;
    return (const Elf64_Shdr *)(im->data + eh->e_shoff) + i;
}

static int elf_ok(const struct image *im)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->data;
    return im->kind == KIND_ELF && im->len >= sizeof *eh &&
           memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
           eh->e_shentsize == sizeof(Elf64_Shdr);
}

static const char *section_name(const struct image *im, const Elf64_Shdr *sh)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->data;
    const Elf64_Shdr *strs = section(im, eh->e_shstrndx);
    if (!strs || strs->sh_offset + strs->sh_size > im->len || sh->sh_name >= strs->sh_size)
        return "";
    return (const char *)im->data + strs->sh_offset + sh->sh_name;
}

static int cubin_layout(const struct image *im, const char *kernel,
                        struct simdev_param_layout *out)
{
    if (!elf_ok(im))
        return 0;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->data;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sh = section(im, i);
        if (!sh)
            return 0;
        const char *name = section_name(im, sh);
        if (strncmp(name, ".nv.info.", 9) != 0 || strcmp(name + 9, kernel) != 0)
            continue;
        if (sh->sh_offset + sh->sh_size > im->len)
            return 0;
        memset(out, 0, sizeof *out);
        size_t cbank_size = 0;
        const unsigned char *p = im->data + sh->sh_offset, *end = p + sh->sh_size;
        while (p + 4 <= end) {
            int fmt = p[0], attr = p[1];
            size_t len = fmt == EIFMT_SVAL ? rd16(p + 2) : 0;
            if (p + 4 + len > end)
                break;
            if (fmt == EIFMT_SVAL && attr == EIATTR_KPARAM_INFO && len >= 12) {
                unsigned ordinal = rd16(p + 8), offset = rd16(p + 10);
                unsigned size = (rd32(p + 12) >> 18) & 0x3fff;
                if (ordinal >= SIMDEV_MAX_PARAMS) {
                    simdev_log("kernel %s has more than %d parameters", kernel, SIMDEV_MAX_PARAMS);
                    return 0;
                }
                out->offset[ordinal] = (uint16_t)offset;
                out->size[ordinal] = (uint16_t)size;
                if ((int)ordinal + 1 > out->nparams)
                    out->nparams = (int)ordinal + 1;
                if (offset + size > out->total)
                    out->total = offset + size;
            }
            if (fmt == EIFMT_HVAL && attr == EIATTR_CBANK_PARAM_SIZE)
                cbank_size = rd16(p + 2);
            p += 4 + len;
        }
        if (cbank_size > out->total)
            return 0;           /* parameters without per-parameter records */
        out->known = 1;
        return 1;
    }
    return 0;
}

static int cubin_var_init(const struct image *im, const char *var, void *dst, size_t size)
{
    if (!elf_ok(im))
        return 0;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->data;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sh = section(im, i);
        if (!sh || sh->sh_type != SHT_SYMTAB || sh->sh_entsize != sizeof(Elf64_Sym))
            continue;
        const Elf64_Shdr *strs = section(im, sh->sh_link);
        if (!strs || sh->sh_offset + sh->sh_size > im->len ||
            strs->sh_offset + strs->sh_size > im->len)
            return 0;
        const Elf64_Sym *syms = (const Elf64_Sym *)(im->data + sh->sh_offset);
        size_t n = sh->sh_size / sizeof *syms;
        for (size_t j = 0; j < n; j++) {
            if (syms[j].st_name >= strs->sh_size ||
                strcmp((const char *)im->data + strs->sh_offset + syms[j].st_name, var) != 0)
                continue;
            const Elf64_Shdr *home = section(im, syms[j].st_shndx);
            if (!home)
                return 0;
            if (home->sh_type == SHT_NOBITS)
                return 1;       /* zero-initialised */
            uint64_t off = syms[j].st_value - home->sh_addr;
            size_t n_copy = syms[j].st_size < size ? syms[j].st_size : size;
            if (off + n_copy > home->sh_size || home->sh_offset + home->sh_size > im->len)
                return 0;
            memcpy(dst, im->data + home->sh_offset + off, n_copy);
            return 1;
        }
    }
    return 0;
}

/* ---- PTX ----------------------------------------------------------------- */

static size_t ptx_type_size(const char *t)
{
    if (!strncmp(t, "b8", 2) || !strncmp(t, "u8", 2) || !strncmp(t, "s8", 2))
        return 1;
    if (!strncmp(t, "b16", 3) || !strncmp(t, "u16", 3) || !strncmp(t, "s16", 3) ||
        !strncmp(t, "f16", 3))
        return 2;
    if (!strncmp(t, "b32", 3) || !strncmp(t, "u32", 3) || !strncmp(t, "s32", 3) ||
        !strncmp(t, "f32", 3))
        return 4;
    if (!strncmp(t, "b64", 3) || !strncmp(t, "u64", 3) || !strncmp(t, "s64", 3) ||
        !strncmp(t, "f64", 3))
        return 8;
    return 0;
}

static int ptx_layout(const struct image *im, const char *kernel,
                      struct simdev_param_layout *out)
{
    if (im->kind != KIND_PTX)
        return 0;
    const char *text = (const char *)im->data;
    size_t klen = strlen(kernel);
    const char *p = text;
    while ((p = strstr(p, ".entry ")) != NULL) {
        p += 7;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, kernel, klen) != 0 || (p[klen] != '(' && !isspace((unsigned char)p[klen]))) {
            continue;
        }
        p += klen;
        while (isspace((unsigned char)*p))
            p++;
        memset(out, 0, sizeof *out);
        out->known = 1;
        if (*p != '(')
            return 1;           /* no parameters */
        const char *close = strchr(p, ')');
        if (!close)
            return 0;
        size_t offset = 0;
        const char *q = p + 1;
        while (q < close) {
            const char *param = strstr(q, ".param");
            if (!param || param > close)
                break;
            const char *stop = memchr(param, ',', (size_t)(close - param));
            if (!stop)
                stop = close;
            size_t align = 0, elem = 0, count = 1;
            for (const char *t = param + 6; t < stop; t++) {
                if (*t == '.' && !strncmp(t, ".align", 6))
                    align = strtoul(t + 6, NULL, 10);
                else if (*t == '.' && !elem)
                    elem = ptx_type_size(t + 1);
                else if (*t == '[')
                    count = strtoul(t + 1, NULL, 10);
            }
            if (!elem || out->nparams >= SIMDEV_MAX_PARAMS)
                return 0;
            if (!align)
                align = elem;
            offset = (offset + align - 1) / align * align;
            out->offset[out->nparams] = (uint16_t)offset;
            out->size[out->nparams] = (uint16_t)(elem * count);
            offset += elem * count;
            out->nparams++;
            q = stop + 1;
        }
        out->total = offset;
        return 1;
    }
    return 0;
}

int simdev_fatbin_param_layout(const void *wrapper, const char *kernel,
                               struct simdev_param_layout *out)
{
    struct parsed *pm = parse(wrapper);
    if (!pm)
        return 0;
    for (int i = 0; i < pm->nimages; i++)
        if (cubin_layout(&pm->images[i], kernel, out))
            return 1;
    for (int i = 0; i < pm->nimages; i++)
        if (ptx_layout(&pm->images[i], kernel, out))
            return 1;
    return 0;
}

int simdev_fatbin_var_init(const void *wrapper, const char *var, void *dst, size_t size)
{
    struct parsed *pm = parse(wrapper);
    if (!pm)
        return 0;
    for (int i = 0; i < pm->nimages; i++)
        if (cubin_var_init(&pm->images[i], var, dst, size))
            return 1;
    return 0;
}

/* Calls fn(name) once per kernel the images define (cubin .nv.info.<kernel>
 * sections, else PTX .entry directives); returns the number of kernels. */
int simdev_fatbin_kernels(const void *wrapper, void (*fn)(const char *name, void *ctx), void *ctx)
{
    struct parsed *pm = parse(wrapper);
    if (!pm)
        return 0;
    int count = 0;
    for (int i = 0; i < pm->nimages && count == 0; i++) {
        const struct image *im = &pm->images[i];
        if (!elf_ok(im))
            continue;
        const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im->data;
        for (unsigned k = 0; k < eh->e_shnum; k++) {
            const Elf64_Shdr *sh = section(im, k);
            const char *name = sh ? section_name(im, sh) : "";
            if (strncmp(name, ".nv.info.", 9) == 0 && name[9]) {
                fn(name + 9, ctx);
                count++;
            }
        }
    }
    for (int i = 0; i < pm->nimages && count == 0; i++) {
        const struct image *im = &pm->images[i];
        if (im->kind != KIND_PTX)
            continue;
        for (const char *p = (const char *)im->data; (p = strstr(p, ".entry ")) != NULL;) {
            p += 7;
            while (*p == ' ' || *p == '\t')
                p++;
            size_t n = 0;
            while (p[n] && !isspace((unsigned char)p[n]) && p[n] != '(')
                n++;
            char name[512];
            if (n == 0 || n >= sizeof name)
                continue;
            memcpy(name, p, n);
            name[n] = '\0';
            fn(name, ctx);
            count++;
        }
    }
    return count;
}
