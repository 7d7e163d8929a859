// SubGen's device sketches: storage, the bitwise absorb, the batched query (subgen_sketch.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/subgen_query.cuh"
#include "kernels/cuda/subgen_sketch.h"

namespace kvb::kernels::cuda {
namespace {

constexpr int kAbsorbThreads = 256;
// Scratch of one batched query launch (logits and weights of every block in it).
constexpr size_t kQueryScratchBytes = size_t{256} << 20;

size_t align8(size_t b) { return (b + 7) / 8 * 8; }

// ---- absorb ------------------------------------------------------------------------------

struct AbsorbTable {
  SubgenAbsorbHead v[kMaxSubgenAbsorbHeads];
};

// cpu::squared_distance (kernels/cpu/subgen_estimator.cc): d = double(a) - double(b) per
// coordinate in order, s += d * d fused or not as the host build fuses it.
__device__ double squared_distance(const float* a, const float* b, int dim, bool fused) {
  double s = 0;
  for (int i = 0; i < dim; ++i) {
    const double d = __dsub_rn(static_cast<double>(a[i]), static_cast<double>(b[i]));
    s = fused ? fma(d, d, s) : __dadd_rn(s, __dmul_rn(d, d));
  }
  return s;
}

// One block per listed head: its slots in order, the CPU's decisions (cpu::subgen_absorb).
// Thread 0 makes the sequential choices (|v|^2, mu, the nearest representative from the
// threads' partial minima, counts); the threads draw the coins and copy the rows.
template <typename T>
__global__ void __launch_bounds__(kAbsorbThreads)
    absorb_kernel(AbsorbTable table, SubgenLayerSketches sk, const T* keys, const T* values,
                  const int32_t* positions, const int32_t* offsets, int d, int s, int t,
                  int max_clusters, uint64_t seed, uint32_t layer, bool fused) {
  const SubgenAbsorbHead e = table.v[blockIdx.x];
  const int h = e.head, tid = threadIdx.x;
  float* m_keys = sk.m_keys + static_cast<size_t>(h) * s * d;
  float* m_values = sk.m_values + static_cast<size_t>(h) * s * d;
  float* reps = sk.reps + static_cast<size_t>(h) * max_clusters * d;
  float* samples = sk.samples + static_cast<size_t>(h) * max_clusters * t * d;
  int64_t* counts = sk.counts + static_cast<size_t>(h) * max_clusters;
  extern __shared__ float kv_row[];  // key [d], value [d]
  float* key = kv_row;
  float* value = kv_row + d;
  __shared__ double best_d[kAbsorbThreads];
  __shared__ int best_i[kAbsorbThreads];
  __shared__ double mu, prob, join;
  __shared__ int clusters, target, fresh_cluster;
  __shared__ int64_t absorbed, forced;
  if (tid == 0) {
    if (e.fresh) {
      mu = 0;
      clusters = 0;
      absorbed = 0;
      forced = 0;
    } else {
      mu = sk.mu[h];
      clusters = sk.clusters[h];
      absorbed = sk.absorbed[h];
      forced = sk.forced[h];
    }
  }
  if (e.fresh) {
    // The CPU starts a sketch with M zeroed; a draw that takes no slot (p NaN from infinite
    // values) leaves those zeros, so a reused sketch must not keep an earlier sequence's rows.
    for (size_t i = tid; i < static_cast<size_t>(s) * d; i += kAbsorbThreads) {
      m_keys[i] = 0.0f;
      m_values[i] = 0.0f;
    }
  }
  const int off = offsets[h];
  for (int slot = e.first; slot < e.end; ++slot) {
    const size_t row = (static_cast<size_t>(off) + slot) * d;
    for (int x = tid; x < d; x += kAbsorbThreads) {
      key[x] = kv_load(keys + row + x);
      value[x] = kv_load(values + row + x);
    }
    __syncthreads();
    const uint64_t step = static_cast<uint64_t>(positions[off + slot]);
    if (tid == 0) {
      // UpdateMatrixProduct's probability and mu (value_sqnorm: products exact in double).
      double sq = 0;
      for (int x = 0; x < d; ++x) {
        sq = __dadd_rn(sq, __dmul_rn(static_cast<double>(value[x]), static_cast<double>(value[x])));
      }
      const double mu_new = __dadd_rn(mu, sq);
      prob = mu_new > 0 ? __ddiv_rn(sq, mu_new) : 1.0;
      mu = mu_new;
    }
    // Nearest representative: each thread's first minimum over its strided clusters, NaN
    // distances skipped (the CPU's scan keeps index 0 when its distance is NaN, and otherwise
    // never takes a NaN: handled at the combine).
    const int live = clusters;
    double bd = 0;
    int bi = -1;
    bool nan0 = false;
    for (int c = tid; c < live; c += kAbsorbThreads) {
      const double dist = squared_distance(reps + static_cast<size_t>(c) * d, key, d, fused);
      if (c == 0) nan0 = isnan(dist);
      if (!isnan(dist) && (bi < 0 || dist < bd)) {
        bd = dist;
        bi = c;
      }
    }
    best_d[tid] = nan0 ? NAN : bd;
    best_i[tid] = nan0 ? -2 : bi;  // -2: cluster 0 is at NaN distance, it wins
    __syncthreads();
    if (tid == 0) {
      int near = -1;
      double near_d = 0;
      if (best_i[0] == -2) {
        near = 0;
        near_d = NAN;
      } else {
        for (int p = 0; p < kAbsorbThreads; ++p) {
          const int i = best_i[p];
          if (i < 0) continue;
          if (near < 0 || best_d[p] < near_d || (best_d[p] == near_d && i < near)) {
            near = i;
            near_d = best_d[p];
          }
        }
      }
      const bool within = near >= 0 && near_d <= e.delta2;
      if (within || (near >= 0 && clusters >= max_clusters)) {
        if (!within) ++forced;
        const int64_t n = ++counts[near];
        join = __ddiv_rn(1.0, static_cast<double>(n));
        target = near;
        fresh_cluster = 0;
      } else {
        target = clusters;
        counts[clusters] = 1;
        ++clusters;
        fresh_cluster = 1;
      }
      ++absorbed;
    }
    __syncthreads();
    // M: slot j takes (k, v) on its own coin.
    for (int j = tid; j < s; j += kAbsorbThreads) {
      if (cpu::counter_uniform(seed, layer, e.counter_head, step, static_cast<uint64_t>(j)) <
          prob) {
        float* mk = m_keys + static_cast<size_t>(j) * d;
        float* mv = m_values + static_cast<size_t>(j) * d;
        for (int x = 0; x < d; ++x) {
          mk[x] = key[x];
          mv[x] = value[x];
        }
      }
    }
    float* cluster_samples = samples + static_cast<size_t>(target) * t * d;
    if (fresh_cluster) {
      // A new cluster: representative k, t copies of k.
      float* rep = reps + static_cast<size_t>(target) * d;
      for (int x = tid; x < d; x += kAbsorbThreads) rep[x] = key[x];
      for (int i = tid; i < t * d; i += kAbsorbThreads) cluster_samples[i] = key[i % d];
    } else {
      for (int j = tid; j < t; j += kAbsorbThreads) {
        if (cpu::counter_uniform(seed, layer, e.counter_head, step, cpu::kClusterSlot + j) < join) {
          float* dst = cluster_samples + static_cast<size_t>(j) * d;
          for (int x = 0; x < d; ++x) dst[x] = key[x];
        }
      }
    }
    __syncthreads();  // the row buffers and the shared decisions are the next slot's
  }
  if (tid == 0) {
    sk.mu[h] = mu;
    sk.clusters[h] = clusters;
    sk.absorbed[h] = absorbed;
    sk.forced[h] = forced;
  }
}

// ---- batched query -----------------------------------------------------------------------

struct QueryTable {
  int32_t lengths[kMaxSubgenQueryKvHeads];
  uint8_t compressed[kMaxSubgenQueryKvHeads];
};

// The launch's sizes and device pointers (the host-side spans of SubgenQueryHeadsArgs stay out).
struct QueryLaunch {
  const float* q;
  float* out;
  int n, num_heads, kv_heads, head_dim;
  float scale;
  int s, t, max_clusters;
  SubgenLayerSketches sketches;
  const int32_t* offsets;
  const float* bias;  // [kv_heads, bias_ld], nullable
  int bias_ld;
};

template <typename T>
__global__ void __launch_bounds__(subgen_detail::kQueryThreads)
    query_heads_kernel(QueryLaunch a, QueryTable table, const T* keys, const T* values, int row0,
                       float* logit, double* weight, size_t per_block) {
  const int h = blockIdx.x % a.num_heads, i = row0 + blockIdx.x / a.num_heads;
  const int kvh = h / (a.num_heads / a.kv_heads), d = a.head_dim;
  const size_t at = (static_cast<size_t>(i) * a.num_heads + h) * d;
  subgen_detail::QueryIn in;
  in.q = a.q + at;
  in.out = a.out + at;
  in.d = d;
  in.scale = a.scale;
  const SubgenLayerSketches& sk = a.sketches;
  // A compressed head holds >= 1 token; the check keeps an empty sketch out all the same
  // (cpu::subgen_view's rule).
  if (table.compressed[kvh] && sk.absorbed[kvh] > 0) {
    in.m_keys = sk.m_keys + static_cast<size_t>(kvh) * a.s * d;
    in.m_values = sk.m_values + static_cast<size_t>(kvh) * a.s * d;
    in.s = a.s;
    in.mu = sk.mu[kvh];
    in.samples = sk.samples + static_cast<size_t>(kvh) * a.max_clusters * a.t * d;
    in.counts = sk.counts + static_cast<size_t>(kvh) * a.max_clusters;
    in.clusters = sk.clusters[kvh];
    in.t = a.t;
  }
  in.n_exact = table.lengths[kvh] - a.n + i + 1;
  if (a.bias) in.exact_bias = a.bias + static_cast<size_t>(kvh) * a.bias_ld;
  const size_t first = static_cast<size_t>(a.offsets[kvh]) * d;
  const size_t b = blockIdx.x;
  subgen_detail::query_block(in, keys + first, values + first, logit + b * per_block,
                             weight + b * per_block);
}

}  // namespace

// ---- storage -------------------------------------------------------------------------------

DeviceSubgenSketches::DeviceSubgenSketches(const cpu::SubgenParams& p, int layers, int heads,
                                           cudaStream_t stream)
    : p_(p), heads_(heads), stream_(stream), bufs_(std::max(layers, 0), nullptr) {
  KVB_CHECK(p.head_dim > 0 && p.s >= 1 && p.t >= 1 && p.max_clusters >= 1 && layers >= 0 &&
            heads >= 1)
      << "DeviceSubgenSketches: head_dim " << p.head_dim << ", s " << p.s << ", t " << p.t
      << ", max_clusters " << p.max_clusters << ", " << layers << " layers, " << heads << " heads";
}

DeviceSubgenSketches::DeviceSubgenSketches(const DeviceSubgenSketches& o)
    : p_(o.p_), heads_(o.heads_), stream_(o.stream_), bufs_(o.bufs_.size(), nullptr) {
  const size_t bytes = layer_bytes();
  for (size_t l = 0; l < bufs_.size(); ++l) {
    if (!o.bufs_[l]) continue;
    KVB_CUDA_CHECK(cudaMallocAsync(&bufs_[l], bytes, stream_));
    KVB_CUDA_CHECK(cudaMemcpyAsync(bufs_[l], o.bufs_[l], bytes, cudaMemcpyDeviceToDevice, stream_));
  }
}

DeviceSubgenSketches::~DeviceSubgenSketches() {
  for (void* b : bufs_) {
    if (b) cudaFreeAsync(b, 0);  // teardown errors cannot be reported
  }
}

size_t DeviceSubgenSketches::layer_bytes() const {
  const size_t H = heads_, d = p_.head_dim, C = p_.max_clusters;
  return align8(H * sizeof(double)) + 2 * H * sizeof(int64_t) + H * C * sizeof(int64_t) +
         align8(H * (2 * static_cast<size_t>(p_.s) * d + C * d + C * p_.t * d) * sizeof(float)) +
         H * sizeof(int32_t);
}

SubgenLayerSketches DeviceSubgenSketches::carve(void* base) const {
  const size_t H = heads_, d = p_.head_dim, C = p_.max_clusters, s = p_.s, t = p_.t;
  auto* b = static_cast<unsigned char*>(base);
  SubgenLayerSketches v;
  v.mu = reinterpret_cast<double*>(b);
  b += align8(H * sizeof(double));
  v.absorbed = reinterpret_cast<int64_t*>(b);
  v.forced = v.absorbed + H;
  v.counts = v.forced + H;
  b += (2 * H + H * C) * sizeof(int64_t);
  v.m_keys = reinterpret_cast<float*>(b);
  v.m_values = v.m_keys + H * s * d;
  v.reps = v.m_values + H * s * d;
  v.samples = v.reps + H * C * d;
  b += align8(H * (2 * s * d + C * d + C * t * d) * sizeof(float));
  v.clusters = reinterpret_cast<int32_t*>(b);
  return v;
}

bool DeviceSubgenSketches::allocated(int layer) const {
  KVB_CHECK(layer >= 0 && layer < layers())
      << "DeviceSubgenSketches: layer " << layer << " of " << layers();
  return bufs_[layer] != nullptr;
}

SubgenLayerSketches DeviceSubgenSketches::layer(int layer) {
  if (!allocated(layer)) {
    const size_t bytes = layer_bytes();
    KVB_CUDA_CHECK(cudaMallocAsync(&bufs_[layer], bytes, stream_));
    KVB_CUDA_CHECK(cudaMemsetAsync(bufs_[layer], 0, bytes, stream_));
  }
  return carve(bufs_[layer]);
}

cpu::SubgenSketch DeviceSubgenSketches::download(int layer, int head) const {
  KVB_CHECK(head >= 0 && head < heads_)
      << "DeviceSubgenSketches: head " << head << " of " << heads_;
  cpu::SubgenSketch out;
  if (!allocated(layer)) return out;
  // cudaMemcpy runs on the legacy default stream, which waits for the engine's (blocking)
  // stream, and returns once the bytes are here: no handle to a stream that may be gone.
  const SubgenLayerSketches v = carve(bufs_[layer]);
  const size_t d = p_.head_dim, C = p_.max_clusters, s = p_.s, t = p_.t;
  int32_t clusters = 0;
  auto get = [](void* dst, const void* src, size_t bytes) {
    if (bytes > 0) KVB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  };
  get(&out.mu, v.mu + head, sizeof(double));
  get(&out.absorbed, v.absorbed + head, sizeof(int64_t));
  get(&out.forced, v.forced + head, sizeof(int64_t));
  get(&clusters, v.clusters + head, sizeof(int32_t));
  if (out.absorbed == 0) return cpu::SubgenSketch{};
  out.m_keys.resize(s * d);
  out.m_values.resize(s * d);
  out.reps.resize(clusters * d);
  out.samples.resize(clusters * t * d);
  out.counts.resize(clusters);
  get(out.m_keys.data(), v.m_keys + head * s * d, s * d * sizeof(float));
  get(out.m_values.data(), v.m_values + head * s * d, s * d * sizeof(float));
  get(out.reps.data(), v.reps + head * C * d, clusters * d * sizeof(float));
  get(out.samples.data(), v.samples + head * C * t * d, clusters * t * d * sizeof(float));
  get(out.counts.data(), v.counts + head * C, clusters * sizeof(int64_t));
  return out;
}

size_t DeviceSubgenSketches::sketch_bytes() const {
  size_t total = 0;
  std::vector<int32_t> clusters(heads_);
  std::vector<int64_t> absorbed(heads_);
  const size_t d = p_.head_dim;
  for (int l = 0; l < layers(); ++l) {
    if (!bufs_[l]) continue;
    // Synchronous copies on the legacy default stream (download's reasoning).
    const SubgenLayerSketches v = carve(bufs_[l]);
    KVB_CUDA_CHECK(
        cudaMemcpy(clusters.data(), v.clusters, heads_ * sizeof(int32_t), cudaMemcpyDeviceToHost));
    KVB_CUDA_CHECK(
        cudaMemcpy(absorbed.data(), v.absorbed, heads_ * sizeof(int64_t), cudaMemcpyDeviceToHost));
    for (int h = 0; h < heads_; ++h) {
      if (absorbed[h] == 0) continue;
      const size_t c = clusters[h];
      total += (2 * static_cast<size_t>(p_.s) * d + c * d + c * p_.t * d) * sizeof(float) +
               c * sizeof(int64_t) + sizeof(double) + sizeof(int64_t);
    }
  }
  return total;
}

// ---- launches ------------------------------------------------------------------------------

void subgen_absorb(const cpu::SubgenParams& p, const SubgenLayerSketches& sk,
                   const DeviceLayerKvView& kv, std::span<const SubgenAbsorbHead> heads,
                   uint64_t seed, uint32_t layer, bool fused_distance, cudaStream_t stream) {
  KVB_CHECK(p.head_dim > 0 && p.head_dim == kv.head_dim && p.s >= 1 && p.t >= 1 &&
            p.max_clusters >= 1)
      << "cuda::subgen_absorb: head_dim " << p.head_dim << " (cache " << kv.head_dim << "), s "
      << p.s << ", t " << p.t << ", max_clusters " << p.max_clusters;
  KVB_CHECK(heads.empty() || (sk.m_keys != nullptr && kv.keys != nullptr))
      << "cuda::subgen_absorb: unallocated sketches or cache rows";
  for (size_t i = 0; i < heads.size(); ++i) {
    const SubgenAbsorbHead& e = heads[i];
    KVB_CHECK(e.head >= 0 && e.head < kv.num_kv_heads && e.first >= 0 && e.first <= e.end &&
              e.end <= kv.host_lengths[e.head])
        << "cuda::subgen_absorb: head " << e.head << " slots [" << e.first << ", " << e.end
        << ") of a cache of " << kv.num_kv_heads << " heads"
        << (e.head >= 0 && e.head < kv.num_kv_heads
                ? " holding " + std::to_string(kv.host_lengths[e.head]) + " slots"
                : std::string());
    for (size_t j = 0; j < i; ++j) {
      KVB_CHECK(heads[j].head != e.head) << "cuda::subgen_absorb: head " << e.head << " twice";
    }
  }
  const size_t shared = 2 * static_cast<size_t>(p.head_dim) * sizeof(float);
  for (size_t at = 0; at < heads.size(); at += kMaxSubgenAbsorbHeads) {
    AbsorbTable table{};
    const int count = static_cast<int>(std::min<size_t>(kMaxSubgenAbsorbHeads, heads.size() - at));
    for (int i = 0; i < count; ++i) table.v[i] = heads[at + i];
    if (kv.dtype == KvDtype::kF32) {
      absorb_kernel<float><<<count, kAbsorbThreads, shared, stream>>>(
          table, sk, static_cast<const float*>(kv.keys), static_cast<const float*>(kv.values),
          kv.positions, kv.offsets, p.head_dim, p.s, p.t, p.max_clusters, seed, layer,
          fused_distance);
    } else {
      absorb_kernel<__nv_bfloat16><<<count, kAbsorbThreads, shared, stream>>>(
          table, sk, static_cast<const __nv_bfloat16*>(kv.keys),
          static_cast<const __nv_bfloat16*>(kv.values), kv.positions, kv.offsets, p.head_dim, p.s,
          p.t, p.max_clusters, seed, layer, fused_distance);
    }
    KVB_CUDA_CHECK_LAUNCH();
  }
}

void subgen_query_heads(const SubgenQueryHeadsArgs& a, cudaStream_t stream) {
  const int ckv = a.kv.num_kv_heads;
  KVB_CHECK(a.n > 0 && a.head_dim > 0 && a.head_dim == a.kv.head_dim && ckv >= 1 &&
            ckv <= kMaxSubgenQueryKvHeads && a.num_heads % ckv == 0)
      << "cuda::subgen_query_heads: " << a.n << " rows of " << a.num_heads << " heads x "
      << a.head_dim << " over " << ckv << " KV heads of head_dim " << a.kv.head_dim << " (at most "
      << kMaxSubgenQueryKvHeads << ")";
  KVB_CHECK(a.compressed.size() == static_cast<size_t>(ckv) &&
            a.lengths.size() == static_cast<size_t>(ckv))
      << "cuda::subgen_query_heads: " << a.compressed.size() << " compressed flags and "
      << a.lengths.size() << " lengths for " << ckv << " KV heads";
  bool any_compressed = false;
  for (uint8_t c : a.compressed) any_compressed |= c != 0;
  KVB_CHECK(any_compressed ? a.s >= 1 && a.t >= 1 && a.max_clusters >= 1
                           : a.s >= 0 && a.t >= 0 && a.max_clusters >= 0)
      << "cuda::subgen_query_heads: s " << a.s << ", t " << a.t << ", max_clusters "
      << a.max_clusters << (any_compressed ? " with a compressed head" : "");
  QueryTable table{};
  int longest = 0;
  for (int h = 0; h < ckv; ++h) {
    KVB_CHECK(a.lengths[h] >= a.n)
        << "cuda::subgen_query_heads: KV head " << h << " holds " << a.lengths[h]
        << " slots, fewer than the " << a.n << " queries appended to it";
    KVB_CHECK(!a.compressed[h] || a.sketches.m_keys != nullptr)
        << "cuda::subgen_query_heads: KV head " << h << " compressed without sketches";
    table.lengths[h] = a.lengths[h];
    table.compressed[h] = a.compressed[h] ? 1 : 0;
    longest = std::max(longest, a.lengths[h]);
  }
  KVB_CHECK(a.exact_bias == nullptr || a.bias_ld >= longest)
      << "cuda::subgen_query_heads: bias rows of " << a.bias_ld << " entries for a head of "
      << longest << " slots";
  const size_t per_block =
      static_cast<size_t>(a.s) + static_cast<size_t>(a.max_clusters) * a.t + longest;
  const size_t block_bytes = per_block * (sizeof(double) + sizeof(float));
  const int rows_per_launch = static_cast<int>(std::clamp<size_t>(
      kQueryScratchBytes / (block_bytes * a.num_heads), 1, static_cast<size_t>(a.n)));
  StreamScratch scratch(block_bytes * a.num_heads * rows_per_launch, stream);
  double* weight = scratch.as<double>();
  float* logit = reinterpret_cast<float*>(weight + per_block * a.num_heads * rows_per_launch);
  const QueryLaunch launch{a.q,       a.out,       a.n,          a.num_heads, ckv,
                           a.head_dim, a.scale,     a.s,          a.t,         a.max_clusters,
                           a.sketches, a.kv.offsets, a.exact_bias, a.bias_ld};
  for (int row0 = 0; row0 < a.n; row0 += rows_per_launch) {
    const int rows = std::min(rows_per_launch, a.n - row0);
    const int blocks = rows * a.num_heads;
    if (a.kv.dtype == KvDtype::kF32) {
      query_heads_kernel<float><<<blocks, subgen_detail::kQueryThreads, 0, stream>>>(
          launch, table, static_cast<const float*>(a.kv.keys),
          static_cast<const float*>(a.kv.values), row0, logit, weight, per_block);
    } else {
      query_heads_kernel<__nv_bfloat16><<<blocks, subgen_detail::kQueryThreads, 0, stream>>>(
          launch, table, static_cast<const __nv_bfloat16*>(a.kv.keys),
          static_cast<const __nv_bfloat16*>(a.kv.values), row0, logit, weight, per_block);
    }
    KVB_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kvb::kernels::cuda
