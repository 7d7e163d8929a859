// RoPE, CUDA twin of kernels/cpu/rope.h (pairings kNorm and kNeox, linear scaling, llama3
// frequency factors, the attention factor on cos/sin). RopeParams is the CPU struct (a host object:
// its frequencies are computed on the host exactly as the CPU does and copied to the device per
// call).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/rope.h"

namespace kvb::kernels::cuda {
using cpu::RopeParams;
using cpu::RopeStyle;
// x: [n, num_heads, head_dim] device, rotated in place; pos: [n] device.
void rope(float* x, const int32_t* pos, int n, int num_heads, int head_dim,
          const RopeParams& params, cudaStream_t stream = 0);
}  // namespace kvb::kernels::cuda
