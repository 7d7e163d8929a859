// Launch planning of the grid-sized decode kernels: see kernel_ready.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/cuda/kernel_ready.h"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {

const DeviceLimits& device_limits(int device) {
  thread_local int cached = -1;
  thread_local DeviceLimits dl;
  if (device != cached) {
    KVB_CUDA_CHECK(cudaDeviceGetAttribute(&dl.major, cudaDevAttrComputeCapabilityMajor, device));
    KVB_CUDA_CHECK(cudaDeviceGetAttribute(&dl.sms, cudaDevAttrMultiProcessorCount, device));
    KVB_CUDA_CHECK(
        cudaDeviceGetAttribute(&dl.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cached = device;
  }
  return dl;
}

int ready_kernel(const void* kernel, int threads, int device, size_t smem) {
  // Every decode layer asks again for the same answer: the thread's last one without the lock.
  thread_local std::tuple<int, const void*, size_t> last_key{-1, nullptr, 0};
  thread_local int last_fit = 0;
  if (last_key == std::make_tuple(device, kernel, smem)) return last_fit;
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> opted;  // the opt-in set so far
  static std::map<std::tuple<int, const void*, size_t>, int> fits;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, kernel, smem);
  if (const auto it = fits.find(key); it != fits.end()) {
    last_key = key;
    last_fit = it->second;
    return last_fit;
  }
  size_t& opt = opted[{device, kernel}];
  if (opt == 0) {
    KVB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  }
  if (smem > 48 * 1024 && smem > opt) {
    KVB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  opt = std::max({opt, smem, size_t{1}});
  int blocks = 0;
  KVB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  fits[key] = blocks;
  last_key = key;
  last_fit = blocks;
  return blocks;
}

SplitGrid split_grid(int target, int num_kv_heads, int max_len, int tile, int min_tiles) {
  // At most `target` blocks (rounded down, at least one chunk a head): a grid sized to what the
  // device holds at once must not spill a few blocks into a second wave (132 multiprocessors
  // over 8 heads: 16 chunks a head, 128 blocks, not 17 and 136, whose last 4 would run alone).
  const int by_blocks = std::max(1, target / std::max(num_kv_heads, 1));
  const int tiles = (max_len + tile - 1) / tile;
  const int splits = std::min(by_blocks, std::max(1, tiles / std::max(min_tiles, 1)));
  SplitGrid g;
  g.chunk = (tiles + splits - 1) / splits * tile;
  g.splits = (max_len + g.chunk - 1) / g.chunk;
  return g;
}

DecodeGridPlan plan_decode_grid(const void* kernel, int threads, size_t smem, int decode_blocks,
                                int num_kv_heads, int max_len, int tile, int min_tiles) {
  DecodeGridPlan p;
  int device = 0;
  KVB_CUDA_CHECK(cudaGetDevice(&device));
  const DeviceLimits& dl = device_limits(device);
  if (dl.major < 8 || smem > static_cast<size_t>(dl.optin)) return p;
  const int fit = ready_kernel(kernel, threads, device, smem);
  if (fit < 1) return p;
  const SplitGrid g = split_grid(decode_blocks > 0 ? decode_blocks : fit * std::max(dl.sms, 1),
                                 num_kv_heads, max_len, tile, min_tiles);
  p.splits = g.splits;
  p.chunk = g.chunk;
  p.smem = smem;
  p.device = device;
  p.blocks_per_sm = fit;
  return p;
}

}  // namespace kvb::kernels::cuda
