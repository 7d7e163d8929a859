// Device pieces of the selection total order (kernels/cpu/select.h): the score key, a
// block-wide radix select of the k-th largest 64-bit key and a block-wide ordered compaction.
// Included by select.cu and budget.cu only.
#pragma once

#include <cstdint>

namespace kvb::kernels::cuda::detail {

// cpu::score_order_key on the device: larger score -> larger key; NaN -> 0; -0 == +0.
__device__ __forceinline__ uint32_t order_key(float score) {
  if (score != score) return 0u;
  if (score == 0.0f) score = 0.0f;
  const uint32_t bits = __float_as_uint(score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// (score key << 32 | index): distinct per index, so "the k largest" is one set and equal
// scores rank by index (the more recent token wins).
__device__ __forceinline__ uint64_t rank_key(float score, int index) {
  return (static_cast<uint64_t>(order_key(score)) << 32) | static_cast<uint32_t>(index);
}

struct RadixShared {
  unsigned hist[256];
  uint64_t prefix;
  int remaining;
};

// The k-th largest (1 <= k <= number of valid candidates) of the keys key_of(i, &valid),
// i in [0, m), counting duplicates with their multiplicity: 8 passes of 8-bit digits, most
// significant first, each a shared-memory histogram over the candidates still matching the
// prefix. Every thread of the block must call it; every thread gets the result.
template <typename KeyFn>
__device__ uint64_t block_kth_largest(KeyFn key_of, int m, int k, RadixShared& sh) {
  uint64_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      bool valid = false;
      const uint64_t key = key_of(i, &valid);
      if (valid && (key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, digit = 255;
      for (; digit > 0; --digit) {
        if (above + static_cast<int>(sh.hist[digit]) >= remaining) break;
        above += sh.hist[digit];
      }
      sh.prefix = prefix | (static_cast<uint64_t>(digit) << shift);
      sh.remaining = remaining - above;
    }
    __syncthreads();
    prefix = sh.prefix;
    remaining = sh.remaining;
    mask |= uint64_t{255} << shift;
    __syncthreads();  // everyone has read sh before the next pass clears it
  }
  return prefix;
}

struct ScanShared {
  int warp_totals[32];
  int base;
};

// Writes, in increasing i, every offset + i (i in [0, m)) with take(i) to out[0..]; returns the
// count (all threads). One chunk of blockDim indices at a time: ballot within warps, warp offsets
// through shared memory. blockDim.x must be a multiple of 32.
template <typename TakeFn>
__device__ int block_ordered_compact(TakeFn take, int m, int offset, int32_t* out, ScanShared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x == 0) sh.base = 0;
  __syncthreads();
  for (int c0 = 0; c0 < m; c0 += blockDim.x) {
    const int i = c0 + threadIdx.x;
    const bool t = i < m && take(i);
    const unsigned ballot = __ballot_sync(0xffffffffu, t);
    if (lane == 0) sh.warp_totals[warp] = __popc(ballot);
    __syncthreads();
    int before = sh.base;
    for (int w = 0; w < warp; ++w) before += sh.warp_totals[w];
    if (t) out[before + __popc(ballot & ((1u << lane) - 1u))] = offset + i;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < warps; ++w) sh.base += sh.warp_totals[w];
    }
    __syncthreads();
  }
  return sh.base;
}

}  // namespace kvb::kernels::cuda::detail
