// CudaPolicyOps: the policy ops table on the device (cuda_policy_ops.h).
#include "kernels/cuda/cuda_policy_ops.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/budget.h"
#include "kernels/cuda/budget.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/pool.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/scores.h"
#include "kernels/cuda/select_common.cuh"
#include "kernels/ops/policy_ops.h"

namespace kvb::kernels::cuda {
namespace {

using ops_detail::CudaRows;
using ops_detail::blocks_for;
using ops_detail::device;
using ops_detail::row_lengths;
using ops::KeepTop;
using ops::SlotRows;
using ops::SlotType;

constexpr int kThreads = 512;

// Per-head sizes as a kernel argument (no H2D copy): kv_cache_device.h's HeadTable.
static_assert(kMaxOpsHeads <= kMaxParamHeads, "a HeadTable holds every head the ops decide for");

void check_rows(const SlotRows& rows, int layer) {
  KVB_CHECK(layer >= 0 && layer < rows.layers())
      << "cuda policy ops: layer " << layer << " of rows for " << rows.layers() << " layers";
  KVB_USAGE_CHECK(rows.heads() <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " cache heads per layer; this "
      << "policy's state has " << rows.heads() << " (gqa=expand on a model with many heads?)";
}

// Entries [from[h], to[h]) of each row h become zero.
template <typename T>
__global__ void zero_kernel(T* rows, int ld, HeadTable from, HeadTable to) {
  const int h = blockIdx.y;
  T* row = rows + static_cast<size_t>(h) * ld;
  for (int s = from.v[h] + blockIdx.x * blockDim.x + threadIdx.x; s < to.v[h];
       s += gridDim.x * blockDim.x) {
    row[s] = T(0);
  }
}

// rows[h][s] += reduce_g src[h * head_stride + g * row_stride + s], s < len[h]: reduce_gqa's
// order (g increasing; mean divides the sum by group in f32; max as std::max). Entries at or
// past fresh[h] are new: they start from 0 (what resize writes) instead of being read.
__global__ void accumulate_kernel(float* rows, int ld, HeadTable len, HeadTable fresh,
                                  const float* src, size_t head_stride, size_t row_stride,
                                  int group, bool max) {
  const int h = blockIdx.y;
  const float* base = src + h * head_stride;
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < len.v[h]; s += gridDim.x * blockDim.x) {
    float acc = base[s];
    for (int g = 1; g < group; ++g) {
      const float v = base[g * row_stride + s];
      acc = max ? (acc < v ? v : acc) : acc + v;
    }
    float& out = rows[static_cast<size_t>(h) * ld + s];
    out = (s >= fresh.v[h] ? 0.0f : out) + (max ? acc : acc / static_cast<float>(group));
  }
}

// One thread per (vector, row): the squares of the vector's entries in index order, in f64.
__global__ void norms_kernel(float* rows, int ld, HeadTable before, const float* vectors, int n,
                             int src_heads, int expand, int d) {
  const int h = blockIdx.y, t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float* v = vectors + (static_cast<size_t>(t) * src_heads + h / expand) * d;
  double sum = 0;
  for (int i = 0; i < d; ++i) sum += static_cast<double>(v[i]) * v[i];
  rows[static_cast<size_t>(h) * ld + before.v[h] + t] = static_cast<float>(sqrt(sum));
}

__global__ void popcount_kernel(const uint64_t* bits, int ld_bits, float* out, int ld_out,
                                HeadTable len) {
  const int h = blockIdx.y;
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < len.v[h]; s += gridDim.x * blockDim.x) {
    out[static_cast<size_t>(h) * ld_out + s] =
        static_cast<float>(__popcll(bits[static_cast<size_t>(h) * ld_bits + s]));
  }
}

// Entries [first[h], len[h]) of row h times factor (one f32 multiply, __fmul_rn: never fused).
__global__ void scale_kernel(float* rows, int ld, HeadTable first, HeadTable len, float factor) {
  const int h = blockIdx.y;
  float* row = rows + static_cast<size_t>(h) * ld;
  for (int s = first.v[h] + blockIdx.x * blockDim.x + threadIdx.x; s < len.v[h];
       s += gridDim.x * blockDim.x) {
    row[s] = __fmul_rn(row[s], factor);
  }
}

// Entries list[j], j < n, of a row move to j, in place, by the calling block: each chunk of
// blockDim entries is read before it is written, and a list never reads below its index, so
// earlier chunks' writes are never read. Every thread of the block calls it.
template <typename T>
__device__ void compact_row(T* row, const int32_t* list, int n) {
  for (int c0 = 0; c0 < n; c0 += blockDim.x) {
    const int j = c0 + threadIdx.x;
    T v{};
    if (j < n) v = row[list[j]];
    __syncthreads();
    if (j < n) row[j] = v;
    __syncthreads();
  }
}

// State rows keep_top compacts in its own launch (more go through compact_kernel).
constexpr int kMaxFusedStates = 2;
struct FusedState {
  void* rows = nullptr;  // [heads, ld] of the plan's layer
  int ld = 0;
  bool u64 = false;  // else f32
};

struct KeepParams {
  const float* scores;
  int score_ld;
  int32_t* lists;
  int ld;
  HeadTable len, prefix, k, score_head;  // prefix < 0: the head keeps everything
  HeadTable count;                       // kept entries of a deciding head (-1: untouched)
  FusedState states[kMaxFusedStates];
  int num_states;
};

// After a head's list is written: its state rows follow it (the block's own list: its global
// writes are visible to the block after the barrier).
__device__ void compact_states(const KeepParams& p, int h, const int32_t* list) {
  const int n = p.count.v[h];
  if (n < 0 || p.num_states == 0) return;
  __syncthreads();
  for (int i = 0; i < p.num_states; ++i) {
    const FusedState& s = p.states[i];
    if (s.u64) {
      compact_row(static_cast<unsigned long long*>(s.rows) + static_cast<size_t>(h) * s.ld, list,
                  n);
    } else {
      compact_row(static_cast<float*>(s.rows) + static_cast<size_t>(h) * s.ld, list, n);
    }
  }
}

// One block per cache head: the top k of [0, prefix) by (score key, index) in increasing order,
// then prefix..len-1; a head that keeps everything gets 0..len-1. Then the state rows of a
// deciding head follow its list (compact_states).
__global__ void __launch_bounds__(kThreads) keep_top_kernel(KeepParams p) {
  __shared__ detail::RadixShared radix;
  __shared__ detail::ScanShared scan;
  const int h = blockIdx.x;
  const int len = p.len.v[h], prefix = p.prefix.v[h], k = p.k.v[h];
  int32_t* out = p.lists + static_cast<size_t>(h) * p.ld;
  if (prefix < 0) {
    for (int i = threadIdx.x; i < len; i += blockDim.x) out[i] = i;
    return;
  }
  const float* row = p.scores + static_cast<size_t>(p.score_head.v[h]) * p.score_ld;
  if (k > 0 && k == prefix - 1) {
    // One victim (a decode step at the budget): the smallest rank key of [0, prefix), by one
    // block-wide min instead of the 8-pass radix select; the same set by the same total order
    // (rank keys are distinct: their low 32 bits are the index).
    __shared__ uint64_t warp_min[kThreads / 32];
    uint64_t least = ~uint64_t{0};
    for (int i = threadIdx.x; i < prefix; i += blockDim.x) {
      least = min(least, detail::rank_key(row[i], i));
    }
    for (int o = 16; o > 0; o /= 2) least = min(least, __shfl_xor_sync(0xffffffffu, least, o));
    if (threadIdx.x % 32 == 0) warp_min[threadIdx.x / 32] = least;
    __syncthreads();
    least = warp_min[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) least = min(least, warp_min[w]);
    const int victim = static_cast<int>(least & 0xffffffffu);
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
      if (i != victim) out[i - (i > victim ? 1 : 0)] = i;
    }
    compact_states(p, h, out);
    return;
  }
  int written = 0;
  if (k > 0) {
    const uint64_t threshold = detail::block_kth_largest(
        [&](int i, bool* ok) {
          *ok = true;
          return detail::rank_key(row[i], i);
        },
        prefix, k, radix);
    written = detail::block_ordered_compact(
        [&](int i) { return detail::rank_key(row[i], i) >= threshold; }, prefix, 0, out, scan);
  }
  for (int i = threadIdx.x; i < len - prefix; i += blockDim.x) out[written + i] = prefix + i;
  compact_states(p, h, out);
}

// Row h keeps entries lists[h][j], j < count[h] (count < 0: untouched), in place (compact_row).
template <typename T>
__global__ void compact_kernel(T* rows, int ld, const int32_t* lists, int lists_ld,
                               HeadTable count) {
  const int h = blockIdx.x, n = count.v[h];
  if (n < 0) return;
  compact_row(rows + static_cast<size_t>(h) * ld, lists + static_cast<size_t>(h) * lists_ld, n);
}

// One thread per (query head q, slot j < len[q]): the window sum in query order from 0.0f (mean:
// divided by w, IEEE division as the CPU's `/=`). Adds and a division only, so no FMA
// contraction can change a bit.
__global__ void window_sum_kernel(const float* probs, size_t stride, int stride_w, int w,
                                  bool mean, bool weighted, float* out, int ld, HeadTable len) {
  const int q = blockIdx.y, n = len.v[q];
  const float* base = probs + static_cast<size_t>(q) * stride_w * stride;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    if (weighted) {  // f64: the products are exact, so a fused multiply-add rounds alike
      double acc = 0.0;
      for (int a = 0; a < w; ++a) {
        acc += static_cast<double>(base[static_cast<size_t>(a) * stride + j]) *
               static_cast<double>(n + a);
      }
      out[static_cast<size_t>(q) * ld + j] = static_cast<float>(acc / static_cast<double>(w));
      continue;
    }
    float sum = 0.0f;
    for (int a = 0; a < w; ++a) sum += base[static_cast<size_t>(a) * stride + j];
    if (mean) sum /= static_cast<float>(w);
    out[static_cast<size_t>(q) * ld + j] = sum;
  }
}

// One thread per (out row h, entry s < len[h]): cpu::reduce_gqa's fold over the group's rows
// h*group .. h*group + group - 1 of `in` (max: `acc < v ? v : acc` as std::max; mean: the sum
// divided by the group).
__global__ void reduce_heads_kernel(const float* in, int in_ld, int group, bool max, float* out,
                                    int out_ld, HeadTable len) {
  const int h = blockIdx.y, n = len.v[h];
  const float* rows = in + static_cast<size_t>(h) * group * in_ld;
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n; s += gridDim.x * blockDim.x) {
    float acc = rows[s];
    for (int g = 1; g < group; ++g) {
      const float v = rows[static_cast<size_t>(g) * in_ld + s];
      acc = max ? (acc < v ? v : acc) : acc + v;
    }
    out[static_cast<size_t>(h) * out_ld + s] = max ? acc : acc / static_cast<float>(group);
  }
}

// Row h of `out` = pool1d of row h of `in` over its own n.v[h] entries (pool.cuh: the CPU's loop).
__global__ void pool_rows_kernel(const float* in, int in_ld, float* out, int out_ld, HeadTable n,
                                 int kernel, bool max) {
  const int h = blockIdx.y, len = n.v[h];
  const float* x = in + static_cast<size_t>(h) * in_ld;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len; j += gridDim.x * blockDim.x) {
    out[static_cast<size_t>(h) * out_ld + j] = detail::pool_at(x, len, j, kernel, max);
  }
}

// Ada-KV's ranking input: positions (heads, ld) of each head's first len.v[h] slots, gathered
// from the device cache's layer (slot j of head h at offsets[h] + j), and the lengths as a device
// array (from the kernel argument: no H2D copy).
__global__ void gather_ranks_kernel(const int32_t* positions, const int32_t* offsets, int32_t* out,
                                    int ld, int32_t* lengths, HeadTable len) {
  const int h = blockIdx.y, n = len.v[h];
  if (blockIdx.x == 0 && threadIdx.x == 0) lengths[h] = n;
  const int32_t* src = positions + offsets[h];
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    out[static_cast<size_t>(h) * ld + j] = src[j];
  }
}

// *buf holds at least `need` T (stream-ordered; contents not kept).
// An allocation that throws (out of memory, which a sweep survives) leaves an empty buffer of
// capacity 0, so that the next call allocates again instead of returning a null pointer.
template <typename T>
void grow(T** buf, size_t* cap, size_t need, cudaStream_t stream) {
  if (need <= *cap) return;
  const size_t want = std::max(need, *cap + *cap / 2);
  free_async(*buf, stream);  // capture-aware (graph.h): a captured step may grow it
  *buf = nullptr;
  *cap = 0;
  *buf = static_cast<T*>(malloc_async(want * sizeof(T), stream));
  *cap = want;
}

}  // namespace

CudaPolicyOps::~CudaPolicyOps() {
  // After the stream's work, as CudaRows.
  if (lists_) cudaFreeAsync(lists_, 0);
  if (ranks_) cudaFreeAsync(ranks_, 0);
  if (top_lists_) cudaFreeAsync(top_lists_, 0);
  if (log_table_) cudaFreeAsync(log_table_, 0);
  if (f64_) cudaFreeAsync(f64_, 0);
}

int32_t* CudaPolicyOps::plan_lists(size_t need) {
  grow(&lists_, &lists_cap_, need, stream_);
  return lists_;
}

std::unique_ptr<SlotRows> CudaPolicyOps::make_rows(SlotType type, int layers, int heads) {
  return std::make_unique<CudaRows>(type, layers, heads, stream_);
}

void CudaPolicyOps::require_own(const SlotRows& rows) const { (void)device(rows); }

namespace {
// resize's bookkeeping: row h < lengths.size() keeps [0, from[h]) and becomes to[h] long (its
// entries [from, to) are new), the others keep theirs (from = to = length); rows reserved for
// the longest. Returns the most new entries of a row.
int plan_resize(CudaRows& r, const SlotRows& rows, int layer, std::span<const int32_t> lengths,
                HeadTable* from, HeadTable* to) {
  check_rows(rows, layer);
  const int heads = static_cast<int>(lengths.size());
  KVB_CHECK(heads <= rows.heads()) << "cuda policy ops: " << heads << " lengths for "
                                   << rows.heads() << " heads";
  int longest = 0, grow = 0;
  for (int h = 0; h < rows.heads(); ++h) {
    const int32_t now = rows.length(layer, h);
    const int32_t want = h < heads ? lengths[h] : now;
    KVB_CHECK(want >= 0) << "cuda policy ops: length " << want;
    from->v[h] = std::min(now, want);
    to->v[h] = want;
    longest = std::max(longest, static_cast<int>(want));
    grow = std::max(grow, static_cast<int>(want - from->v[h]));
  }
  r.reserve(layer, longest);
  return grow;
}
}  // namespace

void CudaPolicyOps::resize(SlotRows& rows, int layer, std::span<const int32_t> lengths) {
  CudaRows& r = device(rows);
  const int heads = static_cast<int>(lengths.size());
  HeadTable from{}, to{};
  const int grow = plan_resize(r, rows, layer, lengths, &from, &to);
  if (grow > 0) {
    const dim3 grid(grid_for(grow, 256), heads);
    if (rows.type() == SlotType::kF32) {
      zero_kernel<<<grid, 256, 0, stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer),
                                             from, to);
    } else {
      zero_kernel<<<grid, 256, 0, stream_>>>(static_cast<unsigned long long*>(r.data(layer)),
                                             r.ld(layer), from, to);
    }
    KVB_CUDA_CHECK_LAUNCH();
    ++launches_;
  }
  for (int h = 0; h < heads; ++h) r.set_len(layer, h, lengths[h]);
}

void CudaPolicyOps::accumulate(SlotRows& rows, int layer, const float* src, size_t head_stride,
                               size_t row_stride, int group, cpu::GqaReduce how) {
  check_rows(rows, layer);
  HeadTable len{};
  for (int h = 0; h < rows.heads(); ++h) len.v[h] = rows.length(layer, h);
  launch_accumulate(rows, layer, len, len, src, head_stride, row_stride, group, how);
}

void CudaPolicyOps::resize_and_accumulate(SlotRows& rows, int layer,
                                          std::span<const int32_t> lengths, const float* src,
                                          size_t head_stride, size_t row_stride, int group,
                                          cpu::GqaReduce how) {
  CudaRows& r = device(rows);
  KVB_CHECK(rows.type() == SlotType::kF32)
      << "cuda policy ops: resize_and_accumulate needs f32 rows";
  HeadTable from{}, to{};
  plan_resize(r, rows, layer, lengths, &from, &to);
  launch_accumulate(rows, layer, to, from, src, head_stride, row_stride, group, how);
  for (int h = 0; h < static_cast<int>(lengths.size()); ++h) r.set_len(layer, h, lengths[h]);
}

void CudaPolicyOps::launch_accumulate(SlotRows& rows, int layer, const HeadTable& len,
                                      const HeadTable& fresh, const float* src,
                                      size_t head_stride, size_t row_stride, int group,
                                      cpu::GqaReduce how) {
  CudaRows& r = device(rows);
  KVB_CHECK(rows.type() == SlotType::kF32 && group >= 1 && src != nullptr)
      << "cuda policy ops: accumulate needs f32 rows, a group >= 1 and statistics";
  int longest = 0;
  for (int h = 0; h < rows.heads(); ++h) longest = std::max(longest, static_cast<int>(len.v[h]));
  if (longest == 0) return;
  accumulate_kernel<<<dim3(blocks_for(longest), rows.heads()), 256, 0, stream_>>>(
      static_cast<float*>(r.data(layer)), r.ld(layer), len, fresh, src, head_stride, row_stride,
      group, how == cpu::GqaReduce::kMax);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::history_bits(SlotRows& bits, const ops::LayerStats& st,
                                 const kernels::KvIndex& cache_index, int history,
                                 bool inv_position) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(bits);
  check_rows(bits, st.layer);
  auto* dev = dynamic_cast<DeviceKvCache*>(cache.device_rows());
  KVB_CHECK(dev != nullptr) << "cuda policy ops: history bits of a cache without device rows";
  int longest = 0;
  for (int h = 0; h < bits.heads(); ++h) longest = std::max(longest, cache.length(st.layer, h));
  r.reserve(st.layer, longest);
  HistoryBitsArgs a;
  a.bits = static_cast<uint64_t*>(r.data(st.layer));
  a.ld = r.ld(st.layer);
  a.kv = dev->layer(st.layer);
  a.last_probs = st.last_probs;
  a.stride = st.stride;
  a.last_w = st.last_w;
  a.n_new = st.n_new;
  a.num_heads = st.num_heads;
  a.history = history;
  a.inv_position = inv_position;
  scissorhands_update_bits(a, stream_);
  ++launches_;
  for (int h = 0; h < bits.heads(); ++h) r.set_len(st.layer, h, cache.length(st.layer, h));
}

void CudaPolicyOps::append_norms(SlotRows& rows, int layer, std::span<const int32_t> before,
                                 const float* vectors, int n, int src_heads, int dim,
                                 int expand) {
  CudaRows& r = device(rows);
  check_rows(rows, layer);
  const int heads = rows.heads();
  KVB_CHECK(rows.type() == SlotType::kF32 && static_cast<int>(before.size()) == heads &&
            n >= 0 && dim >= 1 && expand >= 1 && (n == 0 || vectors != nullptr) &&
            (heads - 1) / expand < src_heads)
      << "cuda policy ops: norms into " << before.size() << " rows of " << heads << ", " << n
      << " vectors of " << src_heads << " heads of " << dim << ", expand " << expand;
  HeadTable from{};
  int longest = 0;
  for (int h = 0; h < heads; ++h) {
    from.v[h] = before[h];
    KVB_CHECK(before[h] == 0 || rows.length(layer, h) == before[h])
        << "cuda policy ops: head " << h << " holds " << rows.length(layer, h)
        << " entries, not " << before[h];
    longest = std::max(longest, before[h] + n);
  }
  r.reserve(layer, longest);
  for (int h = 0; h < heads; ++h) r.set_len(layer, h, before[h] + n);
  if (n == 0) return;
  norms_kernel<<<dim3(grid_for(n, 128), heads), 128, 0, stream_>>>(
      static_cast<float*>(r.data(layer)), r.ld(layer), from, vectors, n, src_heads, expand, dim);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::scale(SlotRows& rows, int layer, std::span<const int32_t> first,
                          float factor) {
  CudaRows& r = device(rows);
  check_rows(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && static_cast<int>(first.size()) <= rows.heads())
      << "cuda policy ops: scale of " << first.size() << " heads of " << rows.heads()
      << " rows";
  HeadTable from{}, len{};
  int most = 0;
  for (int h = 0; h < static_cast<int>(first.size()); ++h) {
    len.v[h] = rows.length(layer, h);
    KVB_CHECK(first[h] >= 0 && first[h] <= len.v[h])
        << "cuda policy ops: scale from " << first[h] << " of a row of " << len.v[h];
    from.v[h] = first[h];
    most = std::max(most, static_cast<int>(len.v[h] - first[h]));
  }
  if (most == 0) return;
  scale_kernel<<<dim3(blocks_for(most), static_cast<unsigned>(first.size())), 256, 0, stream_>>>(
      static_cast<float*>(r.data(layer)), r.ld(layer), from, len, factor);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::window_sum(SlotRows& out, int out_layer, const ops::LayerStats& st,
                               std::span<const int32_t> lengths, ops::WindowReduce how,
                               int queries) {
  CudaRows& r = device(out);
  check_rows(out, out_layer);
  const int stride_w = st.last_w;
  const int w = queries > 0 ? queries : stride_w;
  KVB_CHECK(out.type() == SlotType::kF32 && st.last_probs != nullptr && stride_w >= 1 &&
            queries >= 0 && queries <= stride_w &&
            static_cast<int>(lengths.size()) == out.heads() && out.heads() == st.num_heads)
      << "cuda policy ops: window sums of " << out.heads() << " f32 rows, " << lengths.size()
      << " lengths, " << st.num_heads << " query heads, last_w " << w;
  HeadTable len{};
  int longest = 0;
  for (int q = 0; q < out.heads(); ++q) {
    KVB_CHECK(lengths[q] >= 0 && lengths[q] <= st.stride)
        << "cuda policy ops: query head " << q << " sums " << lengths[q]
        << " slots, stats stride " << st.stride;
    len.v[q] = lengths[q];
    longest = std::max(longest, static_cast<int>(lengths[q]));
  }
  r.reserve(out_layer, longest);
  for (int q = 0; q < out.heads(); ++q) r.set_len(out_layer, q, lengths[q]);
  if (longest == 0) return;
  window_sum_kernel<<<dim3(blocks_for(longest), out.heads()), 256, 0, stream_>>>(
      st.last_probs, static_cast<size_t>(st.stride), stride_w, w,
      how == ops::WindowReduce::kMean, how == ops::WindowReduce::kWeightedMean,
      static_cast<float*>(r.data(out_layer)), r.ld(out_layer), len);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::reduce_heads(const SlotRows& in, int in_layer, int group, cpu::GqaReduce how,
                                 SlotRows& out, int out_layer) {
  const CudaRows& src = device(in);
  CudaRows& dst = device(out);
  check_rows(in, in_layer);
  check_rows(out, out_layer);
  KVB_CHECK(&in != &out && group >= 1 && in.type() == SlotType::kF32 &&
            out.type() == SlotType::kF32 && in.heads() == out.heads() * group)
      << "cuda policy ops: reduce_heads of " << in.heads() << " rows into " << out.heads()
      << " by groups of " << group;
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < out.heads(); ++h) {
    len.v[h] = in.length(in_layer, h * group);
    for (int g = 1; g < group; ++g) {
      KVB_CHECK(in.length(in_layer, h * group + g) == len.v[h])
          << "cuda policy ops: reduce_heads: row " << h * group + g << " holds "
          << in.length(in_layer, h * group + g) << " entries, the group's first " << len.v[h];
    }
    longest = std::max(longest, static_cast<int>(len.v[h]));
  }
  dst.reserve(out_layer, longest);
  for (int h = 0; h < out.heads(); ++h) dst.set_len(out_layer, h, len.v[h]);
  if (longest == 0) return;
  reduce_heads_kernel<<<dim3(blocks_for(longest), out.heads()), 256, 0, stream_>>>(
      static_cast<const float*>(src.data(in_layer)), src.ld(in_layer), group,
      how == cpu::GqaReduce::kMax, static_cast<float*>(dst.data(out_layer)), dst.ld(out_layer),
      len);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::pool(const SlotRows& in, int in_layer, SlotRows& out, int out_layer,
                         int kernel, cpu::PoolKind kind) {
  const CudaRows& src = device(in);
  CudaRows& dst = device(out);
  check_rows(in, in_layer);
  check_rows(out, out_layer);
  KVB_CHECK(&in != &out && in.type() == SlotType::kF32 && out.type() == SlotType::kF32 &&
            in.heads() == out.heads())
      << "cuda policy ops: pool of " << in.heads() << " rows into " << out.heads();
  KVB_CHECK(kernel >= 1 && kernel % 2 == 1)
      << "cuda policy ops: pool kernel " << kernel << " must be odd and >= 1";
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < in.heads(); ++h) {
    len.v[h] = in.length(in_layer, h);
    longest = std::max(longest, static_cast<int>(len.v[h]));
  }
  dst.reserve(out_layer, longest);
  for (int h = 0; h < out.heads(); ++h) dst.set_len(out_layer, h, len.v[h]);
  if (longest == 0) return;
  pool_rows_kernel<<<dim3(blocks_for(longest), in.heads()), 256, 0, stream_>>>(
      static_cast<const float*>(src.data(in_layer)), src.ld(in_layer),
      static_cast<float*>(dst.data(out_layer)), dst.ld(out_layer), len, kernel,
      kind == cpu::PoolKind::kMax);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

std::vector<int32_t> CudaPolicyOps::count_top_across_heads(const SlotRows& scores, int score_layer,
                                                           const kernels::KvIndex& cache_index,
                                                           int layer, int64_t k) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  const CudaRows& sc = device(scores);
  check_rows(scores, score_layer);
  const int heads = scores.heads();
  KVB_CHECK(scores.type() == SlotType::kF32 && heads == cache.shape().num_kv_heads && k >= 0)
      << "cuda policy ops: the top " << k << " across " << heads << " f32 rows on a cache of "
      << cache.shape().num_kv_heads << " heads";
  auto* dev = dynamic_cast<DeviceKvCache*>(cache.device_rows());
  KVB_CHECK(dev != nullptr)
      << "cuda policy ops: the top across heads (ada budgets) of a cache without device rows";
  HeadTable len{};
  std::vector<int32_t> lengths(heads), counts(heads, 0);
  int longest = 0;
  int64_t total = 0;
  for (int h = 0; h < heads; ++h) {
    len.v[h] = lengths[h] = scores.length(score_layer, h);
    total += lengths[h];
    KVB_CHECK(lengths[h] <= cache.length(layer, h))
        << "cuda policy ops: head " << h << " scores " << lengths[h] << " slots of "
        << cache.length(layer, h);
    longest = std::max(longest, static_cast<int>(lengths[h]));
  }
  if (longest > 0) {
    const int ld = sc.ld(score_layer);  // >= longest
    // ranks_: positions (heads, ld), then lengths [heads], then counts [heads].
    const size_t at_lengths = static_cast<size_t>(heads) * ld, at_counts = at_lengths + heads;
    grow(&ranks_, &ranks_cap_, at_counts + heads, stream_);
    const DeviceLayerKvView view = dev->layer(layer);
    gather_ranks_kernel<<<dim3(blocks_for(longest), heads), 256, 0, stream_>>>(
        view.positions, view.offsets, ranks_, ld, ranks_ + at_lengths, len);
    KVB_CUDA_CHECK_LAUNCH();
    const RaggedScores ragged{static_cast<const float*>(sc.data(score_layer)), ranks_,
                              ranks_ + at_lengths, heads, ld};
    // Lengths are in [0, ld] by construction: no device check (it would cost a second sync).
    global_topk_counts_unchecked(ragged, static_cast<int>(std::min(k, total)), ranks_ + at_counts,
                                 stream_);
    launches_ += 2;
    require_not_capturing(stream_, "the top across heads' counts (Ada-KV's budgets) to the host");
    KVB_CUDA_CHECK(cudaMemcpyAsync(counts.data(), ranks_ + at_counts, heads * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream_));
    KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ++transfers_.d2h_copies;
    transfers_.d2h_bytes += heads * sizeof(int32_t);
    ++transfers_.stream_syncs;
  }
  return counts;
}

void CudaPolicyOps::popcount(const SlotRows& bits, int layer, SlotRows& out, int out_layer) {
  const CudaRows& b = device(bits);
  CudaRows& o = device(out);
  check_rows(bits, layer);
  check_rows(out, out_layer);
  KVB_CHECK(bits.type() == SlotType::kU64 && out.type() == SlotType::kF32 &&
            out.heads() == bits.heads())
      << "cuda policy ops: popcount of " << bits.heads() << " u64 rows into "
      << out.heads() << " f32 rows";
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < bits.heads(); ++h) {
    len.v[h] = bits.length(layer, h);
    longest = std::max(longest, static_cast<int>(len.v[h]));
  }
  o.reserve(out_layer, longest);
  for (int h = 0; h < bits.heads(); ++h) o.set_len(out_layer, h, len.v[h]);
  if (longest == 0) return;
  popcount_kernel<<<dim3(blocks_for(longest), bits.heads()), 256, 0, stream_>>>(
      static_cast<const uint64_t*>(b.data(layer)), b.ld(layer),
      static_cast<float*>(o.data(out_layer)), o.ld(out_layer), len);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::keep_top(const SlotRows& scores, int score_layer,
                             const kernels::KvIndex& cache_index, std::span<const KeepTop> heads,
                             std::span<SlotRows* const> state, EvictionPlan& plan) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  const CudaRows& sc = device(scores);
  check_rows(scores, score_layer);
  const int layer = plan.layer();
  const int nh = cache.shape().num_kv_heads;
  KVB_USAGE_CHECK(nh <= kMaxOpsHeads) << "--device cuda decides for at most " << kMaxOpsHeads
                                      << " cache heads per layer; the cache has " << nh;
  KVB_CHECK(plan.num_heads() == nh) << "keep_top: a plan for " << plan.num_heads()
                                    << " heads on a cache of " << nh;
  HeadTable len{}, prefix{}, k{}, score_head{}, count{};
  std::vector<int32_t> lengths(nh), counts(nh);
  int ld = 0;
  for (int h = 0; h < nh; ++h) {
    len.v[h] = lengths[h] = counts[h] = cache.length(layer, h);
    prefix.v[h] = -1;
    count.v[h] = -1;
    ld = std::max(ld, static_cast<int>(len.v[h]));
  }
  for (const KeepTop& t : heads) {
    KVB_CHECK(t.head >= 0 && t.head < nh && t.len == lengths[t.head] && t.score_head >= 0 &&
              t.score_head < scores.heads() && 0 <= t.k && t.k < t.prefix && t.prefix <= t.len &&
              t.prefix <= scores.length(score_layer, t.score_head) && prefix.v[t.head] < 0)
        << "keep_top: head " << t.head << " keeps " << t.k << " of [0, " << t.prefix << ") of "
        << t.len << " slots by a score row of " << scores.length(score_layer, t.score_head);
    prefix.v[t.head] = t.prefix;
    k.v[t.head] = t.k;
    score_head.v[t.head] = t.score_head;
    count.v[t.head] = counts[t.head] = t.kept();
  }
  if (heads.empty() || ld == 0) return;
  plan_lists(static_cast<size_t>(nh) * ld);
  KeepParams p;
  p.scores = static_cast<const float*>(sc.data(score_layer));
  p.score_ld = sc.ld(score_layer);
  p.lists = lists_;
  p.ld = ld;
  p.len = len;
  p.prefix = prefix;
  p.k = k;
  p.score_head = score_head;
  p.count = count;
  p.num_states = 0;
  for (SlotRows* rows : state) {
    check_rows(*rows, layer);
    KVB_CHECK(rows->heads() == nh) << "keep_top: state of " << rows->heads() << " heads, cache "
                                   << nh;
  }
  // The first kMaxFusedStates state rows are compacted by the keep kernel itself, block h after
  // head h's decision. A state that is the scores' own rows is safe there only when every
  // deciding head reads its own score row (no block reads a row another block compacts);
  // otherwise every state waits for its own launch, after all decisions.
  bool own_rows = true;
  for (const KeepTop& t : heads) own_rows &= t.score_head == t.head;
  bool alias = false;
  for (SlotRows* rows : state) alias |= rows == &scores && score_layer == layer;
  const size_t fused = alias && !own_rows ? 0 : std::min<size_t>(state.size(), kMaxFusedStates);
  for (size_t i = 0; i < fused; ++i) {
    CudaRows& r = device(*state[i]);
    p.states[i] = {r.data(layer), r.ld(layer), state[i]->type() == SlotType::kU64};
    ++p.num_states;
  }
  keep_top_kernel<<<nh, kThreads, 0, stream_>>>(p);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
  for (size_t i = 0; i < state.size(); ++i) {
    SlotRows* rows = state[i];
    CudaRows& r = device(*rows);
    if (i < fused) {
      for (const KeepTop& t : heads) r.set_len(layer, t.head, t.kept());
      continue;
    }
    if (rows->type() == SlotType::kF32) {
      compact_kernel<<<nh, 256, 0, stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer),
                                              lists_, ld, count);
    } else {
      compact_kernel<<<nh, 256, 0, stream_>>>(static_cast<unsigned long long*>(r.data(layer)),
                                              r.ld(layer), lists_, ld, count);
    }
    KVB_CUDA_CHECK_LAUNCH();
    ++launches_;
    for (const KeepTop& t : heads) r.set_len(layer, t.head, t.kept());
  }
  plan.keep_on_device(lists_, ld, std::move(counts), lengths);
}

namespace {
// Row h's entries lists[h][i], i < count[h], become value.
__global__ void fill_listed_kernel(float* rows, int ld, const int32_t* lists, int lists_ld,
                                   HeadTable count, float value) {
  const int h = blockIdx.x;
  const int32_t* list = lists + static_cast<size_t>(h) * lists_ld;
  float* row = rows + static_cast<size_t>(h) * ld;
  for (int i = threadIdx.x; i < count.v[h]; i += blockDim.x) row[list[i]] = value;
}
}  // namespace

void CudaPolicyOps::fill_top(SlotRows& rows, int layer, std::span<const int32_t> k, float value,
                             const SlotRows* by, int by_layer) {
  CudaRows& r = device(rows);
  check_rows(rows, layer);
  const CudaRows& b = by ? device(*by) : r;
  const int from = by ? by_layer : layer;
  check_rows(b, from);
  const int nh = static_cast<int>(k.size());
  KVB_CHECK(rows.type() == SlotType::kF32 && b.type() == SlotType::kF32 && nh <= rows.heads() &&
            nh <= b.heads())
      << "cuda policy ops: fill_top of " << nh << " heads of " << rows.heads() << " rows";
  HeadTable len{}, prefix{}, kk{}, score_head{}, count{};
  int ld = 0, most = 0;
  for (int h = 0; h < nh; ++h) {
    len.v[h] = rows.length(layer, h);
    KVB_CHECK(k[h] >= 0 && b.length(from, h) == len.v[h])
        << "cuda policy ops: fill_top: head " << h << " fills " << k[h] << " of " << len.v[h]
        << " entries by a row of " << b.length(from, h);
    ld = std::max(ld, static_cast<int>(len.v[h]));
    score_head.v[h] = h;
    count.v[h] = -1;  // the selection compacts nothing
    // keep_top's selection: the top k of [0, len), or every entry (prefix < 0) when k reaches it.
    prefix.v[h] = k[h] < len.v[h] ? len.v[h] : -1;
    kk.v[h] = std::min(k[h], static_cast<int>(len.v[h]));
    most = std::max(most, static_cast<int>(kk.v[h]));
  }
  for (int h = nh; h < kMaxOpsHeads; ++h) kk.v[h] = 0;
  if (ld == 0 || most == 0) return;
  grow(&top_lists_, &top_lists_cap_, static_cast<size_t>(nh) * ld, stream_);
  KeepParams p;
  p.scores = static_cast<const float*>(b.data(from));
  p.score_ld = b.ld(from);
  p.lists = top_lists_;
  p.ld = ld;
  p.len = len;
  p.prefix = prefix;
  p.k = kk;
  p.score_head = score_head;
  p.count = count;
  p.num_states = 0;
  // A head with k 0 selects nothing that is written (its list is filled, its count is 0).
  keep_top_kernel<<<nh, kThreads, 0, stream_>>>(p);
  KVB_CUDA_CHECK_LAUNCH();
  fill_listed_kernel<<<nh, 256, 0, stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer),
                                              top_lists_, ld, kk, value);
  KVB_CUDA_CHECK_LAUNCH();
  launches_ += 2;
}

namespace {
// Row (layer, head) of device rows of T, after the stream's work.
template <typename T>
std::vector<T> read_row(const SlotRows& rows, int layer, int head, SlotType type,
                        cudaStream_t stream, CudaPolicyOps::Transfers& transfers) {
  const CudaRows& r = device(rows);
  KVB_CHECK(rows.type() == type && layer >= 0 && layer < rows.layers() && head >= 0 &&
            head < rows.heads())
      << "cuda policy ops: reading row (" << layer << ", " << head << ") of the wrong type or "
      << "outside " << rows.layers() << " x " << rows.heads();
  std::vector<T> out(rows.length(layer, head));
  require_not_capturing(stream, "a policy state row to the host");
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream));
  ++transfers.stream_syncs;
  if (!out.empty()) {
    KVB_CUDA_CHECK(cudaMemcpy(out.data(),
                              static_cast<const T*>(r.data(layer)) +
                                  static_cast<size_t>(head) * r.ld(layer),
                              out.size() * sizeof(T), cudaMemcpyDeviceToHost));
    ++transfers.d2h_copies;
    transfers.d2h_bytes += out.size() * sizeof(T);
  }
  return out;
}
}  // namespace

std::vector<int32_t> CudaPolicyOps::read_keep_list(const EvictionPlan& plan, int head, int len) {
  std::vector<int32_t> out;
  if (plan.kind(head) != EvictionPlan::Kind::kDevice) {
    plan.keep_list(head, len, &out);
    return out;
  }
  const int count = plan.device_counts()[head];
  KVB_CHECK(count >= 0 && count <= len && count <= plan.device_ld())
      << "cuda policy ops: read_keep_list of head " << head << ": " << count << " slots kept of "
      << len << " (list stride " << plan.device_ld() << ")";
  out.resize(count);
  if (count == 0) return out;
  KVB_CUDA_CHECK(cudaMemcpyAsync(out.data(),
                                 plan.device_slots() + static_cast<size_t>(head) * plan.device_ld(),
                                 out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ++transfers_.d2h_copies;
  ++transfers_.stream_syncs;
  transfers_.d2h_bytes += out.size() * sizeof(int32_t);
  return out;
}

std::vector<float> CudaPolicyOps::read_f32(const SlotRows& rows, int layer, int head) {
  return read_row<float>(rows, layer, head, SlotType::kF32, stream_, transfers_);
}

std::vector<uint64_t> CudaPolicyOps::read_u64(const SlotRows& rows, int layer, int head) {
  return read_row<uint64_t>(rows, layer, head, SlotType::kU64, stream_, transfers_);
}

}  // namespace kvb::kernels::cuda
