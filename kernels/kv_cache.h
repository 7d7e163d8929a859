// The KV cache of one sequence: its index (kv_index.h: per (layer, KV head) a length and each
// slot's original position, so heads of one layer may hold different numbers of tokens; DESIGN.md
// "KV cache", Ada-KV needs that) and its storage, the K/V rows: on the host (the CPU engine's;
// key post-RoPE and value per slot) or on a device (DeviceRows), never both. Slots of a head are
// kept in increasing position order; eviction compacts in place (no per-step reallocation).
// Policies read the index; the rows are read by the backend and the policy ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

#include "kernels/eviction_plan.h"
#include "kernels/kv_index.h"

namespace kvb::kernels {

// A read/write view of one layer's cache, shared by CPU and (later) CUDA code.
// keys/values: [num_kv_heads, capacity, head_dim]; positions: [num_kv_heads, capacity];
// lengths: [num_kv_heads]. A cache of f16 rows (KvCacheShape::f16) gives its rows as keys16 /
// values16 in the same layout, and null keys / values; KvCache::rows_f32 gives them as f32.
struct LayerKvView {
  float* keys;
  float* values;
  int32_t* positions;
  const int32_t* lengths;
  int num_kv_heads;
  int head_dim;
  int capacity;

  float* key(int head, int slot) const {
    return keys + (static_cast<size_t>(head) * capacity + slot) * head_dim;
  }
  float* value(int head, int slot) const {
    return values + (static_cast<size_t>(head) * capacity + slot) * head_dim;
  }
  int32_t* position(int head) const { return positions + static_cast<size_t>(head) * capacity; }
  uint16_t* keys16 = nullptr;
  uint16_t* values16 = nullptr;
  uint16_t* key16(int head, int slot) const {
    return keys16 + (static_cast<size_t>(head) * capacity + slot) * head_dim;
  }
  uint16_t* value16(int head, int slot) const {
    return values16 + (static_cast<size_t>(head) * capacity + slot) * head_dim;
  }
};

// The K/V rows of a cache when they live on a device (kernels/cuda/kv_cache_device.h is the
// one implementation): the host KvCache then holds only the index (lengths, positions, the next
// position; a few bytes per slot), and copying the KvCache copies the rows on the device.
class DeviceRows {
 public:
  virtual ~DeviceRows() = default;
  virtual std::unique_ptr<DeviceRows> clone() const = 0;
  // A copy of the live rows with room for `extra` more slots per head beyond the longest (a fork
  // that will only grow by that much); the parent's spare capacity need not be allocated again.
  // By default a clone.
  virtual std::unique_ptr<DeviceRows> fork(int extra) const { return clone(); }
  // The positions of every head of `layer` into dst ([num_kv_heads, capacity]: head h's
  // live slots at h * capacity), for a host index whose positions a device decision made stale
  // (KvCache::positions_stale). Synchronous.
  virtual void read_positions(int layer, int capacity, int32_t* dst) const = 0;
};

class KvCache final : public KvIndex {
 public:
  KvCache() = default;
  // host_rows: the cache stores its K/V rows on the host (the CPU engine's storage). Without,
  // it is an index only: append takes positions (keys/values may be null), layer() views have
  // null keys/values, and a device backend keeps the rows (device_rows()).
  explicit KvCache(const KvCacheShape& shape, int initial_capacity = 0, bool host_rows = true);
  // Copies clone the device rows (a fork of a sequence is a copy where its storage lives).
  KvCache(const KvCache& other);
  KvCache& operator=(const KvCache& other);
  // A copy for a branch of the sequence that appends at most `extra` more slots per head (a
  // choice scored on top of the prompt): the same lengths, positions and rows, but only the live
  // rows are copied and the capacity is max_length() + extra, not the parent's. Device rows are
  // forked the same way (DeviceRows::fork). Reads give the same values as a full copy.
  KvCache fork(int extra) const;
  // A cache of this one's shape and next position with no slots yet, whose capacity is what a
  // copy of this cache followed by reserve_extra(extra) would have (so its physical bytes are
  // that copy's). fill_layer() then writes each layer. Host rows only.
  KvCache empty_copy(int extra) const;
  // Writes layer plan.layer() of this cache, which holds no slots there yet, as `src`'s same
  // layer after `plan`: the rows, positions and lengths a copy of src compacted by apply(plan)
  // holds, bit for bit, copying only the slots the plan keeps. src: this cache's shape, host rows.
  void fill_layer(const KvCache& src, const EvictionPlan& plan);
  // Sets this cache, which holds no slots yet, to the first p tokens of a sequence whose cache
  // `src` is (prefix reuse, workers/prefix_store.h): every head of src keeps positions 0..p-1
  // in its first p slots (a prompt's prefill, nothing evicted: checked); those slots' rows and
  // positions are copied, and the next position is p. Both hold their rows on the host, of one
  // shape; this cache's capacity must be >= p. Its capacity is unchanged. Layers l with
  // skip[l] != 0 (a sliding window's, whose rows the source no longer holds) stay empty.
  void assign_prefix(const KvCache& src, int p, const std::vector<uint8_t>& skip = {});
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

  bool host_rows() const { return host_rows_; }
  DeviceRows* device_rows() const { return device_rows_.get(); }
  void set_device_rows(std::unique_ptr<DeviceRows> rows) { device_rows_ = std::move(rows); }
  // Frees the host rows of a cache whose rows a device now holds (set_device_rows, after an
  // upload of these): it keeps the index alone, as a cache the device filled. Not for f16 rows.
  void drop_host_rows();
  std::unique_ptr<DeviceRows> release_device_rows() { return std::move(device_rows_); }

  // Ensures room for `extra` more slots in every head (grows geometrically; existing slots kept).
  void reserve_extra(int extra);

  void advance_position(int n) { next_position_ += n; }

  // A layer whose positions a device decision made stale (apply of an EvictionPlan with device
  // lists) reads them back from the device rows first (DeviceRows::read_positions): host code
  // sees true positions, and a decode step that reads none costs no copy.
  LayerKvView layer(int layer);
  // A view for reading (policies see a const cache): its pointers must not be written through,
  // and it does not count as a change (rows_f32's converted rows stay valid).
  LayerKvView layer(int layer) const { return const_cast<KvCache*>(this)->view(layer); }
  // The layer with its rows as f32, for code that reads rows (policies, their ops): layer()
  // itself for f32 rows; for f16 rows (host rows only) a view of the live rows converted into
  // f32 scratch this cache keeps (the same layout and capacity; positions and lengths are the
  // cache's own), converted again after any change to the cache. Not to be written through, and
  // valid until the cache changes or rows_f32 is asked for another layer. Not thread-safe
  // against concurrent calls on one cache.
  LayerKvView rows_f32(int layer) const;
  // Appends one slot to (layer, head). Precondition: capacity available (reserve_extra).
  void append(int layer, int head, const float* key, const float* value, int32_t position);
  // Keeps only the listed slots of (layer, head), in the given order (must be increasing slot
  // indices, so position order is preserved); compacts in place.
  void keep_slots(int layer, int head, const std::vector<int32_t>& slots);
  // Drops slot `victim` of (layer, head), moving the later slots down one (keep_slots of every
  // other slot, without building the list).
  void evict_slot(int layer, int head, int victim);
  // Applies a policy's plan to its layer: keep lists through keep_slots, victims through
  // evict_slot; heads the plan keeps whole are untouched. Device lists (an index-only cache
  // whose rows live on a device) set the heads' lengths to the plan's counts and leave the
  // layer's positions to be read back when host code asks (layer()); the storage applies them.
  void apply(const EvictionPlan& plan);
  // Drops all tokens (keeps allocation).
  void clear();
  // Slot s of every head of `layer` takes position s (`positions: rerotate`: the storage has
  // rotated the keys to match); the layer's positions are current on the host after it.
  void renumber_positions(int layer);

  // Memory allocated on the host (an index-only cache: its positions); logical_bytes: KvIndex.
  size_t physical_bytes() const;

 private:
  void grow_to(int new_capacity);
  // The capacity reserve_extra(extra) gives (grows 1.5x at least).
  int capacity_for(int extra) const;
  // Compaction, in place (src == *this: runs move down) or from another cache of this shape
  // (fill_layer): src's slots [from, from + count) of (layer, head) to this cache's [to, ...);
  // this (layer, head) as src's after keeping `slots` (strictly increasing, below src's length:
  // checked; consecutive slots move as one run), or after dropping `victim` (checked).
  void move_run(int layer, int head, const KvCache& src, int from, int to, int count);
  // The layer's view, its stale positions read from the device first; counts no change.
  LayerKvView view(int layer);
  // rows_f32's scratch of f16 rows: the layer it holds, and the change count it was made at.
  mutable std::vector<float> f32_keys_, f32_values_;
  mutable int f32_layer_ = -1;
  mutable uint64_t f32_changes_ = 0;
  uint64_t changes_ = 0;  // incremented by every change to the rows and every writable view
  void keep_from(int layer, int head, const KvCache& src, std::span<const int32_t> slots);
  void drop_from(int layer, int head, const KvCache& src, int victim);
  // Buffers of `capacity` (>= max_length()) slots per head holding this cache's live rows, for
  // grow_to and fork. Each layer is read before its buffers are replaced, so the outputs may be
  // this cache's own keys_, values_, positions_.
  using Rows = std::vector<float, ZeroedAllocator<float>>;
  void live_rows(int capacity, std::vector<Rows>* keys, std::vector<Rows>* values,
                 std::vector<Positions>* positions) const;

  // Per layer: keys/values [num_kv_heads, capacity, head_dim] (positions: the index's).
  std::vector<Rows> keys_, values_;
  bool host_rows_ = true;
  std::unique_ptr<DeviceRows> device_rows_;
  // Applies the plan's key channels (host rows: zeroed; the index: its counts).
  void apply_channels(const EvictionPlan& plan);
  // After head (layer, head) kept `slots` of its `len` (or dropped `victim`), the count of its
  // channel-zeroed slots.
  void keep_pruned(int layer, int head, std::span<const int32_t> slots);
  void drop_pruned(int layer, int head, int victim);
  friend class KvIndex;  // read_stale_positions reads device_rows_
};

// The cache a policy's index belongs to (every KvIndex is a KvCache's: KvIndex's constructors
// are KvCache's alone), for the backend and the policy ops, which read its storage. Policies do
// not call it: they read rows through the ops (tests/layering/check_layering.py).
inline const KvCache& storage_of(const KvIndex& index) {
  return static_cast<const KvCache&>(index);
}

}  // namespace kvb::kernels
