// KvCache: per-(layer, KV head) variable-length storage with in-place compaction.
#include "kernels/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "kernels/f16.h"

namespace kvb::kernels {

KvCache::KvCache(const KvCacheShape& shape, int initial_capacity, bool host_rows)
    : host_rows_(host_rows) {
  shape_ = shape;
  KVB_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0)
      << "bad cache shape " << shape.num_layers << "x" << shape.num_kv_heads << "x"
      << shape.head_dim;
  KVB_CHECK(!shape.f16 || (host_rows && shape.head_dim % 2 == 0))
      << "an f16 cache holds its rows on the host and has an even head_dim, got " << shape.head_dim;
  keys_.resize(shape.num_layers);
  values_.resize(shape.num_layers);
  positions_.resize(shape.num_layers);
  lengths_.assign(static_cast<size_t>(shape.num_layers) * shape.num_kv_heads, 0);
  if (initial_capacity > 0) grow_to(initial_capacity);
}

void KvCache::drop_host_rows() {
  KVB_CHECK(device_rows_ != nullptr && !shape_.f16)
      << "drop_host_rows: the cache's rows would be nowhere (no device rows) or are f16";
  for (Rows& k : keys_) Rows().swap(k);
  for (Rows& v : values_) Rows().swap(v);
  std::vector<float>().swap(f32_keys_);
  std::vector<float>().swap(f32_values_);
  f32_layer_ = -1;
  host_rows_ = false;
  ++changes_;
}

KvCache::KvCache(const KvCache& o)
    : KvIndex(o),
      keys_(o.keys_),
      values_(o.values_),
      host_rows_(o.host_rows_),
      device_rows_(o.device_rows_ ? o.device_rows_->clone() : nullptr) {}

void KvIndex::read_stale_positions(int layer) const {
  // A KvIndex is a KvCache's (its constructors are KvCache's alone).
  const KvCache& cache = static_cast<const KvCache&>(*this);
  KVB_CHECK(cache.device_rows_ != nullptr)
      << "KvCache: layer " << layer << "'s positions were decided on a device that holds no rows";
  KvIndex& self = const_cast<KvIndex&>(*this);
  cache.device_rows_->read_positions(layer, capacity_, self.positions_[layer].data());
  self.stale_[layer] = 0;
  ++self.position_reads_;
}

KvCache& KvCache::operator=(const KvCache& o) {
  if (this != &o) {
    KvCache copy(o);
    *this = std::move(copy);
  }
  return *this;
}

int KvCache::capacity_for(int extra) const {
  const int need = max_length() + extra;
  return need <= capacity_ ? capacity_ : std::max(need, capacity_ + capacity_ / 2);
}

void KvCache::reserve_extra(int extra) {
  const int capacity = capacity_for(extra);
  if (capacity != capacity_) grow_to(capacity);
}

void KvCache::live_rows(int capacity, std::vector<Rows>* keys, std::vector<Rows>* values,
                        std::vector<Positions>* positions) const {
  const int h = shape_.num_kv_heads;
  const size_t dk = key_floats(), dv = value_floats();
  keys->resize(shape_.num_layers);
  values->resize(shape_.num_layers);
  positions->resize(shape_.num_layers);
  for (int l = 0; l < shape_.num_layers; ++l) {
    Rows k(host_rows_ ? static_cast<size_t>(h) * capacity * dk : 0);
    Rows v(host_rows_ ? static_cast<size_t>(h) * capacity * dv : 0);
    Positions p(static_cast<size_t>(h) * capacity);
    for (int head = 0; head < h; ++head) {
      const size_t len = lengths_[index(l, head)];
      if (len == 0) continue;
      if (host_rows_) {
        std::memcpy(&k[static_cast<size_t>(head) * capacity * dk],
                    &keys_[l][static_cast<size_t>(head) * capacity_ * dk],
                    len * dk * sizeof(float));
        std::memcpy(&v[static_cast<size_t>(head) * capacity * dv],
                    &values_[l][static_cast<size_t>(head) * capacity_ * dv],
                    len * dv * sizeof(float));
      }
      std::memcpy(&p[static_cast<size_t>(head) * capacity],
                  &positions_[l][static_cast<size_t>(head) * capacity_], len * sizeof(int32_t));
    }
    (*keys)[l].swap(k);
    (*values)[l].swap(v);
    (*positions)[l].swap(p);
  }
}

void KvCache::grow_to(int new_capacity) {
  ++changes_;
  live_rows(new_capacity, &keys_, &values_, &positions_);
  capacity_ = new_capacity;
}

KvCache KvCache::fork(int extra) const {
  KVB_CHECK(extra >= 0) << "KvCache::fork: extra slots must be >= 0, got " << extra;
  KvCache out;
  out.shape_ = shape_;
  out.host_rows_ = host_rows_;
  out.next_position_ = next_position_;
  out.lengths_ = lengths_;
  out.capacity_ = max_length() + extra;
  live_rows(out.capacity_, &out.keys_, &out.values_, &out.positions_);
  if (device_rows_) out.device_rows_ = device_rows_->fork(extra);
  out.stale_ = stale_;  // the fork's device rows hold the same positions
  out.pruned_channels_ = pruned_channels_;
  out.pruned_below_ = pruned_below_;
  out.pruned_slots_ = pruned_slots_;
  return out;
}

KvCache KvCache::empty_copy(int extra) const {
  KVB_CHECK(host_rows_ && device_rows_ == nullptr)
      << "KvCache::empty_copy: only for a cache whose rows are on the host";
  KVB_CHECK(extra >= 0) << "KvCache::empty_copy: extra slots must be >= 0, got " << extra;
  KvCache out(shape_, 0, true);
  out.grow_to(capacity_for(extra));
  out.next_position_ = next_position_;
  out.position_reads_ = position_reads_;
  return out;
}

void KvCache::fill_layer(const KvCache& src, const EvictionPlan& plan) {
  const int layer = plan.layer();
  KVB_CHECK(host_rows_ && src.host_rows_ && src.device_rows_ == nullptr &&
            src.shape_.num_layers == shape_.num_layers &&
            src.shape_.num_kv_heads == shape_.num_kv_heads &&
            src.shape_.head_dim == shape_.head_dim && src.shape_.f16 == shape_.f16 &&
            src.shape_.f32_keys == shape_.f32_keys)
      << "KvCache::fill_layer: the source is not a host cache of this shape";
  KVB_CHECK(layer >= 0 && layer < shape_.num_layers && plan.num_heads() == shape_.num_kv_heads)
      << "eviction plan for layer " << layer << " with " << plan.num_heads()
      << " heads on a cache of " << shape_.num_layers << " layers x " << shape_.num_kv_heads
      << " heads";
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    KVB_CHECK(length(layer, h) == 0) << "KvCache::fill_layer: layer " << layer << " head " << h
                                     << " holds " << length(layer, h) << " slots already";
    const int src_len = src.length(layer, h);
    KVB_CHECK(src_len <= capacity_)
        << "KvCache::fill_layer: " << src_len << " source slots for a capacity of " << capacity_;
    switch (plan.kind(h)) {
      case EvictionPlan::Kind::kKeepAll:
        move_run(layer, h, src, 0, 0, src_len);
        lengths_[index(layer, h)] = src_len;
        break;
      case EvictionPlan::Kind::kKeep:
        keep_from(layer, h, src, plan.kept(h));
        break;
      case EvictionPlan::Kind::kVictim:
        drop_from(layer, h, src, plan.victim(h));
        break;
      case EvictionPlan::Kind::kDevice:
        KVB_FAIL() << "a device eviction plan on a cache whose rows are on the host";
    }
  }
  if (!src.pruned_channels_.empty()) {  // src's zeroed channels, counted after the plan
    if (pruned_channels_.empty()) {
      pruned_channels_.assign(lengths_.size(), 0);
      pruned_below_.assign(lengths_.size(), 0);
      pruned_slots_.assign(lengths_.size(), 0);
    }
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const size_t i = index(layer, h);
      pruned_channels_[i] = src.pruned_channels_[i];
      pruned_below_[i] = src.pruned_below_[i];
      pruned_slots_[i] = src.channel_pruned_slots(layer, h);
      if (plan.kind(h) == EvictionPlan::Kind::kKeep) keep_pruned(layer, h, plan.kept(h));
      if (plan.kind(h) == EvictionPlan::Kind::kVictim) drop_pruned(layer, h, plan.victim(h));
    }
  }
  if (plan.prunes_channels()) apply_channels(plan);
}

void KvCache::assign_prefix(const KvCache& src, int p, const std::vector<uint8_t>& skip) {
  KVB_CHECK(host_rows_ && device_rows_ == nullptr && src.host_rows_ &&
            src.device_rows_ == nullptr && src.shape_.num_layers == shape_.num_layers &&
            src.shape_.num_kv_heads == shape_.num_kv_heads &&
            src.shape_.head_dim == shape_.head_dim && src.shape_.f16 == shape_.f16 &&
            src.shape_.f32_keys == shape_.f32_keys)
      << "KvCache::assign_prefix: the source is not a host cache of this shape";
  KVB_CHECK(p >= 0 && p <= capacity_ && p <= src.next_position_)
      << "KvCache::assign_prefix: " << p << " tokens into a capacity of " << capacity_
      << " from a sequence of " << src.next_position_;
  KVB_CHECK(skip.empty() || skip.size() == static_cast<size_t>(shape_.num_layers))
      << "KvCache::assign_prefix: " << skip.size() << " layer flags for " << shape_.num_layers
      << " layers";
  KVB_CHECK(src.pruned_channels_.empty())
      << "KvCache::assign_prefix: the source's key channels were zeroed (not a prompt's prefill)";
  for (int l = 0; l < shape_.num_layers; ++l) {
    if (!skip.empty() && skip[l] != 0) continue;
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      KVB_CHECK(length(l, h) == 0) << "KvCache::assign_prefix: layer " << l << " head " << h
                                   << " holds " << length(l, h) << " slots already";
      const int32_t* pos = &src.positions_[l][static_cast<size_t>(h) * src.capacity_];
      KVB_CHECK(src.length(l, h) >= p && (p == 0 || (pos[0] == 0 && pos[p - 1] == p - 1)))
          << "KvCache::assign_prefix: layer " << l << " head " << h << " of the source does not "
          << "hold positions 0.." << p - 1 << " in its first " << p << " slots";
      move_run(l, h, src, 0, 0, p);
      lengths_[index(l, h)] = p;
    }
  }
  next_position_ = p;
}

LayerKvView KvCache::layer(int layer) {
  ++changes_;  // a writable view: its rows may change
  return view(layer);
}

LayerKvView KvCache::view(int layer) {
  KVB_ASSERT(layer >= 0 && layer < shape_.num_layers);
  if (positions_stale(layer)) read_stale_positions(layer);
  const bool k16 = shape_.f16_keys(), v16 = shape_.f16;
  LayerKvView v{host_rows_ && !k16 ? keys_[layer].data() : nullptr,
                host_rows_ && !v16 ? values_[layer].data() : nullptr,
                positions_[layer].data(),
                &lengths_[index(layer, 0)],
                shape_.num_kv_heads,
                shape_.head_dim,
                capacity_};
  if (host_rows_ && k16) v.keys16 = reinterpret_cast<uint16_t*>(keys_[layer].data());
  if (host_rows_ && v16) v.values16 = reinterpret_cast<uint16_t*>(values_[layer].data());
  return v;
}

LayerKvView KvCache::rows_f32(int layer) const {
  if (!shape_.f16) return this->layer(layer);
  LayerKvView v = this->layer(layer);  // a reading view: no change counted
  const size_t n = static_cast<size_t>(shape_.num_kv_heads) * capacity_ * shape_.head_dim;
  if (f32_layer_ != layer || f32_changes_ != changes_ || f32_values_.size() != n) {
    f32_keys_.resize(v.keys16 ? n : 0);
    f32_values_.resize(n);
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const size_t off = static_cast<size_t>(h) * capacity_ * shape_.head_dim;
      const size_t count = static_cast<size_t>(v.lengths[h]) * shape_.head_dim;
      if (v.keys16) f16_to_f32(v.keys16 + off, f32_keys_.data() + off, count);
      f16_to_f32(v.values16 + off, f32_values_.data() + off, count);
    }
    f32_layer_ = layer;
    f32_changes_ = changes_;
  }
  if (v.keys16) v.keys = f32_keys_.data();
  v.values = f32_values_.data();
  v.keys16 = nullptr;
  v.values16 = nullptr;
  return v;
}

void KvCache::append(int layer, int head, const float* key, const float* value,
                     int32_t position) {
  int32_t& len = lengths_[index(layer, head)];
  KVB_ASSERT(len < capacity_);
  const size_t d = shape_.head_dim;
  if (host_rows_) {
    ++changes_;
    const size_t slot = static_cast<size_t>(head) * capacity_ + len;
    if (shape_.f16_keys()) {
      f32_to_f16(key, reinterpret_cast<uint16_t*>(&keys_[layer][slot * key_floats()]), d);
    } else {
      std::memcpy(&keys_[layer][slot * key_floats()], key, d * sizeof(float));
    }
    if (shape_.f16) {
      f32_to_f16(value, reinterpret_cast<uint16_t*>(&values_[layer][slot * value_floats()]), d);
    } else {
      std::memcpy(&values_[layer][slot * value_floats()], value, d * sizeof(float));
    }
  }
  positions_[layer][static_cast<size_t>(head) * capacity_ + len] = position;
  ++len;
}

void KvCache::move_run(int layer, int head, const KvCache& src, int from, int to, int count) {
  if (count <= 0 || (&src == this && from == to)) return;
  ++changes_;
  const size_t dk = key_floats(), dv = value_floats();
  const size_t s0 = static_cast<size_t>(head) * src.capacity_ + from;
  const size_t t0 = static_cast<size_t>(head) * capacity_ + to;
  if (host_rows_) {  // index-only caches move positions alone
    std::memmove(&keys_[layer][t0 * dk], &src.keys_[layer][s0 * dk], count * dk * sizeof(float));
    std::memmove(&values_[layer][t0 * dv], &src.values_[layer][s0 * dv],
                 count * dv * sizeof(float));
  }
  std::memmove(&positions_[layer][t0], &src.positions_[layer][s0], count * sizeof(int32_t));
}

void KvCache::keep_from(int layer, int head, const KvCache& src, std::span<const int32_t> slots) {
  const int len = src.length(layer, head);
  int32_t prev = -1;
  size_t i = 0;
  while (i < slots.size()) {  // a run of consecutive slots, one move
    size_t j = i;
    while (true) {
      const int32_t s = slots[j];
      KVB_CHECK(s > prev && s < len) << "keep_slots: slots must be increasing and < " << len
                                     << ", got " << s << " after " << prev;
      prev = s;
      if (j + 1 == slots.size() || slots[j + 1] != s + 1) break;
      ++j;
    }
    move_run(layer, head, src, slots[i], static_cast<int>(i), static_cast<int>(j - i + 1));
    i = j + 1;
  }
  lengths_[index(layer, head)] = static_cast<int32_t>(slots.size());
}

void KvCache::drop_from(int layer, int head, const KvCache& src, int victim) {
  const int len = src.length(layer, head);
  KVB_CHECK(victim >= 0 && victim < len)
      << "evict_slot: slot " << victim << " of layer " << layer << " head " << head << " holding "
      << len;
  move_run(layer, head, src, 0, 0, victim);
  move_run(layer, head, src, victim + 1, victim, len - victim - 1);
  lengths_[index(layer, head)] = len - 1;
}

void KvCache::keep_slots(int layer, int head, const std::vector<int32_t>& slots) {
  keep_pruned(layer, head, slots);
  keep_from(layer, head, *this, slots);
}

void KvCache::evict_slot(int layer, int head, int victim) {
  drop_pruned(layer, head, victim);
  drop_from(layer, head, *this, victim);
}

void KvCache::keep_pruned(int layer, int head, std::span<const int32_t> slots) {
  if (pruned_channels_.empty()) return;
  int32_t& n = pruned_slots_[index(layer, head)];
  if (n <= 0) return;  // none, or unknown (counted from the positions when asked)
  // The zeroed slots are the head's first n (positions increase along the slots).
  n = static_cast<int32_t>(std::lower_bound(slots.begin(), slots.end(), n) - slots.begin());
}

void KvCache::drop_pruned(int layer, int head, int victim) {
  if (pruned_channels_.empty()) return;
  int32_t& n = pruned_slots_[index(layer, head)];
  if (victim < n) --n;
}

void KvCache::apply_channels(const EvictionPlan& plan) {
  const int layer = plan.layer();
  if (pruned_channels_.empty()) {
    pruned_channels_.assign(lengths_.size(), 0);
    pruned_below_.assign(lengths_.size(), 0);
    pruned_slots_.assign(lengths_.size(), 0);
  }
  // An index-only cache counts its zeroed slots when asked (its positions may be on a device).
  const LayerKvView v = host_rows_ ? this->layer(layer) : LayerKvView{};
  for (int32_t h : plan.channel_heads()) {
    const std::vector<int32_t>& ch = plan.key_channels(h);
    const size_t i = index(layer, h);
    KVB_CHECK(pruned_channels_[i] == 0)
        << "eviction plan of layer " << layer << ": head " << h << "'s key channels are zeroed "
        << "already (once per sequence)";
    int32_t prev = -1;
    for (int32_t c : ch) {
      KVB_CHECK(c > prev && c < shape_.head_dim)
          << "eviction plan of layer " << layer << " head " << h << ": key channels must be "
          << "increasing and < " << shape_.head_dim << ", got " << c << " after " << prev;
      prev = c;
    }
    int n = -1;
    if (host_rows_) {
      const int32_t* pos = v.position(h);
      n = static_cast<int>(std::lower_bound(pos, pos + lengths_[i], plan.channels_below(h)) - pos);
      for (int s = 0; s < n; ++s) {
        if (shape_.f16_keys()) {
          uint16_t* k = v.key16(h, s);
          for (int32_t c : ch) k[c] = 0;  // +0
        } else {
          float* k = v.key(h, s);
          for (int32_t c : ch) k[c] = 0.0f;
        }
      }
    }
    pruned_channels_[i] = static_cast<int32_t>(ch.size());
    pruned_below_[i] = plan.channels_below(h);
    pruned_slots_[i] = n;
  }
}

void KvCache::renumber_positions(int layer) {
  KVB_CHECK(layer >= 0 && layer < shape_.num_layers)
      << "KvCache::renumber_positions: layer " << layer << " of " << shape_.num_layers;
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    int32_t* p = &positions_[layer][static_cast<size_t>(h) * capacity_];
    for (int s = 0; s < lengths_[index(layer, h)]; ++s) p[s] = s;
  }
  if (!stale_.empty()) stale_[layer] = 0;  // the host's positions are the truth again
}

void KvCache::apply(const EvictionPlan& plan) {
  const int layer = plan.layer();
  KVB_CHECK(layer >= 0 && layer < shape_.num_layers && plan.num_heads() == shape_.num_kv_heads)
      << "eviction plan for layer " << layer << " with " << plan.num_heads()
      << " heads on a cache of " << shape_.num_layers << " layers x " << shape_.num_kv_heads
      << " heads";
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    switch (plan.kind(h)) {
      case EvictionPlan::Kind::kKeep: keep_slots(layer, h, plan.kept(h)); break;
      case EvictionPlan::Kind::kVictim: evict_slot(layer, h, plan.victim(h)); break;
      case EvictionPlan::Kind::kKeepAll: break;
      case EvictionPlan::Kind::kDevice: {
        KVB_CHECK(!host_rows_) << "a device eviction plan on a cache whose rows are on the host";
        int32_t& len = lengths_[index(layer, h)];
        KVB_CHECK(plan.device_counts()[h] < len) << "device eviction plan of layer " << layer
                                                 << " head " << h << " keeps "
                                                 << plan.device_counts()[h] << " of " << len;
        len = plan.device_counts()[h];
        if (stale_.empty()) stale_.assign(shape_.num_layers, 0);
        stale_[layer] = 1;
        if (!pruned_slots_.empty() && pruned_slots_[index(layer, h)] > 0) {
          pruned_slots_[index(layer, h)] = -1;  // counted from the positions when asked
        }
        break;
      }
    }
  }
  if (plan.prunes_channels()) apply_channels(plan);
}

void KvCache::clear() {
  ++changes_;
  device_rows_.reset();  // a device backend starts the next sequence on fresh rows
  std::fill(lengths_.begin(), lengths_.end(), 0);
  next_position_ = 0;
  stale_.clear();
  pruned_channels_.clear();
  pruned_below_.clear();
  pruned_slots_.clear();
}

size_t KvCache::physical_bytes() const {
  const size_t slot = host_rows_ ? bytes_per_slot() : sizeof(int32_t);
  return static_cast<size_t>(shape_.num_layers) * shape_.num_kv_heads * capacity_ * slot;
}

}  // namespace kvb::kernels
