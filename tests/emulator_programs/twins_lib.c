/* twins_lib.c -- host twins kept in a separate shared library, loaded by the
 * emulator from JITCKPT_SIMDEV_KERNELS.  Plain C: a twin only needs dim3. */
#include <stddef.h>
#include <vector_types.h>

/* Twin of `__global__ void ext_scale(float *p, float s, int n)` in
 * cudart_basic.cu (registered as _Z9ext_scalePffi). */
void _Z9ext_scalePffi__host(dim3 grid, dim3 block, size_t shared_mem, void **args)
{
    (void)shared_mem;
    float *p = *(float **)args[0];
    float s = *(float *)args[1];
    int n = *(int *)args[2];
    for (unsigned b = 0; b < grid.x; b++)
        for (unsigned t = 0; t < block.x; t++) {
            int i = (int)(b * block.x + t);
            if (i < n)
                p[i] *= s;
        }
}

/* Twins of the kernels in library_kernels.cu (extern "C": plain names). */
void lib_scale__host(dim3 grid, dim3 block, size_t shared_mem, void **args)
{
    _Z9ext_scalePffi__host(grid, block, shared_mem, args);   /* same parameters */
}

void lib_add__host(dim3 grid, dim3 block, size_t shared_mem, void **args)
{
    (void)shared_mem;
    float *p = *(float **)args[0];
    double d = *(double *)args[1];
    int n = *(int *)args[2];
    for (unsigned i = 0; i < grid.x * block.x; i++)
        if ((int)i < n)
            p[i] += (float)d;
}
