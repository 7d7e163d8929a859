// The KV cache on the device (DESIGN.md "KV cache"; the issue "CUDA backend"): per layer ONE
// flat buffer of slots, each KV head owning the range [offset, offset + capacity) of it with its
// own length, so heads may hold different numbers of tokens (Ada-KV's layout, but allocated
// once: eviction compacts within the buffer and never reallocates it). Keys/values are f32 or
// bf16; each slot also keeps the token's original position. Same semantics as
// kernels/kv_cache.h (slots in increasing position order, keep_slots, logical/physical byte
// accounting).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kv_cache.h"

namespace kvb::kernels::cuda {

enum class KvDtype { kF32, kBf16 };

// Per-head values of one layer passed to kernels by value (a kernel argument: no upload, nothing
// staged). Layers with more heads than this fall back to a stream-ordered upload.
constexpr int kMaxParamHeads = 128;
struct HeadTable {
  int32_t v[kMaxParamHeads];
};
size_t kv_dtype_bytes(KvDtype dtype);
const char* kv_dtype_name(KvDtype dtype);

// The view kernels read: one layer. Slot s of KV head h is element row offsets[h] + s of
// keys/values ([slots_in_layer, head_dim], dtype) and positions ([slots_in_layer]). The device
// arrays are what kernels index; host_lengths mirrors lengths for launch sizing and validation
// (the cache keeps both in step; a view is valid until the next append/keep_slots/clear).
struct DeviceLayerKvView {
  void* keys = nullptr;
  void* values = nullptr;
  int32_t* positions = nullptr;
  const int32_t* offsets = nullptr;       // device [num_kv_heads]
  const int32_t* capacities = nullptr;    // device [num_kv_heads]
  const int32_t* lengths = nullptr;       // device [num_kv_heads]
  const int32_t* host_lengths = nullptr;  // host [num_kv_heads]
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kF32;
  int max_length() const;  // over host_lengths
};

class DeviceKvCache final : public DeviceRows {
 public:
  // capacities: [num_layers * num_kv_heads] slots per (layer, head), each >= 0 (layer-major).
  DeviceKvCache(const KvCacheShape& shape, KvDtype dtype, std::vector<int32_t> capacities);
  // Every (layer, head) gets `capacity` slots.
  DeviceKvCache(const KvCacheShape& shape, KvDtype dtype, int capacity);

  const KvCacheShape& shape() const { return shape_; }
  KvDtype dtype() const { return dtype_; }
  int capacity(int layer, int head) const { return capacities_h_[index(layer, head)]; }
  int length(int layer, int head) const { return lengths_h_[index(layer, head)]; }
  int offset(int layer, int head) const { return offsets_h_[index(layer, head)]; }
  int max_length() const;
  int32_t next_position() const { return next_position_; }
  void advance_position(int n) { next_position_ += n; }

  DeviceLayerKvView layer(int layer);

  // Every change to lengths is made on the host mirror and reaches the device in stream order:
  // for up to kMaxParamHeads heads per layer as a kernel argument (the kernel that moves the
  // rows writes the new lengths: no copy), otherwise by a copy from pageable memory (the call
  // returns once the bytes are staged). h2d_copies() counts those copies (and keep_slots'
  // unvalidated counts), so that an engine can count what a decode step uploads.

  // Appends n tokens to every KV head of `layer`. keys, values: device f32 [n, num_kv_heads,
  // head_dim] (post-RoPE; converted to the cache dtype); positions: device [n]. Throws, changing
  // nothing, when a head lacks room for n more slots. Stream-ordered.
  void append(int layer, const float* keys, const float* values, const int32_t* positions, int n,
              cudaStream_t stream = 0);
  // One slot of one head (KvCache::append's shape): key, value device [head_dim].
  void append(int layer, int head, const float* key, const float* value, int32_t position,
              cudaStream_t stream = 0);

  // Keeps, for every head h of `layer`, the slots slots[h * ld + j], j < counts[h] (device
  // slots, host counts), compacting within the layer's buffer (the rows that move are staged in
  // stream-ordered scratch: two launches, any number of blocks). Each list must be strictly
  // increasing and below the head's length: checked on the device before anything moves (one
  // stream sync); on a bad list nothing changes and kvb::Error is thrown. validated = true skips
  // that check (and its sync) for lists the caller has already checked on the host (the
  // engine's eviction plans, validated against the cache index): then nothing waits for the
  // device.
  void keep_slots(int layer, const int32_t* slots, int ld, const int32_t* counts,
                  cudaStream_t stream = 0, bool validated = false);
  // KvCache::keep_slots's signature: one head, a host list. Synchronous.
  void keep_slots(int layer, int head, const std::vector<int32_t>& slots);
  // Head h of `layer` drops slot victims[h] and keeps the rest in order (victims[h] < 0: the
  // head keeps everything); host victims, checked against the host lengths (throws, changing
  // nothing, on a victim at or past a head's length). Only the rows after a victim move (staged
  // as keep_slots'); with up to kMaxParamHeads heads nothing is uploaded and nothing waits.
  // EvictionPlan's one-victim form (a decode step at the budget), without a keep list.
  void evict_slots(int layer, const int32_t* victims, cudaStream_t stream = 0);
  // `positions: rerotate`: the key of every slot s of every head of `layer` rotated by RoPE's
  // angle for s - position(s) with `rope`'s frequencies and no attention factor (in f32, cos and
  // sin in double rounded to f32, as cuda::rope), then position(s) = s. One counted upload (the
  // frequencies) and two launches (rotate, renumber); nothing waits.
  void rerotate_keys(int layer, const cpu::RopeParams& rope, cudaStream_t stream = 0);
  // The plan's key channels (EvictionPlan::zero_key_channels; a plan of this cache's heads, up
  // to kMaxParamHeads) set to zero in the key rows of every slot of layer plan.layer() whose
  // position is below the head's bound. One counted upload (a channel mask of heads x head_dim
  // bytes) and one launch; nothing waits.
  void zero_key_channels(const EvictionPlan& plan, cudaStream_t stream = 0);
  // Host-to-device copies made so far by append / keep_slots / evict_slots /
  // zero_key_channels (lengths pushed,
  // counts, lists), and their bytes; upload() and clear() are not counted.
  int64_t h2d_copies() const { return h2d_copies_; }
  size_t h2d_bytes() const { return h2d_bytes_; }

  void clear();  // lengths 0, position 0; the allocation stays

  // A copy on the device (DeviceRows: forking a sequence whose rows live here): the same
  // capacities, lengths, rows and next position. Synchronous (the device is idle after).
  std::unique_ptr<DeviceRows> clone() const override;
  // A copy with max_length() + extra slots per head (KvCache::fork: a choice's branch).
  // Synchronous.
  std::unique_ptr<DeviceRows> fork(int extra) const override;
  // DeviceRows: the live positions of `layer` into a host index's layout. Synchronous.
  void read_positions(int layer, int capacity, int32_t* dst) const override;
  // A copy with at least `capacity` slots per head (a head about to overflow; rows copied on the
  // device). Synchronous.
  std::unique_ptr<DeviceKvCache> grown(int capacity) const;

  // Exact accounting as KvCache: logical = retained slots x bytes per slot (key + value in the
  // cache dtype + a 4-byte position); physical = allocated slots (sum of capacities) x the same.
  size_t bytes_per_slot() const;
  size_t logical_bytes() const;
  size_t physical_bytes() const;
  size_t logical_bytes(int layer, int head) const;
  int total_slots() const;

  // Copies a CPU cache in (shapes must match; every head must fit its capacity; bf16 rounds to
  // nearest even) and out (a KvCache with capacity max_length(), same lengths, positions and
  // next_position; bf16 widens exactly). Synchronous; for tests and hand-over.
  void upload(const KvCache& cpu);
  KvCache download() const;

 private:
  size_t index(int layer, int head) const {
    return static_cast<size_t>(layer) * shape_.num_kv_heads + head;
  }
  void check_layer(int layer) const;
  // Copies every head's rows, positions and length into `dst` (capacities >= lengths) and the
  // next position; device to device, then synchronises the device.
  void copy_into(DeviceKvCache& dst) const;
  void push_lengths(int layer, cudaStream_t stream);

  KvCacheShape shape_;
  KvDtype dtype_;
  int32_t next_position_ = 0;
  int64_t h2d_copies_ = 0;
  size_t h2d_bytes_ = 0;
  std::vector<int32_t> capacities_h_, offsets_h_, lengths_h_;  // [num_layers * num_kv_heads]
  std::vector<int> layer_slots_;                               // [num_layers]
  DeviceBuffer<int32_t> capacities_d_, offsets_d_, lengths_d_;
  std::vector<DeviceBuffer<unsigned char>> keys_, values_;  // per layer [slots, head_dim] dtype
  std::vector<DeviceBuffer<int32_t>> positions_;            // per layer [slots]
};

}  // namespace kvb::kernels::cuda
