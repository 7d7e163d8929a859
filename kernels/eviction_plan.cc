// EvictionPlan: per-head keep lists or victims of one layer.
#include "kernels/eviction_plan.h"

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
}

void EvictionPlan::decide(int head, Kind kind) {
  KVB_CHECK(head >= 0 && head < num_heads())
      << "eviction plan of layer " << layer_ << ": head " << head << " outside [0, "
      << num_heads() << ")";
  KVB_CHECK(kinds_[head] == Kind::kKeepAll)
      << "eviction plan of layer " << layer_ << ": head " << head << " decided twice";
  kinds_[head] = kind;
}

void EvictionPlan::keep(int head, std::vector<int32_t> slots) {
  decide(head, Kind::kKeep);
  keep_[head] = std::move(slots);
}

void EvictionPlan::evict(int head, int32_t victim) {
  decide(head, Kind::kVictim);
  victims_[head] = victim;
}

bool EvictionPlan::changes_any() const {
  for (Kind k : kinds_) {
    if (k != Kind::kKeepAll) return true;
  }
  return false;
}

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
  }
}

int EvictionPlan::length_after(int head, int len) const {
  switch (kinds_[head]) {
    case Kind::kKeep: return static_cast<int>(keep_[head].size());
    case Kind::kVictim: return len - 1;
    case Kind::kKeepAll: return len;
  }
  return len;
}

}  // namespace kvb::kernels
