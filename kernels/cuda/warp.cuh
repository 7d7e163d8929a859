// Warp-wide reductions shared by the attention kernels.
#pragma once

namespace kvb::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
// Butterfly: every lane ends with the same bits (each step adds the same two terms).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

}  // namespace kvb::kernels::cuda
