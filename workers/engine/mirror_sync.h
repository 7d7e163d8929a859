// Host-side bookkeeping of the GPU backend's host mirror (cuda_backend.h), device-agnostic so that
// it is built and unit-tested everywhere (tests/unit/test_mirror_sync.cc): fingerprints tell
// whether a host cache is still the one the device holds. (Keep-lists no longer need deriving:
// policies hand the engine eviction plans, kernels/eviction_plan.h.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kv_cache.h"

namespace kvb::engine {

// What identifies a cache's state cheaply: its address, next position, every head's length,
// last position and last key row. Equal fingerprints with a cache that the caller did not
// replace behind the engine's back mean the device copy is current.
class CacheFingerprint {
 public:
  void capture(kernels::KvCache& cache);
  bool matches(kernels::KvCache& cache) const;
  void reset() { cache_ = nullptr; }

 private:
  const kernels::KvCache* cache_ = nullptr;
  int32_t next_ = -1;
  kernels::KvCacheShape shape_;
  std::vector<int32_t> lengths_, last_pos_;
  std::vector<float> last_key_;  // [layer * heads, head_dim]
};

}  // namespace kvb::engine
