// What cuda::attention's kernels share (attention.cu, attention_decode_grouped.cu): the block
// shape, the launch's common arguments and the sliding window's first visible key. Internal to
// the attention kernels.
#pragma once

#include <cstdint>

namespace kvb::kernels::cuda::attn {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

struct Common {
  const float* q;
  const int32_t* offsets;
  const int32_t* lengths;
  int n, num_heads, group, d;
  float scale;
  int window;  // > 0: a query sees only the last `window` of its visible keys
};

// The first key a query with `visible` keys sees.
__device__ __forceinline__ int first_visible(const Common& c, int visible) {
  return c.window > 0 ? max(0, visible - c.window) : 0;
}

}  // namespace kvb::kernels::cuda::attn
