// SwiGLU and GeGLU (tanh GELU), CUDA twins of kernels/cpu/swiglu.h: gate = act(gate) * up.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace kvb::kernels::cuda {
// Device pointers. gate: [n] (overwritten with the result); up: [n].
void swiglu(float* gate, const float* up, size_t n, cudaStream_t stream = 0);
void geglu_tanh(float* gate, const float* up, size_t n, cudaStream_t stream = 0);
// The same on a stacked gate|up product: out[t, j] = act(in[t, j]) * in[t, h + j] for t < n,
// j < h (in: [n, 2h]; the same bits as swiglu / geglu_tanh on the split rows); out16
// (nullable, [n, h]): out rounded to bf16 as f32_to_bf16 rounds it (the down projection's
// input), in the same launch.
void glu_stacked(float* out, __nv_bfloat16* out16, const float* in, int n, int h, bool gelu_tanh,
                 cudaStream_t stream = 0);
}  // namespace kvb::kernels::cuda
