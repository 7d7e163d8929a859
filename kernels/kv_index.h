// The index of a sequence's KV cache: per (layer, KV head) its length and each slot's original
// position, in slot order (increasing positions), and the position the next token gets; plus the
// key channels a plan zeroed (POLICIES.md `think`). This is what a policy reads of a cache
// (Policy's hooks take a `const KvIndex&`). The K/V rows are the storage's: host rows on the CPU
// or rows on a device, kept by KvCache (kv_cache.h), its one derived class, and read only by the
// backend and the policy ops (kernels/ops/policy_ops.h; a policy that decides on the host from
// rows asks for a layer through kernels::ops::host_layer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvb::kernels {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // Rows stored as IEEE f16 (kernels/f16.h: rounded to nearest even on append) rather than f32:
  // the CPU cache of --dtype native, llama.cpp's cache type. Half the bytes a decode step reads.
  // head_dim must be even.
  bool f16 = false;
  // With f16: the keys stay f32 (a rolling-positions policy's cache holds pre-RoPE keys and
  // rotates them at each step; rounding them to f16 before that rotation would round
  // differently from the rotated keys an f16 cache holds, so the rotated keys are rounded
  // instead: CpuBackend::roll_keys).
  bool f32_keys = false;
  bool f16_keys() const { return f16 && !f32_keys; }
};

// Storage that is zero when allocated and costs memory only where written: calloc (large blocks
// come from fresh pages the kernel maps on first touch, already zero) and a value-initialisation
// that writes nothing. A cache's spare capacity (the prompt's length plus every new token, per
// head) then costs address space until slots fill it. Only for trivial element types, in
// containers that never shrink and grow again (the cache sizes its buffers once each).
template <typename T>
struct ZeroedAllocator {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_copyable_v<T>);
  using value_type = T;
  ZeroedAllocator() = default;
  template <typename U>
  ZeroedAllocator(const ZeroedAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) {
    void* p = std::calloc(n == 0 ? 1 : n, sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }
  // Value-initialisation: the memory is zero already.
  template <typename U>
  void construct(U*) noexcept {}
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  bool operator==(const ZeroedAllocator<U>&) const noexcept {
    return true;
  }
};

// One layer of the index: positions [num_kv_heads, capacity] (head h's live slots at
// h * capacity) and lengths [num_kv_heads].
struct LayerIndexView {
  const int32_t* positions;
  const int32_t* lengths;
  int num_kv_heads;
  int capacity;
  const int32_t* position(int head) const {
    return positions + static_cast<size_t>(head) * capacity;
  }
};

class KvCache;

class KvIndex {
 public:
  const KvCacheShape& shape() const { return shape_; }
  // Slots per head the storage has room for (KvCache::reserve_extra grows it).
  int capacity() const { return capacity_; }
  int length(int layer, int head) const { return lengths_[index(layer, head)]; }
  int max_length() const;  // over all layers and heads
  int total_slots() const;
  // Sequence position the next token gets (number of tokens the sequence has seen, evicted or not).
  int32_t next_position() const { return next_position_; }

  // The layer's lengths and true positions. A layer whose positions a device decision made
  // stale (KvCache::apply of an EvictionPlan with device lists) reads them back from the
  // device rows first: host code sees true positions, and a step that reads none costs no copy.
  LayerIndexView layer(int layer) const;
  // Whether `layer`'s host positions wait for a read from the device; how many such reads
  // happened since construction (copies included).
  bool positions_stale(int layer) const { return !stale_.empty() && stale_[layer] != 0; }
  int64_t position_reads() const { return position_reads_; }

  // Key channels a plan zeroed (EvictionPlan::zero_key_channels, POLICIES.md `think`): how many
  // channels head (layer, head) zeroed (0: none), and in how many of the slots it holds now (the
  // slots whose position is below the plan's bound; may read the layer's positions back from a
  // device).
  int pruned_key_channels(int layer, int head) const {
    return pruned_channels_.empty() ? 0 : pruned_channels_[index(layer, head)];
  }
  int channel_pruned_slots(int layer, int head) const;
  // Sum over heads of channel_pruned_slots x pruned_key_channels: the key elements a store that
  // drops the pruned channels would not hold (a host cache zeroes them in place).
  size_t pruned_key_elements() const;

  // Exact memory accounting: logical = retained slots x bytes per slot (key + value + position,
  // as the shape stores them; the backend counts its own element size: Engine::kv_logical_bytes).
  size_t bytes_per_slot() const;
  size_t logical_bytes() const;
  size_t logical_bytes(int layer, int head) const;

 private:
  // Only KvCache is an index (with its storage): a `const KvIndex&` is always a KvCache's, so
  // the ops, which read the storage, may take the index a policy passes them (storage_of,
  // kv_cache.h).
  friend class KvCache;
  KvIndex() = default;
  KvIndex(const KvIndex&) = default;
  KvIndex& operator=(const KvIndex&) = default;
  KvIndex(KvIndex&&) noexcept = default;
  KvIndex& operator=(KvIndex&&) noexcept = default;
  ~KvIndex() = default;

  size_t index(int layer, int head) const {
    return static_cast<size_t>(layer) * shape_.num_kv_heads + head;
  }
  // Floats of storage per key / value row: head_dim, or head_dim / 2 for f16 rows (two a float).
  size_t key_floats() const { return shape_.f16_keys() ? shape_.head_dim / 2 : shape_.head_dim; }
  size_t value_floats() const { return shape_.f16 ? shape_.head_dim / 2 : shape_.head_dim; }
  // Reads layer's stale positions back from the device rows (KvCache: DeviceRows).
  void read_stale_positions(int layer) const;

  using Positions = std::vector<int32_t, ZeroedAllocator<int32_t>>;
  KvCacheShape shape_;
  int capacity_ = 0;
  int32_t next_position_ = 0;
  std::vector<Positions> positions_;  // per layer: [num_kv_heads, capacity]
  std::vector<int32_t> lengths_;      // [num_layers * num_kv_heads]
  std::vector<uint8_t> stale_;        // [num_layers] once a device plan was applied, else empty
  // [num_layers * num_kv_heads] once a plan zeroed key channels, else empty: the channels zeroed,
  // the position bound of the slots zeroed, and how many slots below it the head holds (-1:
  // unknown since a device plan; counted from the positions when asked).
  std::vector<int32_t> pruned_channels_, pruned_below_;
  mutable std::vector<int32_t> pruned_slots_;
  int64_t position_reads_ = 0;
};

}  // namespace kvb::kernels
