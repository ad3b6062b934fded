/* elfsym.c -- looking a function up in the static symbol table (.symtab) of
 * an ELF file that is loaded in this process.
 *
 * dlsym only sees dynamic symbols, and an executable exports none unless it
 * is linked with -rdynamic.  Host twins defined in the program itself are in
 * its .symtab (unless it was stripped); their run-time address is the
 * object's load bias plus the symbol value. */

#include <elf.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "simdev.h"

void *simdev_elf_symbol(const char *path, uintptr_t load_bias, const char *name)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(Elf64_Ehdr))
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return NULL;

    const unsigned char *base = map;
    size_t len = (size_t)st.st_size;
    const Elf64_Ehdr *eh = map;
    void *result = NULL;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shentsize != sizeof(Elf64_Shdr) ||
        eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > len)
        goto out;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(base + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum && !result; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
            continue;
        const Elf64_Shdr *strs = &sh[sh[i].sh_link];
        if (sh[i].sh_offset + sh[i].sh_size > len || strs->sh_offset + strs->sh_size > len)
            continue;
        const Elf64_Sym *syms = (const Elf64_Sym *)(base + sh[i].sh_offset);
        size_t n = sh[i].sh_size / sizeof *syms;
        for (size_t j = 0; j < n; j++) {
            if (syms[j].st_shndx == SHN_UNDEF || syms[j].st_name >= strs->sh_size ||
                ELF64_ST_TYPE(syms[j].st_info) != STT_FUNC)
                continue;
            if (strcmp((const char *)base + strs->sh_offset + syms[j].st_name, name) == 0) {
                uintptr_t addr = syms[j].st_value;
                if (eh->e_type == ET_DYN)
                    addr += load_bias;
                result = (void *)addr;
                break;
            }
        }
    }
out:
    munmap(map, len);
    return result;
}
