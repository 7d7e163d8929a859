// One layer's eviction decision (issue 13 "eviction plans"): what a policy hook returns instead
// of editing a cache. Per cache head: keep everything, keep a list of slots (strictly
// increasing, so position order is preserved), or drop one victim slot. The engine applies the
// plan to the cache index and the K/V storage together (KvCache::apply on the host, the device
// cache's keep_slots on a GPU); the policy compacts its own per-slot state with the same list.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvb::kernels {

class EvictionPlan {
 public:
  // kDevice: the head's keep list is on a device (keep_on_device).
  enum class Kind : uint8_t { kKeepAll, kKeep, kVictim, kDevice };

  // An empty plan (every head keeps everything) for `num_heads` cache heads of `layer`.
  void reset(int layer, int num_heads);
  int layer() const { return layer_; }
  int num_heads() const { return static_cast<int>(kinds_.size()); }

  // Head `head` keeps `slots` (strictly increasing slot indices; checked when applied). A head
  // gets at most one decision per plan.
  void keep(int head, std::vector<int32_t> slots);
  // Head `head` drops slot `victim` and keeps the rest.
  void evict(int head, int32_t victim);
  // Head `head`, holding len slots, drops the run [first, first + count) and keeps the rest in
  // order: nothing when count is 0, one victim when it is 1 (a decode step at the budget: a
  // device applies it without a keep list), else the keep list. Both forms leave the same cache.
  void drop(int head, int first, int count, int len);
  // A device instance of the policy ops (policy_ops.h) decided on the device: `slots` is device
  // memory [num_heads, ld] whose row h holds head h's keep list (strictly increasing; the
  // heads that keep everything hold 0..len-1), counts[h] its length, host-known by the policy's
  // law. Heads whose count is below their length become kDevice; `slots` must stay valid until
  // the plan is applied. A plan holds device lists or host decisions, not both.
  void keep_on_device(const int32_t* slots, int ld, std::vector<int32_t> counts,
                      std::span<const int32_t> lengths);
  bool on_device() const { return device_slots_ != nullptr; }
  const int32_t* device_slots() const { return device_slots_; }
  int device_ld() const { return device_ld_; }
  const std::vector<int32_t>& device_counts() const { return device_counts_; }

  // Key channels (ThinK, POLICIES.md `think`): head `head` sets `channels` (strictly increasing,
  // below head_dim: checked when applied) of the key rows of every slot it holds once the plan's
  // token decisions are applied to zero, and those slots are the ones whose position is below
  // `below` (the prompt's). A head's channels are pruned once per sequence. A plan that prunes
  // channels holds no token decisions (the engine applies a layer's token plan first, then asks
  // for its channels: Policy::on_prefill_channels).
  void zero_key_channels(int head, std::vector<int32_t> channels, int32_t below);
  bool prunes_channels() const { return !channel_heads_.empty(); }
  // The heads given channels, in the order given; head h's channels and their position bound.
  const std::vector<int32_t>& channel_heads() const { return channel_heads_; }
  const std::vector<int32_t>& key_channels(int head) const { return channels_[head]; }
  int32_t channels_below(int head) const { return channels_below_[head]; }

  Kind kind(int head) const { return kinds_[head]; }
  // Whether any head's slots or key channels change.
  bool changes_any() const;
  // Whether any head's slots change.
  bool changes_slots() const;
  const std::vector<int32_t>& kept(int head) const { return keep_[head]; }
  int32_t victim(int head) const { return victims_[head]; }
  // The slots `head` keeps when it holds `len` slots (keep-all: 0..len-1; a victim: all but it),
  // into *out (not for kDevice heads: their list is on the device); and how many that is.
  void keep_list(int head, int len, std::vector<int32_t>* out) const;
  int length_after(int head, int len) const;

 private:
  void decide(int head, Kind kind);

  int layer_ = -1;
  std::vector<Kind> kinds_;
  std::vector<std::vector<int32_t>> keep_;
  std::vector<int32_t> victims_;
  const int32_t* device_slots_ = nullptr;
  int device_ld_ = 0;
  std::vector<int32_t> device_counts_;
  std::vector<int32_t> channel_heads_;
  std::vector<std::vector<int32_t>> channels_;
  std::vector<int32_t> channels_below_;
};

}  // namespace kvb::kernels
