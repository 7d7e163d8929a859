// Host-side bookkeeping of the GPU engine's host mirror (cuda_engine.h), device-agnostic so that
// it is built and unit-tested everywhere (tests/unit/test_mirror_sync.cc):
//  - keep-lists: a policy hook edits one layer of the mirror with KvCache::keep_slots; the
//    device cache must apply the same edit. Slots of a head are in increasing position order
//    and positions are unique, so the kept slot indices follow from the positions before and
//    after the hook by a merge.
//  - fingerprints: whether a host cache is still the one the device holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kv_cache.h"

namespace kvb::engine {

// The positions of every head of one layer: head h holds pos[off[h] .. off[h + 1]).
struct LayerPositions {
  std::vector<int32_t> pos;
  std::vector<size_t> off;
};
void snapshot_positions(kernels::KvCache& cache, int layer, LayerPositions* out);

// Per-head kept slot lists turning the layer as `before` into the layer of `after`:
// slots[h * ld + j], j < counts[h] (unchanged heads get their identity list). Returns false,
// leaving the outputs alone, when no head changed length. Throws kvb::Error when `after`
// holds a position that `before` did not (keep_slots only removes).
bool derive_keep_lists(const LayerPositions& before, kernels::KvCache& after, int layer,
                       std::vector<int32_t>* slots, std::vector<int32_t>* counts, int* ld);

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
