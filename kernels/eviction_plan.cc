// EvictionPlan: per-head keep lists or victims of one layer.
#include "kernels/eviction_plan.h"

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace kvb::kernels {

void EvictionPlan::reset(int layer, int num_heads) {
  KVB_CHECK(num_heads >= 0) << "eviction plan for " << num_heads << " heads";
  layer_ = layer;
  kinds_.assign(num_heads, Kind::kKeepAll);
  keep_.resize(num_heads);
  for (auto& k : keep_) k.clear();
  victims_.assign(num_heads, -1);
  device_slots_ = nullptr;
  device_ld_ = 0;
  device_counts_.clear();
  channel_heads_.clear();
  channels_.resize(num_heads);
  for (auto& c : channels_) c.clear();
  channels_below_.assign(num_heads, 0);
}

void EvictionPlan::zero_key_channels(int head, std::vector<int32_t> channels, int32_t below) {
  KVB_CHECK(head >= 0 && head < num_heads())
      << "eviction plan of layer " << layer_ << ": channels of head " << head << " outside [0, "
      << num_heads() << ")";
  KVB_CHECK(!changes_slots()) << "eviction plan of layer " << layer_
                              << ": key channels beside token decisions";
  KVB_CHECK(std::find(channel_heads_.begin(), channel_heads_.end(), head) ==
            channel_heads_.end())
      << "eviction plan of layer " << layer_ << ": head " << head << "'s channels decided twice";
  if (channels.empty()) return;
  channel_heads_.push_back(head);
  channels_[head] = std::move(channels);
  channels_below_[head] = below;
}

void EvictionPlan::keep_on_device(const int32_t* slots, int ld, std::vector<int32_t> counts,
                                  std::span<const int32_t> lengths) {
  KVB_CHECK(slots != nullptr && ld >= 0 && static_cast<int>(counts.size()) == num_heads() &&
            static_cast<int>(lengths.size()) == num_heads())
      << "eviction plan of layer " << layer_ << ": device lists for " << counts.size() << " of "
      << num_heads() << " heads";
  KVB_CHECK(!changes_any()) << "eviction plan of layer " << layer_
                            << ": device lists beside host decisions";
  for (int h = 0; h < num_heads(); ++h) {
    KVB_CHECK(counts[h] >= 0 && counts[h] <= lengths[h] && lengths[h] <= ld)
        << "eviction plan of layer " << layer_ << ": head " << h << " keeps " << counts[h]
        << " of " << lengths[h] << " slots (lists of " << ld << ")";
    if (counts[h] < lengths[h]) kinds_[h] = Kind::kDevice;
  }
  device_slots_ = slots;
  device_ld_ = ld;
  device_counts_ = std::move(counts);
}

void EvictionPlan::decide(int head, Kind kind) {
  KVB_CHECK(head >= 0 && head < num_heads())
      << "eviction plan of layer " << layer_ << ": head " << head << " outside [0, "
      << num_heads() << ")";
  KVB_CHECK(kinds_[head] == Kind::kKeepAll)
      << "eviction plan of layer " << layer_ << ": head " << head << " decided twice";
  KVB_CHECK(!on_device()) << "eviction plan of layer " << layer_
                          << ": a host decision beside device lists";
  KVB_CHECK(!prunes_channels()) << "eviction plan of layer " << layer_
                                << ": a token decision beside key channels";
  kinds_[head] = kind;
}

void EvictionPlan::keep(int head, std::vector<int32_t> slots) {
  decide(head, Kind::kKeep);
  keep_[head] = std::move(slots);
}

void EvictionPlan::drop(int head, int first, int count, int len) {
  KVB_CHECK(first >= 0 && count >= 0 && first + count <= len)
      << "eviction plan of layer " << layer_ << ": head " << head << " drops [" << first << ", "
      << first + count << ") of " << len << " slots";
  if (count == 0) return;
  if (count == 1) {
    evict(head, first);
    return;
  }
  std::vector<int32_t> kept;
  kept.reserve(len - count);
  for (int s = 0; s < first; ++s) kept.push_back(s);
  for (int s = first + count; s < len; ++s) kept.push_back(s);
  keep(head, std::move(kept));
}

void EvictionPlan::evict(int head, int32_t victim) {
  decide(head, Kind::kVictim);
  victims_[head] = victim;
}

bool EvictionPlan::changes_slots() const {
  for (Kind k : kinds_) {
    if (k != Kind::kKeepAll) return true;
  }
  return false;
}

bool EvictionPlan::changes_any() const { return changes_slots() || prunes_channels(); }

void EvictionPlan::keep_list(int head, int len, std::vector<int32_t>* out) const {
  out->clear();
  switch (kinds_[head]) {
    case Kind::kKeep:
      *out = keep_[head];
      return;
    case Kind::kVictim:
      KVB_CHECK(victims_[head] >= 0 && victims_[head] < len)
          << "eviction plan of layer " << layer_ << ": head " << head << " evicts slot "
          << victims_[head] << " of " << len;
      out->reserve(len > 0 ? len - 1 : 0);
      for (int s = 0; s < len; ++s) {
        if (s != victims_[head]) out->push_back(s);
      }
      return;
    case Kind::kKeepAll:
      out->reserve(len);
      for (int s = 0; s < len; ++s) out->push_back(s);
      return;
    case Kind::kDevice:
      KVB_FAIL() << "eviction plan of layer " << layer_ << ": head " << head
                 << "'s keep list is on the device";
  }
}

int EvictionPlan::length_after(int head, int len) const {
  switch (kinds_[head]) {
    case Kind::kKeep: return static_cast<int>(keep_[head].size());
    case Kind::kVictim: return len - 1;
    case Kind::kKeepAll: return len;
    case Kind::kDevice: return device_counts_[head];
  }
  return len;
}

}  // namespace kvb::kernels
