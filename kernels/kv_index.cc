// KvIndex: a cache's lengths, positions and zeroed key channels (kv_index.h). Its mutations are
// KvCache's (kv_cache.cc), which moves the storage's rows with them.
#include "kernels/kv_index.h"

#include <algorithm>

#include "common/error.h"

namespace kvb::kernels {

int KvIndex::max_length() const {
  int m = 0;
  for (int32_t l : lengths_) m = std::max(m, static_cast<int>(l));
  return m;
}

LayerIndexView KvIndex::layer(int layer) const {
  KVB_ASSERT(layer >= 0 && layer < shape_.num_layers);
  if (positions_stale(layer)) read_stale_positions(layer);
  return {positions_[layer].data(), &lengths_[index(layer, 0)], shape_.num_kv_heads, capacity_};
}

int KvIndex::channel_pruned_slots(int layer, int head) const {
  if (pruned_channels_.empty()) return 0;
  const size_t i = index(layer, head);
  if (pruned_channels_[i] == 0) return 0;
  if (pruned_slots_[i] < 0) {
    const LayerIndexView v = this->layer(layer);
    const int32_t* pos = v.position(head);
    pruned_slots_[i] =
        static_cast<int32_t>(std::lower_bound(pos, pos + lengths_[i], pruned_below_[i]) - pos);
  }
  return pruned_slots_[i];
}

size_t KvIndex::pruned_key_elements() const {
  if (pruned_channels_.empty()) return 0;
  size_t n = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const int c = pruned_key_channels(l, h);
      if (c > 0) n += static_cast<size_t>(channel_pruned_slots(l, h)) * c;
    }
  }
  return n;
}

size_t KvIndex::bytes_per_slot() const {
  return (key_floats() + value_floats()) * sizeof(float) + sizeof(int32_t);
}
int KvIndex::total_slots() const {
  int t = 0;
  for (int32_t l : lengths_) t += l;
  return t;
}
size_t KvIndex::logical_bytes() const { return total_slots() * bytes_per_slot(); }
size_t KvIndex::logical_bytes(int layer, int head) const {
  return lengths_[index(layer, head)] * bytes_per_slot();
}

}  // namespace kvb::kernels
