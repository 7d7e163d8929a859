// Launch planning shared by the decode kernels that size their grid to the device
// (attention_decode_stream.cu, attention_decode_mma.cu): the device's limits, queried once per
// thread and device, and a kernel readied for a dynamic shared-memory size with the number of
// its blocks a multiprocessor holds (occupancy API). Host code; internal to kernels/cuda.
#pragma once

#include <cstddef>

namespace kvb::kernels::cuda {

struct DeviceLimits {
  int major = 0;  // compute capability
  int sms = 0;    // multiprocessors
  int optin = 0;  // shared memory a block may opt in to, bytes
};
// `device`'s limits (every decode layer plans: cached per thread).
const DeviceLimits& device_limits(int device);

// Readies `kernel` on the current device (`device`) for launches of `threads` threads and `smem`
// bytes of dynamic shared memory and returns how many of its blocks fit on a multiprocessor. The
// attributes are per device and kernel: the opt-in above 48 KiB (raised to the largest size asked
// for so far, never lowered under a size already planned) and the carveout: all the shared memory
// the multiprocessor has (the driver's default may keep more L1 and fit fewer blocks; these
// kernels read through cp.async.cg, which skips L1). Once per (device, kernel, size); a kernel is
// always launched with the same `threads`.
int ready_kernel(const void* kernel, int threads, int device, size_t smem);

// A split-K grid: every KV head's keys in chunks of `chunk` keys (whole tiles of `tile` keys),
// `splits` chunks covering the longest head (max_len >= 1). At most `target` blocks over the
// num_kv_heads heads (at least one chunk a head), and at least min_tiles tiles a chunk where
// the longest head has them.
struct SplitGrid {
  int splits = 0;
  int chunk = 0;
};
SplitGrid split_grid(int target, int num_kv_heads, int max_len, int tile, int min_tiles);

// How a split-K decode kernel runs a layer.
struct DecodeGridPlan {
  int splits = 0;  // 0: the kernel planned for does not take this layer
  int chunk = 0;   // keys per block (whole tiles)
  size_t smem = 0;
  int device = 0;         // the device planned for (its kernels' shared-memory opt-in)
  int blocks_per_sm = 0;  // blocks of the kernel a multiprocessor holds (occupancy API)
};
// The plan of `kernel` (launched with `threads` threads and `smem` bytes of dynamic shared
// memory) on the current device: none below compute capability 8.0 (cp.async, bf16 mma) or
// where smem exceeds the block opt-in; otherwise the kernel readied (ready_kernel) and the
// split_grid of about decode_blocks blocks (0: as many as fit on every multiprocessor at once).
DecodeGridPlan plan_decode_grid(const void* kernel, int threads, size_t smem, int decode_blocks,
                                int num_kv_heads, int max_len, int tile, int min_tiles);

}  // namespace kvb::kernels::cuda
