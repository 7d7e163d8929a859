// DeviceKvCache: one flat buffer per layer, per-head offset/capacity/length; compaction within
// the buffer.
// Host mirrors of the per-head arrays are authoritative: every change is made on the host and
// copied to the device in stream order, so launches can be sized without reading the device.
#include "kernels/cuda/kv_cache_device.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/bf16.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kv_elem.cuh"

namespace kvb::kernels::cuda {
namespace {

// keys/values: f32 [n, num_kv_heads, d] into slot len(h) + t of head h. by_value: len(h) is
// before.v[h] and the kernel writes the new lengths (no upload); otherwise lengths[h] is read
// (the caller pushes the new lengths after).
template <typename T>
__global__ void append_kernel(T* keys, T* values, int32_t* positions, const int32_t* offsets,
                              int32_t* lengths, HeadTable before, bool by_value,
                              const float* src_k, const float* src_v, const int32_t* src_pos,
                              int n, int num_kv_heads, int d) {
  const size_t total = static_cast<size_t>(n) * num_kv_heads * d;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int x = static_cast<int>(i % d);
    const int h = static_cast<int>((i / d) % num_kv_heads);
    const int t = static_cast<int>(i / (static_cast<size_t>(d) * num_kv_heads));
    const int32_t len = by_value ? before.v[h] : lengths[h];
    if (by_value && t == 0 && x == 0) lengths[h] = len + n;  // nobody reads it here
    const size_t slot = static_cast<size_t>(offsets[h]) + len + t;
    kv_store(keys + slot * d + x, src_k[i]);
    kv_store(values + slot * d + x, src_v[i]);
    if (x == 0) positions[slot] = src_pos[t];
  }
}

// One slot of one head: key, value f32 [d] into slot `slot` (absolute row in the layer buffer);
// the head's length becomes new_length.
template <typename T>
__global__ void append_one_kernel(T* keys, T* values, int32_t* positions, size_t slot,
                                  const float* key, const float* value, int32_t position, int d,
                                  int32_t* length, int32_t new_length) {
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    kv_store(keys + slot * d + x, key[x]);
    kv_store(values + slot * d + x, value[x]);
  }
  if (threadIdx.x == 0) {
    positions[slot] = position;
    *length = new_length;
  }
}

// Key channels (EvictionPlan::zero_key_channels): element c of the key of slot s of head h
// becomes 0 when mask[h * d + c] != 0, s < lengths[h] (host lengths as an argument) and the
// slot's position is below below.v[h].
template <typename T>
__global__ void zero_key_channels_kernel(T* keys, const int32_t* positions, HeadTable offsets,
                                         HeadTable lengths, HeadTable below,
                                         const uint8_t* mask, int num_kv_heads, int d,
                                         int max_len) {
  const size_t total = static_cast<size_t>(num_kv_heads) * max_len * d;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % d);
    const int s = static_cast<int>((i / d) % max_len);
    const int h = static_cast<int>(i / (static_cast<size_t>(d) * max_len));
    if (s >= lengths.v[h] || mask[static_cast<size_t>(h) * d + c] == 0) continue;
    const size_t slot = static_cast<size_t>(offsets.v[h]) + s;
    if (positions[slot] < below.v[h]) kv_store(keys + slot * d + c, 0.0f);
  }
}

// `positions: rerotate`: one thread per (head, slot, pair) rotates the key of slot s by RoPE's
// angle for s - position(s) (cuda::rope's arithmetic, attn_factor 1); renumber_kernel then
// writes the positions (a second launch: every pair reads its slot's old position first).
template <typename T>
__global__ void rerotate_kernel(T* keys, const int32_t* positions, HeadTable offsets,
                                HeadTable lengths, const float* inv_freq, int num_kv_heads, int d,
                                int half, bool neox, float linear_scale, int max_len) {
  const size_t total = static_cast<size_t>(num_kv_heads) * max_len * half;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(i % half);
    const int s = static_cast<int>((i / half) % max_len);
    const int h = static_cast<int>(i / (static_cast<size_t>(half) * max_len));
    if (s >= lengths.v[h]) continue;
    const size_t slot = static_cast<size_t>(offsets.v[h]) + s;
    const float position = __fdiv_rn(static_cast<float>(s - positions[slot]), linear_scale);
    const float angle = __fmul_rn(position, inv_freq[p]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float sn = static_cast<float>(sin(static_cast<double>(angle)));
    T* v = keys + slot * d;
    const int a = neox ? p : 2 * p;
    const int b = neox ? p + half : 2 * p + 1;
    const float x0 = kv_load(v + a), x1 = kv_load(v + b);
    kv_store(v + a, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
    kv_store(v + b, __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c)));
  }
}

__global__ void renumber_kernel(int32_t* positions, HeadTable offsets, HeadTable lengths,
                                int num_kv_heads, int max_len) {
  const size_t total = static_cast<size_t>(num_kv_heads) * max_len;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int s = static_cast<int>(i % max_len);
    const int h = static_cast<int>(i / max_len);
    if (s < lengths.v[h]) positions[static_cast<size_t>(offsets.v[h]) + s] = s;
  }
}

// One block per head: list j of head h must be strictly increasing and < lengths[h].
__global__ void validate_keep_kernel(const int32_t* slots, int ld, const int32_t* counts,
                                     const int32_t* lengths, int* flag) {
  const int h = blockIdx.x;
  const int32_t* list = slots + static_cast<size_t>(h) * ld;
  for (int j = threadIdx.x; j < counts[h]; j += blockDim.x) {
    const int32_t prev = j > 0 ? list[j - 1] : -1;
    if (!(list[j] > prev && list[j] < lengths[h])) atomicOr(flag, 1);
  }
}

// Compaction out of place, in two launches over every (head, moving row, 16-byte piece): the
// gather stages each row that moves in scratch, the scatter writes it to its new slot. No row is
// both read and written in one launch, so any number of blocks may run; rows that stay put are
// not touched. (The kernel this replaced moved one head per block, 32 rows per barrier: on an
// H200 a single eviction from a 1024-slot bf16 head, shifting every row, cost ~0.3 ms per
// layer.) Which rows move is a Moves type: move(h, m, &src, &dst) for row m < extent of head h,
// and new_length(h).

// Keep lists: kept slot c of head h comes from slots[h * ld + c]. Counts by value (table) or,
// past kMaxParamHeads heads, from device memory (dev_counts).
struct ListMoves {
  const int32_t* slots;
  int ld;
  const int32_t* dev_counts;  // nullable: then table
  HeadTable table;
  __device__ int32_t count(int h) const { return dev_counts ? dev_counts[h] : table.v[h]; }
  __device__ bool move(int h, int m, int* src, int* dst) const {
    if (m >= count(h)) return false;
    const int32_t from = slots[static_cast<size_t>(h) * ld + m];
    if (from == m) return false;
    *src = from;
    *dst = m;
    return true;
  }
  __device__ int32_t new_length(int h) const { return count(h); }
};

// One victim per head (victim < 0: none): the rows after it move down one slot.
struct VictimMoves {
  HeadTable victim, length;
  __device__ bool move(int h, int m, int* src, int* dst) const {
    const int v = victim.v[h];
    if (v < 0 || v + 1 + m >= length.v[h]) return false;
    *src = v + 1 + m;
    *dst = v + m;
    return true;
  }
  __device__ int32_t new_length(int h) const {
    return length.v[h] - (victim.v[h] >= 0 ? 1 : 0);
  }
};

template <typename V, typename Moves>
__global__ void gather_moves_kernel(const V* __restrict__ keys, const V* __restrict__ values,
                                    const int32_t* __restrict__ positions,
                                    const int32_t* __restrict__ offsets, Moves mv, int extent,
                                    int heads, int vpr, V* __restrict__ stage_k,
                                    V* __restrict__ stage_v, int32_t* __restrict__ stage_pos) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t per_head = static_cast<size_t>(extent) * vpr;
  if (i >= per_head * heads) return;
  const int h = static_cast<int>(i / per_head);
  const size_t hm = i / vpr;  // h * extent + m
  const int m = static_cast<int>(hm - static_cast<size_t>(h) * extent);
  const int e = static_cast<int>(i - hm * vpr);
  int src = 0, dst = 0;
  if (!mv.move(h, m, &src, &dst)) return;
  const size_t row = static_cast<size_t>(offsets[h]) + src;
  stage_k[i] = keys[row * vpr + e];
  stage_v[i] = values[row * vpr + e];
  if (e == 0) stage_pos[hm] = positions[row];
}

// lengths (nullable): each head's new length is written by its first thread, so the lengths
// change with the rows in one stream-ordered step and need no upload.
template <typename V, typename Moves>
__global__ void scatter_moves_kernel(V* __restrict__ keys, V* __restrict__ values,
                                     int32_t* __restrict__ positions,
                                     const int32_t* __restrict__ offsets, Moves mv, int extent,
                                     int heads, int vpr, const V* __restrict__ stage_k,
                                     const V* __restrict__ stage_v,
                                     const int32_t* __restrict__ stage_pos, int32_t* lengths) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t per_head = static_cast<size_t>(extent) * vpr;
  if (i >= per_head * heads) return;
  const int h = static_cast<int>(i / per_head);
  const size_t hm = i / vpr;
  const int m = static_cast<int>(hm - static_cast<size_t>(h) * extent);
  const int e = static_cast<int>(i - hm * vpr);
  if (lengths && m == 0 && e == 0) lengths[h] = mv.new_length(h);
  int src = 0, dst = 0;
  if (!mv.move(h, m, &src, &dst)) return;
  const size_t row = static_cast<size_t>(offsets[h]) + dst;
  keys[row * vpr + e] = stage_k[i];
  values[row * vpr + e] = stage_v[i];
  if (e == 0) positions[row] = stage_pos[hm];
}

// Both launches for rows of `row_bytes` bytes moved as V pieces; `extent` rows per head at most
// move (at least one thread per head runs, for the lengths).
template <typename V, typename Moves>
void move_rows(const DeviceLayerKvView& v, const Moves& mv, int extent, size_t row_bytes,
               int32_t* lengths, cudaStream_t stream) {
  const int vpr = static_cast<int>(row_bytes / sizeof(V));
  extent = std::max(extent, 1);
  const size_t rows = static_cast<size_t>(v.num_kv_heads) * extent;
  const size_t total = rows * vpr;
  StreamScratch stage(2 * rows * row_bytes + rows * sizeof(int32_t), stream);
  V* sk = stage.as<V>();
  V* sv = sk + rows * vpr;
  int32_t* sp = reinterpret_cast<int32_t*>(sv + rows * vpr);
  const unsigned blocks = grid_for(total, 256);
  gather_moves_kernel<V, Moves><<<blocks, 256, 0, stream>>>(
      static_cast<const V*>(v.keys), static_cast<const V*>(v.values), v.positions, v.offsets, mv,
      extent, v.num_kv_heads, vpr, sk, sv, sp);
  KVB_CUDA_CHECK_LAUNCH();
  scatter_moves_kernel<V, Moves><<<blocks, 256, 0, stream>>>(
      static_cast<V*>(v.keys), static_cast<V*>(v.values), v.positions, v.offsets, mv, extent,
      v.num_kv_heads, vpr, sk, sv, sp, lengths);
  KVB_CUDA_CHECK_LAUNCH();
}

// The widest piece that divides a row: 16, 4 or 2 bytes.
template <typename Moves>
void move_rows_any(const DeviceLayerKvView& v, const Moves& mv, int extent, size_t row_bytes,
                   int32_t* lengths, cudaStream_t stream) {
  if (row_bytes % 16 == 0) {
    move_rows<uint4>(v, mv, extent, row_bytes, lengths, stream);
  } else if (row_bytes % 4 == 0) {
    move_rows<uint32_t>(v, mv, extent, row_bytes, lengths, stream);
  } else {
    move_rows<uint16_t>(v, mv, extent, row_bytes, lengths, stream);
  }
}

const char* describe_keep(int) {
  return "a keep list is not strictly increasing or names a slot at or past the head's length";
}

}  // namespace

size_t kv_dtype_bytes(KvDtype dtype) { return dtype == KvDtype::kF32 ? 4 : 2; }
const char* kv_dtype_name(KvDtype dtype) { return dtype == KvDtype::kF32 ? "f32" : "bf16"; }

int DeviceLayerKvView::max_length() const {
  int m = 0;
  for (int h = 0; h < num_kv_heads; ++h) m = std::max(m, static_cast<int>(host_lengths[h]));
  return m;
}

DeviceKvCache::DeviceKvCache(const KvCacheShape& shape, KvDtype dtype, int capacity)
    : DeviceKvCache(shape, dtype,
                    std::vector<int32_t>(static_cast<size_t>(std::max(shape.num_layers, 0)) *
                                             std::max(shape.num_kv_heads, 0),
                                         capacity)) {}

DeviceKvCache::DeviceKvCache(const KvCacheShape& shape, KvDtype dtype,
                             std::vector<int32_t> capacities)
    : shape_(shape), dtype_(dtype), capacities_h_(std::move(capacities)) {
  KVB_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0)
      << "DeviceKvCache: bad shape " << shape.num_layers << "x" << shape.num_kv_heads << "x"
      << shape.head_dim;
  const size_t heads = static_cast<size_t>(shape.num_layers) * shape.num_kv_heads;
  KVB_CHECK(capacities_h_.size() == heads)
      << "DeviceKvCache: " << capacities_h_.size() << " capacities for " << heads << " heads";
  offsets_h_.resize(heads);
  lengths_h_.assign(heads, 0);
  for (int l = 0; l < shape.num_layers; ++l) {
    int64_t slots = 0;
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      const int32_t cap = capacities_h_[index(l, h)];
      KVB_CHECK(cap >= 0) << "DeviceKvCache: layer " << l << " head " << h << " capacity " << cap;
      offsets_h_[index(l, h)] = static_cast<int32_t>(slots);
      slots += cap;
      KVB_CHECK(slots <= std::numeric_limits<int32_t>::max())
          << "DeviceKvCache: layer " << l << " needs " << slots << " slots (int32 offsets)";
    }
    layer_slots_.push_back(static_cast<int>(slots));
    const size_t elem_bytes = static_cast<size_t>(slots) * shape.head_dim * kv_dtype_bytes(dtype);
    keys_.emplace_back(elem_bytes);
    values_.emplace_back(elem_bytes);
    positions_.emplace_back(static_cast<size_t>(slots));
  }
  capacities_d_ = DeviceBuffer<int32_t>(heads);
  offsets_d_ = DeviceBuffer<int32_t>(heads);
  lengths_d_ = DeviceBuffer<int32_t>(heads);
  capacities_d_.upload(capacities_h_.data(), heads);
  offsets_d_.upload(offsets_h_.data(), heads);
  lengths_d_.upload(lengths_h_.data(), heads);
}

void DeviceKvCache::check_layer(int layer) const {
  KVB_CHECK(layer >= 0 && layer < shape_.num_layers)
      << "DeviceKvCache: layer " << layer << " outside [0, " << shape_.num_layers << ")";
}

int DeviceKvCache::max_length() const {
  int m = 0;
  for (int32_t l : lengths_h_) m = std::max(m, static_cast<int>(l));
  return m;
}

DeviceLayerKvView DeviceKvCache::layer(int layer) {
  check_layer(layer);
  const size_t i = index(layer, 0);
  DeviceLayerKvView v;
  v.keys = keys_[layer].data();
  v.values = values_[layer].data();
  v.positions = positions_[layer].data();
  v.offsets = offsets_d_.data() + i;
  v.capacities = capacities_d_.data() + i;
  v.lengths = lengths_d_.data() + i;
  v.host_lengths = lengths_h_.data() + i;
  v.num_kv_heads = shape_.num_kv_heads;
  v.head_dim = shape_.head_dim;
  v.dtype = dtype_;
  return v;
}

void DeviceKvCache::push_lengths(int layer, cudaStream_t stream) {
  ++h2d_copies_;
  h2d_bytes_ += shape_.num_kv_heads * sizeof(int32_t);
  // The call returns once the bytes are staged (or copied for a captured step's graph, graph.h),
  // so the mirror may change after.
  const size_t i = index(layer, 0);
  upload_async(lengths_d_.data() + i, lengths_h_.data() + i, shape_.num_kv_heads * sizeof(int32_t),
               stream);
}

void DeviceKvCache::append(int layer, const float* keys, const float* values,
                           const int32_t* positions, int n, cudaStream_t stream) {
  check_layer(layer);
  KVB_CHECK(n >= 0) << "DeviceKvCache::append: n = " << n;
  if (n == 0) return;
  KVB_CHECK(keys != nullptr && values != nullptr && positions != nullptr)
      << "DeviceKvCache::append: null pointer";
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    KVB_CHECK(length(layer, h) + static_cast<int64_t>(n) <= capacity(layer, h))
        << "DeviceKvCache::append: layer " << layer << " head " << h << " holds "
        << length(layer, h) << " of " << capacity(layer, h) << " slots, no room for " << n;
  }
  const DeviceLayerKvView v = this->layer(layer);
  const int heads = shape_.num_kv_heads;
  const size_t total = static_cast<size_t>(n) * heads * shape_.head_dim;
  const unsigned blocks = std::min(grid_for(total, 256), 65535u);
  const bool by_value = heads <= kMaxParamHeads;
  HeadTable before{};
  if (by_value) {
    for (int h = 0; h < heads; ++h) before.v[h] = length(layer, h);
  }
  int32_t* lengths = lengths_d_.data() + index(layer, 0);
  if (dtype_ == KvDtype::kF32) {
    append_kernel<<<blocks, 256, 0, stream>>>(
        static_cast<float*>(v.keys), static_cast<float*>(v.values), v.positions, v.offsets,
        lengths, before, by_value, keys, values, positions, n, heads, shape_.head_dim);
  } else {
    append_kernel<<<blocks, 256, 0, stream>>>(
        static_cast<__nv_bfloat16*>(v.keys), static_cast<__nv_bfloat16*>(v.values), v.positions,
        v.offsets, lengths, before, by_value, keys, values, positions, n, heads,
        shape_.head_dim);
  }
  KVB_CUDA_CHECK_LAUNCH();
  for (int h = 0; h < heads; ++h) lengths_h_[index(layer, h)] += n;
  if (!by_value) push_lengths(layer, stream);
}

void DeviceKvCache::append(int layer, int head, const float* key, const float* value,
                           int32_t position, cudaStream_t stream) {
  check_layer(layer);
  KVB_CHECK(head >= 0 && head < shape_.num_kv_heads)
      << "DeviceKvCache::append: head " << head << " outside [0, " << shape_.num_kv_heads << ")";
  KVB_CHECK(length(layer, head) < capacity(layer, head))
      << "DeviceKvCache::append: layer " << layer << " head " << head << " is full ("
      << capacity(layer, head) << " slots)";
  KVB_CHECK(key != nullptr && value != nullptr) << "DeviceKvCache::append: null pointer";
  const size_t slot = static_cast<size_t>(offset(layer, head)) + length(layer, head);
  const int d = shape_.head_dim;
  int32_t* len = lengths_d_.data() + index(layer, head);
  const int32_t grown = length(layer, head) + 1;
  if (dtype_ == KvDtype::kF32) {
    append_one_kernel<<<1, 256, 0, stream>>>(reinterpret_cast<float*>(keys_[layer].data()),
                                             reinterpret_cast<float*>(values_[layer].data()),
                                             positions_[layer].data(), slot, key, value, position,
                                             d, len, grown);
  } else {
    append_one_kernel<<<1, 256, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(keys_[layer].data()),
        reinterpret_cast<__nv_bfloat16*>(values_[layer].data()), positions_[layer].data(), slot,
        key, value, position, d, len, grown);
  }
  KVB_CUDA_CHECK_LAUNCH();
  lengths_h_[index(layer, head)] = grown;
}

void DeviceKvCache::keep_slots(int layer, const int32_t* slots, int ld, const int32_t* counts,
                               cudaStream_t stream, bool validated) {
  check_layer(layer);
  const int heads = shape_.num_kv_heads;
  KVB_CHECK(ld >= 0) << "DeviceKvCache::keep_slots: ld = " << ld;
  for (int h = 0; h < heads; ++h) {
    KVB_CHECK(counts[h] >= 0 && counts[h] <= length(layer, h) && counts[h] <= ld)
        << "DeviceKvCache::keep_slots: layer " << layer << " head " << h << " keeps " << counts[h]
        << " of " << length(layer, h) << " slots (ld " << ld << ")";
  }
  KVB_CHECK(slots != nullptr || ld == 0) << "DeviceKvCache::keep_slots: null slot lists";
  const DeviceLayerKvView v = this->layer(layer);
  const bool by_value = heads <= kMaxParamHeads;
  // The counts go up only where the device needs them in memory: to validate the lists, or for
  // a layer with more heads than a kernel argument holds.
  std::unique_ptr<StreamScratch> counts_d;
  if (!validated || !by_value) {
    counts_d = std::make_unique<StreamScratch>(heads * sizeof(int32_t), stream);
    upload_async(counts_d->as<int32_t>(), counts, heads * sizeof(int32_t), stream);
    ++h2d_copies_;
    h2d_bytes_ += heads * sizeof(int32_t);
  }
  if (!validated) {
    DeviceErrorFlag flag(stream);
    validate_keep_kernel<<<heads, 256, 0, stream>>>(slots, ld, counts_d->as<int32_t>(),
                                                    v.lengths, flag.flag());
    KVB_CUDA_CHECK_LAUNCH();
    flag.check("DeviceKvCache::keep_slots", describe_keep);
  }
  ListMoves mv{slots, ld, by_value ? nullptr : counts_d->as<int32_t>(), {}};
  if (by_value) std::copy(counts, counts + heads, mv.table.v);
  const size_t row_bytes = static_cast<size_t>(shape_.head_dim) * kv_dtype_bytes(dtype_);
  move_rows_any(v, mv, ld, row_bytes, by_value ? lengths_d_.data() + index(layer, 0) : nullptr,
                stream);
  for (int h = 0; h < heads; ++h) lengths_h_[index(layer, h)] = counts[h];
  if (!by_value) push_lengths(layer, stream);
}

void DeviceKvCache::evict_slots(int layer, const int32_t* victims, cudaStream_t stream) {
  check_layer(layer);
  const int heads = shape_.num_kv_heads;
  KVB_CHECK(victims != nullptr) << "DeviceKvCache::evict_slots: null victims";
  int extent = 0;
  bool any = false;
  for (int h = 0; h < heads; ++h) {
    KVB_CHECK(victims[h] < length(layer, h))
        << "DeviceKvCache::evict_slots: layer " << layer << " head " << h << " victim "
        << victims[h] << " at or past its length " << length(layer, h);
    if (victims[h] < 0) continue;
    any = true;
    extent = std::max(extent, length(layer, h) - 1 - victims[h]);
  }
  if (!any) return;
  if (heads > kMaxParamHeads) {
    // Past a kernel argument's heads: keep lists, uploaded (validated above).
    int ld = 0;
    for (int h = 0; h < heads; ++h) ld = std::max(ld, length(layer, h));
    std::vector<int32_t> lists(static_cast<size_t>(heads) * ld), counts(heads);
    for (int h = 0; h < heads; ++h) {
      int32_t* row = &lists[static_cast<size_t>(h) * ld];
      int c = 0;
      for (int s = 0; s < length(layer, h); ++s) {
        if (s != victims[h]) row[c++] = s;
      }
      counts[h] = c;
    }
    StreamScratch lists_d(std::max<size_t>(lists.size(), 1) * sizeof(int32_t), stream);
    upload_async(lists_d.as<int32_t>(), lists.data(), lists.size() * sizeof(int32_t), stream);
    ++h2d_copies_;
    h2d_bytes_ += lists.size() * sizeof(int32_t);
    keep_slots(layer, lists_d.as<int32_t>(), ld, counts.data(), stream, /*validated=*/true);
    return;
  }
  VictimMoves mv{};
  for (int h = 0; h < heads; ++h) {
    mv.victim.v[h] = victims[h] < 0 ? -1 : victims[h];
    mv.length.v[h] = length(layer, h);
  }
  const size_t row_bytes = static_cast<size_t>(shape_.head_dim) * kv_dtype_bytes(dtype_);
  move_rows_any(this->layer(layer), mv, extent, row_bytes, lengths_d_.data() + index(layer, 0),
                stream);
  for (int h = 0; h < heads; ++h) {
    if (victims[h] >= 0) --lengths_h_[index(layer, h)];
  }
}

void DeviceKvCache::rerotate_keys(int layer, const cpu::RopeParams& rope, cudaStream_t stream) {
  check_layer(layer);
  const int heads = shape_.num_kv_heads, d = shape_.head_dim;
  KVB_CHECK(heads <= kMaxParamHeads && rope.rot_dim > 0 && rope.rot_dim <= d &&
            rope.rot_dim % 2 == 0 && rope.linear_scale > 0)
      << "DeviceKvCache::rerotate_keys: " << heads << " heads (at most " << kMaxParamHeads
      << "), rot_dim " << rope.rot_dim << " of head_dim " << d;
  const int half = rope.rot_dim / 2;
  const std::vector<float> inv_freq = cpu::rope_inv_freqs(rope);  // the host's bits
  HeadTable offsets{}, lengths{};
  int max_len = 0;
  for (int h = 0; h < heads; ++h) {
    offsets.v[h] = offset(layer, h);
    lengths.v[h] = length(layer, h);
    max_len = std::max(max_len, length(layer, h));
  }
  if (max_len == 0) return;
  StreamScratch freq_d(inv_freq.size() * sizeof(float), stream);
  upload_async(freq_d.as<float>(), inv_freq.data(), inv_freq.size() * sizeof(float), stream);
  ++h2d_copies_;
  h2d_bytes_ += inv_freq.size() * sizeof(float);
  const DeviceLayerKvView v = this->layer(layer);
  const bool neox = rope.style == cpu::RopeStyle::kNeox;
  const size_t total = static_cast<size_t>(heads) * max_len * half;
  const int blocks = static_cast<int>(std::min<size_t>((total + 255) / 256, 4096));
  if (dtype_ == KvDtype::kBf16) {
    rerotate_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(v.keys), v.positions,
                                                offsets, lengths, freq_d.as<float>(), heads, d,
                                                half, neox, rope.linear_scale, max_len);
  } else {
    rerotate_kernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(v.keys), v.positions, offsets,
                                                lengths, freq_d.as<float>(), heads, d, half, neox,
                                                rope.linear_scale, max_len);
  }
  KVB_CUDA_CHECK_LAUNCH();
  const size_t slots = static_cast<size_t>(heads) * max_len;
  renumber_kernel<<<static_cast<int>(std::min<size_t>((slots + 255) / 256, 4096)), 256, 0,
                    stream>>>(v.positions, offsets, lengths, heads, max_len);
  KVB_CUDA_CHECK_LAUNCH();
}

void DeviceKvCache::zero_key_channels(const EvictionPlan& plan, cudaStream_t stream) {
  const int layer = plan.layer();
  check_layer(layer);
  const int heads = shape_.num_kv_heads, d = shape_.head_dim;
  KVB_CHECK(plan.num_heads() == heads && heads <= kMaxParamHeads)
      << "DeviceKvCache::zero_key_channels: a plan of " << plan.num_heads() << " heads for "
      << heads << " (at most " << kMaxParamHeads << ")";
  if (!plan.prunes_channels()) return;
  std::vector<uint8_t> mask(static_cast<size_t>(heads) * d, 0);
  HeadTable offsets{}, lengths{}, below{};
  int max_len = 0;
  for (int h = 0; h < heads; ++h) {
    offsets.v[h] = offset(layer, h);
    lengths.v[h] = length(layer, h);
    below.v[h] = plan.channels_below(h);
    max_len = std::max(max_len, length(layer, h));
  }
  for (int32_t h : plan.channel_heads()) {
    for (int32_t c : plan.key_channels(h)) {
      KVB_CHECK(c >= 0 && c < d) << "DeviceKvCache::zero_key_channels: layer " << layer
                                 << " head " << h << " channel " << c << " outside [0, " << d
                                 << ")";
      mask[static_cast<size_t>(h) * d + c] = 1;
    }
  }
  if (max_len == 0) return;
  StreamScratch mask_d(mask.size(), stream);
  upload_async(mask_d.as<uint8_t>(), mask.data(), mask.size(), stream);
  ++h2d_copies_;
  h2d_bytes_ += mask.size();
  const DeviceLayerKvView v = this->layer(layer);
  const size_t total = static_cast<size_t>(heads) * max_len * d;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((total + threads - 1) / threads, 4096));
  if (dtype_ == KvDtype::kBf16) {
    zero_key_channels_kernel<<<blocks, threads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(v.keys), v.positions, offsets, lengths, below,
        mask_d.as<uint8_t>(), heads, d, max_len);
  } else {
    zero_key_channels_kernel<<<blocks, threads, 0, stream>>>(
        static_cast<float*>(v.keys), v.positions, offsets, lengths, below, mask_d.as<uint8_t>(),
        heads, d, max_len);
  }
  KVB_CUDA_CHECK_LAUNCH();
}

void DeviceKvCache::keep_slots(int layer, int head, const std::vector<int32_t>& slots) {
  check_layer(layer);
  KVB_CHECK(head >= 0 && head < shape_.num_kv_heads)
      << "DeviceKvCache::keep_slots: head " << head << " outside [0, " << shape_.num_kv_heads
      << ")";
  // Every other head keeps all its slots: lists 0..len-1 (already in place, so the compaction
  // kernel skips them chunk by chunk).
  const int heads = shape_.num_kv_heads;
  int ld = static_cast<int>(slots.size());
  for (int h = 0; h < heads; ++h) ld = std::max(ld, length(layer, h));
  std::vector<int32_t> lists(static_cast<size_t>(heads) * ld, 0), counts(heads);
  for (int h = 0; h < heads; ++h) {
    int32_t* row = &lists[static_cast<size_t>(h) * ld];
    if (h == head) {
      std::copy(slots.begin(), slots.end(), row);
      counts[h] = static_cast<int32_t>(slots.size());
    } else {
      for (int j = 0; j < length(layer, h); ++j) row[j] = j;
      counts[h] = length(layer, h);
    }
  }
  DeviceBuffer<int32_t> lists_d(lists.size());
  lists_d.upload(lists.data(), lists.size());
  keep_slots(layer, lists_d.data(), ld, counts.data(), 0);
  KVB_CUDA_CHECK(cudaStreamSynchronize(0));
}

void DeviceKvCache::clear() {
  std::fill(lengths_h_.begin(), lengths_h_.end(), 0);
  lengths_d_.upload(lengths_h_.data(), lengths_h_.size());
  next_position_ = 0;
}

size_t DeviceKvCache::bytes_per_slot() const {
  return 2 * static_cast<size_t>(shape_.head_dim) * kv_dtype_bytes(dtype_) + sizeof(int32_t);
}
int DeviceKvCache::total_slots() const {
  int t = 0;
  for (int32_t l : lengths_h_) t += l;
  return t;
}
size_t DeviceKvCache::logical_bytes() const { return total_slots() * bytes_per_slot(); }
size_t DeviceKvCache::logical_bytes(int layer, int head) const {
  return static_cast<size_t>(length(layer, head)) * bytes_per_slot();
}
size_t DeviceKvCache::physical_bytes() const {
  size_t slots = 0;
  for (int s : layer_slots_) slots += s;
  return slots * bytes_per_slot();
}

void DeviceKvCache::upload(const KvCache& cpu_cache) {
  require_no_capture("DeviceKvCache::upload (a wait for the device)");
  const KvCacheShape& s = cpu_cache.shape();
  KVB_CHECK(s.num_layers == shape_.num_layers && s.num_kv_heads == shape_.num_kv_heads &&
            s.head_dim == shape_.head_dim)
      << "DeviceKvCache::upload: shape " << s.num_layers << "x" << s.num_kv_heads << "x"
      << s.head_dim << " into " << shape_.num_layers << "x" << shape_.num_kv_heads << "x"
      << shape_.head_dim;
  KvCache& src = const_cast<KvCache&>(cpu_cache);  // layer() is non-const; only read here
  for (int l = 0; l < shape_.num_layers; ++l) {    // check everything before changing anything
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      KVB_CHECK(cpu_cache.length(l, h) <= capacity(l, h))
          << "DeviceKvCache::upload: layer " << l << " head " << h << " holds "
          << cpu_cache.length(l, h) << " slots, capacity " << capacity(l, h);
    }
  }
  const int d = shape_.head_dim;
  const size_t eb = kv_dtype_bytes(dtype_);
  for (int l = 0; l < shape_.num_layers; ++l) {
    const LayerKvView view = src.layer(l);
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const int len = cpu_cache.length(l, h);
      const size_t elems = static_cast<size_t>(len) * d;
      const size_t at = static_cast<size_t>(offset(l, h)) * d * eb;
      for (int which = 0; which < 2; ++which) {
        const float* from = which == 0 ? view.key(h, 0) : view.value(h, 0);
        unsigned char* to = (which == 0 ? keys_[l] : values_[l]).data() + at;
        if (dtype_ == KvDtype::kF32) {
          KVB_CUDA_CHECK(cudaMemcpy(to, from, elems * 4, cudaMemcpyHostToDevice));
        } else {
          std::vector<uint16_t> tmp(elems);
          for (size_t i = 0; i < elems; ++i) tmp[i] = cpu::bf16_from_f32(from[i]);
          KVB_CUDA_CHECK(cudaMemcpy(to, tmp.data(), elems * 2, cudaMemcpyHostToDevice));
        }
      }
      KVB_CUDA_CHECK(cudaMemcpy(positions_[l].data() + offset(l, h), view.position(h),
                                len * sizeof(int32_t), cudaMemcpyHostToDevice));
      lengths_h_[index(l, h)] = len;
    }
  }
  lengths_d_.upload(lengths_h_.data(), lengths_h_.size());
  next_position_ = cpu_cache.next_position();
}

void DeviceKvCache::copy_into(DeviceKvCache& dst) const {
  require_no_capture("DeviceKvCache::copy_into (a wait for the device)");
  KVB_CHECK(dst.shape_.num_layers == shape_.num_layers &&
            dst.shape_.num_kv_heads == shape_.num_kv_heads &&
            dst.shape_.head_dim == shape_.head_dim && dst.dtype_ == dtype_)
      << "DeviceKvCache::copy_into: another shape or dtype";
  KVB_CUDA_CHECK(cudaDeviceSynchronize());  // pending appends/compactions on any stream
  const int d = shape_.head_dim;
  const size_t eb = kv_dtype_bytes(dtype_);
  for (int l = 0; l < shape_.num_layers; ++l) {
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const int len = length(l, h);
      KVB_CHECK(len <= dst.capacity(l, h))
          << "DeviceKvCache::copy_into: layer " << l << " head " << h << " holds " << len
          << " slots, the copy has room for " << dst.capacity(l, h);
      dst.lengths_h_[index(l, h)] = len;
      if (len == 0) continue;
      const size_t bytes = static_cast<size_t>(len) * d * eb;
      const size_t from = static_cast<size_t>(offset(l, h)) * d * eb;
      const size_t to = static_cast<size_t>(dst.offset(l, h)) * d * eb;
      KVB_CUDA_CHECK(cudaMemcpy(dst.keys_[l].data() + to, keys_[l].data() + from, bytes,
                                cudaMemcpyDeviceToDevice));
      KVB_CUDA_CHECK(cudaMemcpy(dst.values_[l].data() + to, values_[l].data() + from, bytes,
                                cudaMemcpyDeviceToDevice));
      KVB_CUDA_CHECK(cudaMemcpy(dst.positions_[l].data() + dst.offset(l, h),
                                positions_[l].data() + offset(l, h), len * sizeof(int32_t),
                                cudaMemcpyDeviceToDevice));
    }
  }
  dst.lengths_d_.upload(dst.lengths_h_.data(), dst.lengths_h_.size());
  dst.next_position_ = next_position_;
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
}

std::unique_ptr<DeviceRows> DeviceKvCache::clone() const {
  auto copy = std::make_unique<DeviceKvCache>(shape_, dtype_, capacities_h_);
  copy_into(*copy);
  return copy;
}

std::unique_ptr<DeviceRows> DeviceKvCache::fork(int extra) const {
  auto copy = std::make_unique<DeviceKvCache>(shape_, dtype_, max_length() + extra);
  copy_into(*copy);
  return copy;
}

std::unique_ptr<DeviceKvCache> DeviceKvCache::grown(int capacity) const {
  std::vector<int32_t> caps = capacities_h_;
  for (int32_t& c : caps) c = std::max(c, capacity);
  auto copy = std::make_unique<DeviceKvCache>(shape_, dtype_, std::move(caps));
  copy_into(*copy);
  return copy;
}

void DeviceKvCache::read_positions(int layer, int capacity, int32_t* dst) const {
  require_no_capture("DeviceKvCache::read_positions (a wait for the device)");
  check_layer(layer);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());  // pending compactions on any stream
  const int slots = layer_slots_[layer];
  std::vector<int32_t> all(slots);
  if (slots > 0) {
    KVB_CUDA_CHECK(cudaMemcpy(all.data(), positions_[layer].data(), slots * sizeof(int32_t),
                              cudaMemcpyDeviceToHost));
  }
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    const int len = length(layer, h);
    KVB_CHECK(len <= capacity) << "read_positions: layer " << layer << " head " << h << " holds "
                               << len << " slots, the host index room for " << capacity;
    std::copy_n(all.begin() + offset(layer, h), len, dst + static_cast<size_t>(h) * capacity);
  }
}

KvCache DeviceKvCache::download() const {
  require_no_capture("DeviceKvCache::download (a wait for the device)");
  KVB_CUDA_CHECK(cudaDeviceSynchronize());  // pending appends/compactions on any stream
  KvCache out(shape_, std::max(1, max_length()));
  const int d = shape_.head_dim;
  const size_t eb = kv_dtype_bytes(dtype_);
  std::vector<float> k, v;
  std::vector<uint16_t> raw;
  std::vector<int32_t> pos;
  for (int l = 0; l < shape_.num_layers; ++l) {
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const int len = length(l, h);
      const size_t elems = static_cast<size_t>(len) * d;
      const size_t at = static_cast<size_t>(offset(l, h)) * d * eb;
      k.resize(elems);
      v.resize(elems);
      for (int which = 0; which < 2; ++which) {
        std::vector<float>& to = which == 0 ? k : v;
        const unsigned char* from = (which == 0 ? keys_[l] : values_[l]).data() + at;
        if (dtype_ == KvDtype::kF32) {
          KVB_CUDA_CHECK(cudaMemcpy(to.data(), from, elems * 4, cudaMemcpyDeviceToHost));
        } else {
          raw.resize(elems);
          KVB_CUDA_CHECK(cudaMemcpy(raw.data(), from, elems * 2, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < elems; ++i) to[i] = cpu::f32_from_bf16(raw[i]);
        }
      }
      pos.resize(len);
      KVB_CUDA_CHECK(cudaMemcpy(pos.data(), positions_[l].data() + offset(l, h),
                                len * sizeof(int32_t), cudaMemcpyDeviceToHost));
      for (int s = 0; s < len; ++s) {
        out.append(l, h, &k[static_cast<size_t>(s) * d], &v[static_cast<size_t>(s) * d], pos[s]);
      }
    }
  }
  out.advance_position(next_position_);
  return out;
}

}  // namespace kvb::kernels::cuda
