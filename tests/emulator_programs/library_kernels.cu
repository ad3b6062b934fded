// library_kernels.cu -- device code that cudart_basic loads at run time with
// cudaLibraryLoadFromFile (built by the tests as a fatbinary, a cubin and
// PTX).  The host twins are in twins_lib.c.
extern "C" __global__ void lib_scale(float *p, float s, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] *= s;
}

extern "C" __global__ void lib_add(float *p, double d, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += (float)d;
}
