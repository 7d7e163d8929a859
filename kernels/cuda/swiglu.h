// SwiGLU and GeGLU (tanh GELU), CUDA twins of kernels/cpu/swiglu.h: gate = act(gate) * up.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace kvb::kernels::cuda {
// Device pointers. gate: [n] (overwritten with the result); up: [n].
void swiglu(float* gate, const float* up, size_t n, cudaStream_t stream = 0);
void geglu_tanh(float* gate, const float* up, size_t n, cudaStream_t stream = 0);
}  // namespace kvb::kernels::cuda
