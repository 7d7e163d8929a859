// One layer's eviction decision (issue 13 "eviction plans"): what a policy hook returns instead
// of editing a cache. Per cache head: keep everything, keep a list of slots (strictly
// increasing, so position order is preserved), or drop one victim slot. The engine applies the
// plan to the cache index and the K/V storage together (KvCache::apply on the host, the device
// cache's keep_slots on a GPU); the policy compacts its own per-slot state with the same list.
#pragma once

#include <cstdint>
#include <vector>

namespace kvb::kernels {

class EvictionPlan {
 public:
  enum class Kind : uint8_t { kKeepAll, kKeep, kVictim };

  // An empty plan (every head keeps everything) for `num_heads` cache heads of `layer`.
  void reset(int layer, int num_heads);
  int layer() const { return layer_; }
  int num_heads() const { return static_cast<int>(kinds_.size()); }

  // Head `head` keeps `slots` (strictly increasing slot indices; checked when applied). A head
  // gets at most one decision per plan.
  void keep(int head, std::vector<int32_t> slots);
  // Head `head` drops slot `victim` and keeps the rest.
  void evict(int head, int32_t victim);

  Kind kind(int head) const { return kinds_[head]; }
  bool changes_any() const;
  const std::vector<int32_t>& kept(int head) const { return keep_[head]; }
  int32_t victim(int head) const { return victims_[head]; }
  // The slots `head` keeps when it holds `len` slots (keep-all: 0..len-1; a victim: all but it),
  // into *out; and how many that is.
  void keep_list(int head, int len, std::vector<int32_t>* out) const;
  int length_after(int head, int len) const;

 private:
  void decide(int head, Kind kind);

  int layer_ = -1;
  std::vector<Kind> kinds_;
  std::vector<std::vector<int32_t>> keep_;
  std::vector<int32_t> victims_;
};

}  // namespace kvb::kernels
