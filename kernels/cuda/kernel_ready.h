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

}  // namespace kvb::kernels::cuda
