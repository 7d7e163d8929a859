// DeviceKvCache: one flat buffer per layer, per-head offset/capacity/length; compaction within
// the buffer.
// Host mirrors of the per-head arrays are authoritative: every change is made on the host and
// copied to the device in stream order, so launches can be sized without reading the device.
#include "kernels/cuda/kv_cache_device.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/bf16.h"
#include "kernels/cuda/kv_elem.cuh"

namespace kvb::kernels::cuda {
namespace {

// keys/values: f32 [n, num_kv_heads, d] into slot lengths[h] + t of head h.
template <typename T>
__global__ void append_kernel(T* keys, T* values, int32_t* positions, const int32_t* offsets,
                              const int32_t* lengths, const float* src_k, const float* src_v,
                              const int32_t* src_pos, int n, int num_kv_heads, int d) {
  const size_t total = static_cast<size_t>(n) * num_kv_heads * d;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int x = static_cast<int>(i % d);
    const int h = static_cast<int>((i / d) % num_kv_heads);
    const int t = static_cast<int>(i / (static_cast<size_t>(d) * num_kv_heads));
    const size_t slot = static_cast<size_t>(offsets[h]) + lengths[h] + t;
    kv_store(keys + slot * d + x, src_k[i]);
    kv_store(values + slot * d + x, src_v[i]);
    if (x == 0) positions[slot] = src_pos[t];
  }
}

// One slot of one head: key, value f32 [d] into slot `slot` (absolute row in the layer buffer).
template <typename T>
__global__ void append_one_kernel(T* keys, T* values, int32_t* positions, size_t slot,
                                  const float* key, const float* value, int32_t position, int d) {
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    kv_store(keys + slot * d + x, key[x]);
    kv_store(values + slot * d + x, value[x]);
  }
  if (threadIdx.x == 0) positions[slot] = position;
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

// Compaction out of place, in two launches over every (head, kept slot, 16-byte piece): the
// gather stages each row that moves (list[c] != c) in scratch, the scatter writes it to slot c.
// No row is both read and written in one launch, so any number of blocks may run; a list is
// strictly increasing, so rows with list[c] == c stay put and are not touched. (The kernel this
// replaces moved one head per block, 32 rows per barrier: on an H200 a single eviction from a
// 1024-slot bf16 head, shifting every row, cost ~0.3 ms per layer.)
template <typename V>
__global__ void gather_kept_kernel(const V* __restrict__ keys, const V* __restrict__ values,
                                   const int32_t* __restrict__ positions,
                                   const int32_t* __restrict__ offsets,
                                   const int32_t* __restrict__ slots, int ld,
                                   const int32_t* __restrict__ counts, int heads, int vpr,
                                   V* __restrict__ stage_k, V* __restrict__ stage_v,
                                   int32_t* __restrict__ stage_pos) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t per_head = static_cast<size_t>(ld) * vpr;
  if (i >= per_head * heads) return;
  const int h = static_cast<int>(i / per_head);
  const size_t hc = i / vpr;  // h * ld + c
  const int c = static_cast<int>(hc - static_cast<size_t>(h) * ld);
  const int e = static_cast<int>(i - hc * vpr);
  if (c >= counts[h]) return;
  const int32_t src = slots[hc];
  if (src == c) return;
  const size_t row = static_cast<size_t>(offsets[h]) + src;
  stage_k[i] = keys[row * vpr + e];
  stage_v[i] = values[row * vpr + e];
  if (e == 0) stage_pos[hc] = positions[row];
}

template <typename V>
__global__ void scatter_kept_kernel(V* __restrict__ keys, V* __restrict__ values,
                                    int32_t* __restrict__ positions,
                                    const int32_t* __restrict__ offsets,
                                    const int32_t* __restrict__ slots, int ld,
                                    const int32_t* __restrict__ counts, int heads, int vpr,
                                    const V* __restrict__ stage_k, const V* __restrict__ stage_v,
                                    const int32_t* __restrict__ stage_pos) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t per_head = static_cast<size_t>(ld) * vpr;
  if (i >= per_head * heads) return;
  const int h = static_cast<int>(i / per_head);
  const size_t hc = i / vpr;
  const int c = static_cast<int>(hc - static_cast<size_t>(h) * ld);
  const int e = static_cast<int>(i - hc * vpr);
  if (c >= counts[h] || slots[hc] == c) return;
  const size_t row = static_cast<size_t>(offsets[h]) + c;
  keys[row * vpr + e] = stage_k[i];
  values[row * vpr + e] = stage_v[i];
  if (e == 0) positions[row] = stage_pos[hc];
}

// Both launches for rows of `row_bytes` bytes moved as V pieces.
template <typename V>
void compact_rows(void* keys, void* values, int32_t* positions, const int32_t* offsets,
                  const int32_t* slots, int ld, const int32_t* counts, int heads,
                  size_t row_bytes, cudaStream_t stream) {
  const int vpr = static_cast<int>(row_bytes / sizeof(V));
  const size_t rows = static_cast<size_t>(heads) * ld;
  const size_t total = rows * vpr;
  if (total == 0) return;
  StreamScratch stage(2 * rows * row_bytes + rows * sizeof(int32_t), stream);
  V* sk = stage.as<V>();
  V* sv = sk + rows * vpr;
  int32_t* sp = reinterpret_cast<int32_t*>(sv + rows * vpr);
  const unsigned blocks = static_cast<unsigned>((total + 255) / 256);
  gather_kept_kernel<V><<<blocks, 256, 0, stream>>>(static_cast<const V*>(keys),
                                                    static_cast<const V*>(values), positions,
                                                    offsets, slots, ld, counts, heads, vpr, sk,
                                                    sv, sp);
  KVB_CUDA_CHECK_LAUNCH();
  scatter_kept_kernel<V><<<blocks, 256, 0, stream>>>(static_cast<V*>(keys),
                                                     static_cast<V*>(values), positions, offsets,
                                                     slots, ld, counts, heads, vpr, sk, sv, sp);
  KVB_CUDA_CHECK_LAUNCH();
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
  // Pageable source: the call returns once the bytes are staged, so the mirror may change after.
  const size_t i = index(layer, 0);
  KVB_CUDA_CHECK(cudaMemcpyAsync(lengths_d_.data() + i, lengths_h_.data() + i,
                                 shape_.num_kv_heads * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream));
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
  const size_t total = static_cast<size_t>(n) * shape_.num_kv_heads * shape_.head_dim;
  const unsigned blocks = std::min(grid_for(total, 256), 65535u);
  if (dtype_ == KvDtype::kF32) {
    append_kernel<<<blocks, 256, 0, stream>>>(
        static_cast<float*>(v.keys), static_cast<float*>(v.values), v.positions, v.offsets,
        v.lengths, keys, values, positions, n, shape_.num_kv_heads, shape_.head_dim);
  } else {
    append_kernel<<<blocks, 256, 0, stream>>>(
        static_cast<__nv_bfloat16*>(v.keys), static_cast<__nv_bfloat16*>(v.values), v.positions,
        v.offsets, v.lengths, keys, values, positions, n, shape_.num_kv_heads, shape_.head_dim);
  }
  KVB_CUDA_CHECK_LAUNCH();
  for (int h = 0; h < shape_.num_kv_heads; ++h) lengths_h_[index(layer, h)] += n;
  push_lengths(layer, stream);
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
  if (dtype_ == KvDtype::kF32) {
    append_one_kernel<<<1, 256, 0, stream>>>(reinterpret_cast<float*>(keys_[layer].data()),
                                             reinterpret_cast<float*>(values_[layer].data()),
                                             positions_[layer].data(), slot, key, value, position,
                                             d);
  } else {
    append_one_kernel<<<1, 256, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(keys_[layer].data()),
        reinterpret_cast<__nv_bfloat16*>(values_[layer].data()), positions_[layer].data(), slot,
        key, value, position, d);
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++lengths_h_[index(layer, head)];
  push_lengths(layer, stream);
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
  StreamScratch counts_d(heads * sizeof(int32_t), stream);
  KVB_CUDA_CHECK(cudaMemcpyAsync(counts_d.as<int32_t>(), counts, heads * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream));
  const DeviceLayerKvView v = this->layer(layer);
  if (!validated) {
    DeviceErrorFlag flag(stream);
    validate_keep_kernel<<<heads, 256, 0, stream>>>(slots, ld, counts_d.as<int32_t>(), v.lengths,
                                                    flag.flag());
    KVB_CUDA_CHECK_LAUNCH();
    flag.check("DeviceKvCache::keep_slots", describe_keep);
  }
  const size_t row_bytes = static_cast<size_t>(shape_.head_dim) * kv_dtype_bytes(dtype_);
  if (row_bytes % 16 == 0) {
    compact_rows<uint4>(v.keys, v.values, v.positions, v.offsets, slots, ld,
                        counts_d.as<int32_t>(), heads, row_bytes, stream);
  } else if (row_bytes % 4 == 0) {
    compact_rows<uint32_t>(v.keys, v.values, v.positions, v.offsets, slots, ld,
                           counts_d.as<int32_t>(), heads, row_bytes, stream);
  } else {
    compact_rows<uint16_t>(v.keys, v.values, v.positions, v.offsets, slots, ld,
                           counts_d.as<int32_t>(), heads, row_bytes, stream);
  }
  for (int h = 0; h < heads; ++h) lengths_h_[index(layer, h)] = counts[h];
  push_lengths(layer, stream);
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
