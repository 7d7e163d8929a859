// RoPE, CUDA twin of kernels/cpu/rope.h (pairings kNorm and kNeox, linear scaling, llama3
// frequency factors, the attention factor on cos/sin). RopeParams is the CPU struct (a host object:
// its frequencies are computed on the host exactly as the CPU does and copied to the device per
// call, or once into a RopeTable, whose calls copy nothing: the engine's, every layer of every
// step).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
using cpu::RopeParams;
using cpu::RopeStyle;
// x: [n, num_heads, head_dim] device, rotated in place; pos: [n] device.
void rope(float* x, const int32_t* pos, int n, int num_heads, int head_dim,
          const RopeParams& params, cudaStream_t stream = 0);

// RopeParams and the head_dim they rotate, checked as rope() checks them, with the frequencies
// uploaded once (synchronously, at construction) to the current device.
class RopeTable {
 public:
  RopeTable(const RopeParams& params, int head_dim);
  const RopeParams& params() const { return params_; }
  int head_dim() const { return head_dim_; }
  const float* inv_freq() const { return inv_freq_.data(); }  // device [rot_dim / 2]

 private:
  RopeParams params_;
  int head_dim_;
  DeviceBuffer<float> inv_freq_;
};

// rope() with the table's parameters and frequencies: the same bits, no copy.
void rope(float* x, const int32_t* pos, int n, int num_heads, const RopeTable& table,
          cudaStream_t stream = 0);
}  // namespace kvb::kernels::cuda
