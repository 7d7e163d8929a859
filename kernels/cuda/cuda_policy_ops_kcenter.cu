// CudaPolicyOps' subgen_kcenter ops (cuda_policy_ops.h; POLICIES.md `subgen_kcenter`): the
// one-shot k-center compression of a layer's heads on the cache's device rows, its keep lists
// and log cluster sizes written on the device, and erase (the slide's compaction of the bias
// rows). Nothing is copied to the host and nothing waits; the log table goes up when it grows.
// A layer's compression is three launches: the bf16 prefixes widened (all heads, one launch;
// none for f32 rows), the k-center of every listed head (cuda::kcenter_greedy_batch, one block
// a head, one launch up to kMaxKCenterBatch heads), and the lists' windows and bias rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kcenter.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

using ops_detail::CudaRows;
using ops::SlotType;

// The prefixes of a layer's listed heads widened to f32 (exact for bf16), back to back:
// kcenter_greedy_batch reads f32 rows, as the CPU reads the host rows the device's bf16 rows
// widen to. blockIdx.y is the head's entry in the tables; its rows are [src_row, src_row + rows)
// of the layer's keys ([slots, d]) and land at [dst_row, dst_row + rows) of dst ([sum rows, d]).
struct WidenParams {
  int d;
  HeadTable src_row, dst_row, rows;
};

template <typename T>
__global__ void widen_kernel(const T* src, float* dst, WidenParams p) {
  const int e = blockIdx.y;
  const size_t n = static_cast<size_t>(p.rows.v[e]) * p.d;
  const T* from = src + static_cast<size_t>(p.src_row.v[e]) * p.d;
  float* to = dst + static_cast<size_t>(p.dst_row.v[e]) * p.d;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    to[i] = kv_load(from + i);
  }
}

struct FinishParams {
  int32_t* lists;  // [heads, ld]: a listed head's centres are written already
  int ld;
  HeadTable len, prefix, centres;  // prefix < 0: the head keeps everything
  const int32_t* sizes;            // [heads, sizes_ld]: cluster sizes of the centres
  int sizes_ld;
  const float* log_table;  // [> every size]: the host's std::log(float(i))
  float* bias;  // [heads, bias_ld] or null
  int bias_ld;
};

// One block per cache head: after the m centres, the window prefix..len-1 (a head that keeps
// everything: 0..len-1); the bias row: log(size) for centre c (the host's table: the CPU's
// bits), 0 for the window.
__global__ void finish_kernel(FinishParams p) {
  const int h = blockIdx.x, len = p.len.v[h], prefix = p.prefix.v[h], m = p.centres.v[h];
  int32_t* list = p.lists + static_cast<size_t>(h) * p.ld;
  if (prefix < 0) {
    for (int i = threadIdx.x; i < len; i += blockDim.x) list[i] = i;
    return;
  }
  for (int i = threadIdx.x; i < len - prefix; i += blockDim.x) list[m + i] = prefix + i;
  if (p.bias == nullptr) return;
  float* row = p.bias + static_cast<size_t>(h) * p.bias_ld;
  const int32_t* sizes = p.sizes + static_cast<size_t>(h) * p.sizes_ld;
  for (int i = threadIdx.x; i < m + len - prefix; i += blockDim.x) {
    row[i] = i < m ? p.log_table[sizes[i]] : 0.0f;
  }
}

// Row h loses entries [first, first + count) (count 0: untouched), in place: each chunk reads
// entries past the gap before it writes below them, and a later chunk reads only entries past
// every earlier chunk's writes.
template <typename T>
__global__ void erase_kernel(T* rows, int ld, HeadTable first, HeadTable count, HeadTable len) {
  const int h = blockIdx.x, gap = count.v[h];
  if (gap == 0) return;
  T* row = rows + static_cast<size_t>(h) * ld;
  const int from = first.v[h], tail = len.v[h] - from - gap;
  for (int c0 = 0; c0 < tail; c0 += blockDim.x) {
    const int j = c0 + threadIdx.x;
    T v{};
    if (j < tail) v = row[from + gap + j];
    __syncthreads();
    if (j < tail) row[from + j] = v;
    __syncthreads();
  }
}

}  // namespace

const float* CudaPolicyOps::log_table(size_t need) {
  if (need <= log_cap_) return log_table_;
  const size_t cap = std::max(need, log_cap_ + log_cap_ / 2);
  log_host_.resize(cap);
  log_host_[0] = 0.0f;  // no cluster is empty
  for (size_t i = 1; i < cap; ++i) log_host_[i] = std::log(static_cast<float>(i));
  free_async(log_table_, stream_);  // capture-aware (graph.h)
  log_table_ = nullptr;
  log_cap_ = 0;  // until the allocation below succeeds (an out-of-memory leaves no null table)
  log_table_ = static_cast<float*>(malloc_async(cap * sizeof(float), stream_));
  upload_async(log_table_, log_host_.data(), cap * sizeof(float), stream_);
  log_cap_ = cap;
  ++transfers_.h2d_copies;
  transfers_.h2d_bytes += cap * sizeof(float);
  return log_table_;
}

void CudaPolicyOps::erase(ops::SlotRows& rows, int layer,
                          std::span<const ops::RowErase> heads) {
  CudaRows& r = ops_detail::device(rows);
  KVB_CHECK(layer >= 0 && layer < rows.layers() && rows.heads() <= kMaxOpsHeads)
      << "cuda policy ops: erase in layer " << layer << " of rows for " << rows.layers()
      << " layers x " << rows.heads() << " heads (at most " << kMaxOpsHeads << ")";
  HeadTable first{}, count{}, len{};
  bool any = false;
  for (const ops::RowErase& e : heads) {
    const int have = e.head >= 0 && e.head < rows.heads() ? rows.length(layer, e.head) : -1;
    KVB_CHECK(have >= 0 && e.first >= 0 && e.count >= 0 && e.first + e.count <= have &&
              count.v[e.head] == 0)
        << "cuda policy ops: erase of entries [" << e.first << ", " << e.first + e.count
        << ") of head " << e.head << " of " << rows.heads() << ", holding " << have
        << " (a head at most once)";
    first.v[e.head] = e.first;
    count.v[e.head] = e.count;
    len.v[e.head] = have;
    any |= e.count > 0;
  }
  if (!any) return;
  if (rows.type() == SlotType::kF32) {
    erase_kernel<<<rows.heads(), 256, 0, stream_>>>(static_cast<float*>(r.data(layer)),
                                                     r.ld(layer), first, count, len);
  } else {
    erase_kernel<<<rows.heads(), 256, 0, stream_>>>(
        static_cast<unsigned long long*>(r.data(layer)), r.ld(layer), first, count, len);
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
  for (const ops::RowErase& e : heads) r.set_len(layer, e.head, len.v[e.head] - e.count);
}

void CudaPolicyOps::kcenter_keep(const kernels::KvIndex& cache_index,
                                 std::span<const ops::KCenterKeep> heads, ops::SlotRows* log_sizes,
                                 EvictionPlan& plan) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  const int layer = plan.layer();
  const int nh = cache.shape().num_kv_heads;
  KVB_USAGE_CHECK(nh <= kMaxOpsHeads) << "--device cuda decides for at most " << kMaxOpsHeads
                                      << " cache heads per layer; the cache has " << nh;
  KVB_CHECK(plan.num_heads() == nh) << "kcenter_keep: a plan for " << plan.num_heads()
                                    << " heads on a cache of " << nh;
  CudaRows* bias = log_sizes ? &ops_detail::device(*log_sizes) : nullptr;
  KVB_CHECK(!bias || (bias->type() == SlotType::kF32 && layer < bias->layers() &&
                      bias->heads() == nh))
      << "kcenter_keep: log sizes of " << bias->layers() << " x " << bias->heads()
      << " f32 rows for layer " << layer << " of a cache of " << nh << " heads";
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "kcenter_keep");
  HeadTable len{}, prefix{}, centres{};
  std::vector<int32_t> lengths(nh), counts(nh);
  int ld = 0, widest = 0, longest_prefix = 0;
  for (int h = 0; h < nh; ++h) {
    len.v[h] = lengths[h] = counts[h] = cache.length(layer, h);
    prefix.v[h] = -1;
    ld = std::max(ld, lengths[h]);
  }
  for (const ops::KCenterKeep& t : heads) {
    const int have = t.head >= 0 && t.head < nh ? lengths[t.head] : -1;
    KVB_CHECK(have >= 0 && 0 <= t.prefix && t.prefix <= have && t.k >= 0 &&
              prefix.v[t.head] < 0)
        << "kcenter_keep: head " << t.head << " of " << nh << " keeps " << t.k
        << " centres of [0, " << t.prefix << ") of " << have << " slots (a head at most once)";
    prefix.v[t.head] = t.prefix;
    centres.v[t.head] = std::min(t.k, t.prefix);
    counts[t.head] = centres.v[t.head] + have - t.prefix;
    widest = std::max(widest, static_cast<int>(centres.v[t.head]));
    longest_prefix = std::max(longest_prefix, t.prefix);
  }
  if (heads.empty() || ld == 0) return;
  int32_t* lists = plan_lists(static_cast<size_t>(nh) * ld);
  const int sizes_ld = std::max(widest, 1);
  StreamScratch sizes(static_cast<size_t>(nh) * sizes_ld * sizeof(int32_t), stream_);
  const DeviceLayerKvView v = dev.layer(layer);
  const int d = cache.shape().head_dim;
  const bool widen = v.dtype != KvDtype::kF32;
  // The heads that choose a centre, in the order of `heads`; bf16 rows: their prefixes widened
  // back to back into one scratch by one launch (entry e of the widen tables).
  std::vector<const ops::KCenterKeep*> run;
  WidenParams w{};
  w.d = d;
  size_t wide_rows = 0;
  for (const ops::KCenterKeep& t : heads) {
    if (centres.v[t.head] == 0) continue;
    const int e = static_cast<int>(run.size());
    run.push_back(&t);
    w.src_row.v[e] = dev.offset(layer, t.head);
    w.dst_row.v[e] = static_cast<int32_t>(wide_rows);
    w.rows.v[e] = t.prefix;
    wide_rows += static_cast<size_t>(t.prefix);
  }
  if (!run.empty()) {
    StreamScratch wide(widen ? wide_rows * d * sizeof(float) : 0, stream_);
    if (widen) {
      const dim3 grid(grid_for(static_cast<size_t>(longest_prefix) * d, 256),
                      static_cast<unsigned>(run.size()));
      widen_kernel<<<grid, 256, 0, stream_>>>(static_cast<const __nv_bfloat16*>(v.keys),
                                              wide.as<float>(), w);
      KVB_CUDA_CHECK_LAUNCH();
      ++launches_;
    }
    std::vector<KCenterProblem> problems(run.size());
    for (size_t e = 0; e < run.size(); ++e) {
      const ops::KCenterKeep& t = *run[e];
      KCenterProblem& q = problems[e];
      q.args.keys = widen ? wide.as<float>() + static_cast<size_t>(w.dst_row.v[e]) * d
                          : static_cast<const float*>(v.keys) +
                                static_cast<size_t>(w.src_row.v[e]) * d;
      q.args.n = t.prefix;
      q.args.dim = d;
      q.args.ld = d;
      q.args.k = t.k;
      q.centres = lists + static_cast<size_t>(t.head) * ld;
      q.cluster_sizes = sizes.as<int32_t>() + static_cast<size_t>(t.head) * sizes_ld;
    }
    // Stream order keeps the widened keys alive for the k-center (the scratch is freed after
    // it, on the same stream).
    launches_ += kcenter_greedy_batch(problems, stream_);
  }
  FinishParams p;
  p.lists = lists;
  p.ld = ld;
  p.len = len;
  p.prefix = prefix;
  p.centres = centres;
  p.sizes = sizes.as<int32_t>();
  p.sizes_ld = sizes_ld;
  p.log_table = nullptr;
  p.bias = nullptr;
  p.bias_ld = 0;
  if (bias) {
    // A cluster holds at most its prefix's points.
    p.log_table = log_table(static_cast<size_t>(longest_prefix) + 1);
    int need = 0;
    for (const ops::KCenterKeep& t : heads) need = std::max(need, counts[t.head]);
    bias->reserve(layer, need);
    p.bias = static_cast<float*>(bias->data(layer));
    p.bias_ld = bias->ld(layer);
  }
  finish_kernel<<<nh, 256, 0, stream_>>>(p);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
  if (bias) {
    for (const ops::KCenterKeep& t : heads) bias->set_len(layer, t.head, counts[t.head]);
  }
  plan.keep_on_device(lists, ld, std::move(counts), lengths);
}

}  // namespace kvb::kernels::cuda
