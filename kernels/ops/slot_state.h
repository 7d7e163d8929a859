// Per-slot policy state kept in step with the cache: one array per (layer, KV head) whose entry
// i belongs to slot i. compact() applies the same keep-list KvCache::keep_slots applies.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kv_cache.h"

namespace kvb::kernels::ops {

template <typename T>
class SlotState {
 public:
  SlotState() = default;
  SlotState(int num_layers, int num_kv_heads)
      : num_kv_heads_(num_kv_heads), rows_(static_cast<size_t>(num_layers) * num_kv_heads) {}
  std::vector<T>& at(int layer, int head) { return rows_[static_cast<size_t>(layer) * num_kv_heads_ + head]; }
  const std::vector<T>& at(int layer, int head) const {
    return rows_[static_cast<size_t>(layer) * num_kv_heads_ + head];
  }
  size_t bytes() const {
    size_t b = 0;
    for (const auto& r : rows_) b += r.size() * sizeof(T);
    return b;
  }

 private:
  int num_kv_heads_ = 0;
  std::vector<std::vector<T>> rows_;
};

// v[i] = v[keep[i]] for increasing keep indices; v shrinks to keep.size().
template <typename T>
void compact(std::vector<T>& v, const std::vector<int32_t>& keep) {
  for (size_t i = 0; i < keep.size(); ++i) v[i] = v[keep[i]];
  v.resize(keep.size());
}

// v without entry `slot` (what compact() does with every index but `slot`).
template <typename T>
void erase_slot(std::vector<T>& v, int slot) {
  v.erase(v.begin() + slot);
}

}  // namespace kvb::kernels::ops
