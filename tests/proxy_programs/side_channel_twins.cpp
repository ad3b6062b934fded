// side_channel_twins.cpp -- examples/cuda_mlp's host twins, except that one
// kernel keeps hidden state between launches: a launch counter that nudges
// the gradient it writes.  On a GPU the same would be a kernel that reads a
// clock or keeps a counter the program never copies: device behaviour the
// call log cannot capture, so a replay of a minibatch does not reproduce it.
// tests/test_proxy_recovery.py uses it to check that replay validation
// (interpose/remote/recover.c) catches such a program and turns transparent
// recovery off, while a run without failures still ends exactly as directly.
#define mlp_backward_output__host mlp_backward_output__host_plain
#include "../../examples/cuda_mlp/mlp_twins.cpp"
#undef mlp_backward_output__host

extern "C" void mlp_backward_output__host(dim3 grid, dim3 block, size_t shared_mem, void **args)
{
    static unsigned launches;  // the hidden state
    mlp_backward_output__host_plain(grid, block, shared_mem, args);
    float *grad = *static_cast<float **>(args[4]);  // (batch, inv_n, act, err, grad)
    grad[mlp::kB2] += 1e-3f * (float)(++launches % 5);  // the bias gradient this kernel writes
}
