// CudaPolicyOps' scorer ops (cuda_policy_ops.h; the vocabulary of kvpress's scorers,
// POLICIES.md "kvpress's presses"): divide_by_query_counts (ObservedAttentionPress's
// normalisation) and cosine_to_mean (KeyDiffPress's anchor) on the cache's device rows. Every
// product-sum is an explicit f64 fused multiply-add in the CPU instance's order and every other
// step one IEEE operation, so the entries are the CPU's bits. Nothing is copied to the host and
// nothing waits.
#include <algorithm>

#include "common/error.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

using ops_detail::CudaRows;
using ops_detail::blocks_for;
using ops_detail::device;
using ops_detail::row_lengths;
using ops::SlotRows;
using ops::SlotType;

void check_rows(const SlotRows& rows, int layer) {
  KVB_CHECK(layer >= 0 && layer < rows.layers())
      << "cuda policy ops: layer " << layer << " of rows for " << rows.layers() << " layers";
  KVB_USAGE_CHECK(rows.heads() <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " cache heads per layer; this "
      << "policy's state has " << rows.heads();
}

__global__ void divide_kernel(float* rows, int ld, HeadTable before, HeadTable len, int n_queries) {
  const int h = blockIdx.y;
  float* row = rows + static_cast<size_t>(h) * ld;
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < len.v[h]; s += gridDim.x * blockDim.x) {
    const int count = n_queries - max(0, s - before.v[h]);
    row[s] = __fdiv_rn(row[s], static_cast<float>(count));
  }
}

// The slot s of head h in the layer's rows (keys or values, [slots, d]).
template <typename T>
__device__ const T* slot_row(const T* rows, const DeviceLayerKvView& v, int h, int s) {
  return rows + (static_cast<size_t>(v.offsets[h]) + s) * v.head_dim;
}

// sum_i x[i]^2 of one row, f64 FMAs in index order (the CPU's sq_norm).
template <typename T>
__device__ double sq_norm(const T* x, int d) {
  double sq = 0;
  for (int i = 0; i < d; ++i) {
    const double e = kv_load(x + i);
    sq = fma(e, e, sq);
  }
  return sq;
}

// norms[h * ld + j] = sqrt(sum_i x_j[i]^2) (f64 FMAs in index order).
template <typename T>
__global__ void norms_kernel(const T* rows, DeviceLayerKvView v, HeadTable len, double* norms,
                             int ld) {
  const int h = blockIdx.y, d = v.head_dim;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len.v[h]; j += gridDim.x * blockDim.x) {
    norms[static_cast<size_t>(h) * ld + j] = sqrt(sq_norm(slot_row(rows, v, h, j), d));
  }
}

// One block per (head, run of `chunk` slots), a thread per dimension: mean[(h * runs + c) * d +
// i] = (sum_j x_j[i] / max(n_j, 1e-12)) / (the run's slots), j increasing over the run; then
// thread 0: anorm[h * runs + c] = max(sqrt(sum_i mean[i]^2), 1e-8).
template <typename T>
__global__ void anchor_kernel(const T* rows, DeviceLayerKvView v, HeadTable len,
                              const double* norms, int ld, double* mean, double* anorm, int chunk,
                              int runs) {
  const int h = blockIdx.x, c = blockIdx.y, d = v.head_dim, L = len.v[h];
  const int j0 = c * chunk, j1 = min(L, j0 + chunk);
  if (j0 >= L) return;  // a head shorter than the longest has fewer runs
  double* m = mean + (static_cast<size_t>(h) * runs + c) * d;
  const double* n = norms + static_cast<size_t>(h) * ld;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    double acc = 0;
    for (int j = j0; j < j1; ++j) {
      acc = __dadd_rn(acc, __ddiv_rn(kv_load(slot_row(rows, v, h, j) + i), fmax(n[j], 1e-12)));
    }
    m[i] = __ddiv_rn(acc, static_cast<double>(j1 - j0));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sq = 0;
    for (int i = 0; i < d; ++i) sq = fma(m[i], m[i], sq);
    anorm[static_cast<size_t>(h) * runs + c] = fmax(sqrt(sq), 1e-8);
  }
}

template <typename T>
__global__ void cosine_kernel(const T* rows, DeviceLayerKvView v, HeadTable len,
                              const double* norms, int ld, const double* mean,
                              const double* anorm, float* out, int out_ld, int chunk, int runs) {
  const int h = blockIdx.y, d = v.head_dim;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len.v[h]; j += gridDim.x * blockDim.x) {
    const size_t run = static_cast<size_t>(h) * runs + j / chunk;
    const double* m = mean + run * d;
    const T* x = slot_row(rows, v, h, j);
    double dot = 0;
    for (int i = 0; i < d; ++i) dot = fma(static_cast<double>(kv_load(x + i)), m[i], dot);
    const double denom = __dmul_rn(fmax(norms[static_cast<size_t>(h) * ld + j], 1e-8), anorm[run]);
    out[static_cast<size_t>(h) * out_ld + j] = static_cast<float>(__ddiv_rn(dot, denom));
  }
}

template <typename T>
__global__ void cache_norms_kernel(const T* rows, DeviceLayerKvView v, HeadTable len, float* out,
                                   int out_ld, bool squared) {
  const int h = blockIdx.y, d = v.head_dim;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len.v[h]; j += gridDim.x * blockDim.x) {
    const double sq = sq_norm(slot_row(rows, v, h, j), d);
    out[static_cast<size_t>(h) * out_ld + j] = static_cast<float>(squared ? sq : sqrt(sq));
  }
}

// One block per (chunk, head): the chunk's f64 sum in index order by thread 0, then every
// entry divided by it.
__global__ void normalize_chunks_kernel(float* rows, int ld, HeadTable len, int chunk) {
  const int h = blockIdx.y, n = len.v[h];
  float* row = rows + static_cast<size_t>(h) * ld;
  __shared__ double sum;
  for (int c0 = blockIdx.x * chunk; c0 < n; c0 += gridDim.x * chunk) {
    const int c1 = min(n, c0 + chunk);
    if (threadIdx.x == 0) {
      double s = 0;
      for (int i = c0; i < c1; ++i) s = __dadd_rn(s, static_cast<double>(row[i]));
      sum = s;
    }
    __syncthreads();
    const double s = sum;
    if (s != 0) {
      for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        row[i] = static_cast<float>(__ddiv_rn(static_cast<double>(row[i]), s));
      }
    }
    __syncthreads();
  }
}

__global__ void combine_kernel(float* rows, int ld, const float* in, int in_ld, HeadTable len,
                               bool add) {
  const int h = blockIdx.y;
  float* row = rows + static_cast<size_t>(h) * ld;
  const float* by = in + static_cast<size_t>(h) * in_ld;
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < len.v[h]; s += gridDim.x * blockDim.x) {
    row[s] = add ? __fadd_rn(row[s], by[s]) : __fmul_rn(row[s], by[s]);
  }
}

__global__ void fill_prefix_kernel(float* rows, int ld, HeadTable len, int count, float value) {
  const int h = blockIdx.y;
  float* row = rows + static_cast<size_t>(h) * ld;
  const int n = min(count, static_cast<int>(len.v[h]));
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n; s += gridDim.x * blockDim.x) {
    row[s] = value;
  }
}

// lag_scores' every entry but the scored partitions': 1, or the short rows' recency ramp.
__global__ void lag_base_kernel(float* out, int ld, HeadTable len, int sinks, int lag) {
  const int h = blockIdx.y, n = len.v[h];
  float* row = out + static_cast<size_t>(h) * ld;
  const bool ramp = n < sinks + 2 * lag;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    row[j] = ramp && j >= sinks
                 ? static_cast<float>(__ddiv_rn(static_cast<double>(j - sinks), n - sinks))
                 : 1.0f;
  }
}

// The softmax over a partition's lag slots of sd_t (lag_scores' contract) into a[0, lag):
// lo/hi in shared memory ([d] each), every step in the CPU's order.
template <typename T>
__device__ void lag_softmax(const T* rows, const DeviceLayerKvView& v, int h, int first, int lag,
                            double* lo, double* hi, double* a, double* shared_sum) {
  const int d = v.head_dim;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    double l = kv_load(slot_row(rows, v, h, first + lag) + c), u = l;
    for (int t = 1; t < lag; ++t) {
      const double x = kv_load(slot_row(rows, v, h, first + lag + t) + c);
      l = fmin(l, x);
      u = fmax(u, x);
    }
    lo[c] = l;
    hi[c] = u;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < lag; t += blockDim.x) {
    const T* x = slot_row(rows, v, h, first + t);
    double mean = 0;
    for (int c = 0; c < d; ++c) {
      mean = __dadd_rn(mean, hi[c] == lo[c] ? 0.0
                                             : __ddiv_rn(__dsub_rn(kv_load(x + c), lo[c]),
                                                         __dsub_rn(hi[c], lo[c])));
    }
    mean = __ddiv_rn(mean, static_cast<double>(d));
    double ss = 0;
    for (int c = 0; c < d; ++c) {
      const double z = hi[c] == lo[c] ? 0.0
                                      : __ddiv_rn(__dsub_rn(kv_load(x + c), lo[c]),
                                                  __dsub_rn(hi[c], lo[c]));
      const double e = __dsub_rn(z, mean);
      ss = fma(e, e, ss);
    }
    a[t] = d > 1 ? sqrt(__ddiv_rn(ss, static_cast<double>(d - 1))) : 0.0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double top = a[0];
    for (int t = 1; t < lag; ++t) top = fmax(top, a[t]);
    *shared_sum = top;
  }
  __syncthreads();
  const double top = *shared_sum;
  for (int t = threadIdx.x; t < lag; t += blockDim.x) a[t] = exp(__dsub_rn(a[t], top));
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0;
    for (int t = 0; t < lag; ++t) sum = __dadd_rn(sum, a[t]);
    *shared_sum = sum;
  }
  __syncthreads();
  const double sum = *shared_sum;
  for (int t = threadIdx.x; t < lag; t += blockDim.x) a[t] = __ddiv_rn(a[t], sum);
  __syncthreads();
}

// One block per (partition, head): partition p < P_h - 1 of head h, scored against p + 1.
// scratch: [heads, 2 * lag] doubles (the keys' and values' softmaxes).
template <typename T>
__global__ void lag_partition_kernel(const T* keys, const T* values, DeviceLayerKvView v,
                                     HeadTable len, int sinks, int lag, double* scratch,
                                     float* out, int ld) {
  const int h = blockIdx.y, p = blockIdx.x, n = len.v[h];
  if (n < sinks + 2 * lag || p + 1 >= (n - sinks) / lag) return;
  extern __shared__ double lohi[];  // [2 * head_dim]
  __shared__ double reduce;
  const int first = sinks + p * lag;
  double* ak = scratch + (static_cast<size_t>(h) * gridDim.x + p) * 2 * lag;
  double* av = ak + lag;
  lag_softmax(keys, v, h, first, lag, lohi, lohi + v.head_dim, ak, &reduce);
  lag_softmax(values, v, h, first, lag, lohi, lohi + v.head_dim, av, &reduce);
  for (int t = threadIdx.x; t < lag; t += blockDim.x) ak[t] = __ddiv_rn(__dadd_rn(ak[t], av[t]), 2.0);
  __syncthreads();
  float* row = out + static_cast<size_t>(h) * ld;
  for (int t = threadIdx.x; t < lag; t += blockDim.x) {
    int rank = 0;
    for (int u = 0; u < lag; ++u) rank += ak[u] < ak[t] || (ak[u] == ak[t] && u < t);
    row[first + t] = static_cast<float>(__ddiv_rn(static_cast<double>(rank), lag));
  }
}

template <typename T>
void launch_cosine(const T* rows, const DeviceLayerKvView& v, HeadTable len, int heads,
                   int longest, double* norms, int ld, double* mean, double* anorm, float* out,
                   int out_ld, int chunk, int runs, cudaStream_t stream) {
  const dim3 grid(blocks_for(longest), heads);
  norms_kernel<<<grid, 256, 0, stream>>>(rows, v, len, norms, ld);
  KVB_CUDA_CHECK_LAUNCH();
  anchor_kernel<<<dim3(heads, runs), std::min(256, std::max(32, v.head_dim)), 0, stream>>>(
      rows, v, len, norms, ld, mean, anorm, chunk, runs);
  KVB_CUDA_CHECK_LAUNCH();
  cosine_kernel<<<grid, 256, 0, stream>>>(rows, v, len, norms, ld, mean, anorm, out, out_ld,
                                          chunk, runs);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace {
// The common start of an op over a layer of the cache's device rows into f32 rows `out`: checks,
// each head's length (len), `out`'s rows (out_layer, h) as long as the cache's heads; returns
// the longest.
int cache_op_rows(CudaRows& r, const SlotRows& out, int out_layer, const KvCache& cache,
                  int layer, const char* op, HeadTable* len) {
  check_rows(out, out_layer);
  const int heads = out.heads();
  KVB_CHECK(out.type() == SlotType::kF32 && layer >= 0 && layer < cache.shape().num_layers &&
            heads <= cache.shape().num_kv_heads)
      << "cuda policy ops: " << op << " into " << heads << " rows over layer " << layer
      << " of a cache of " << cache.shape().num_kv_heads << " heads";
  int longest = 0;
  for (int h = 0; h < heads; ++h) {
    len->v[h] = cache.length(layer, h);
    longest = std::max(longest, static_cast<int>(len->v[h]));
  }
  r.reserve(out_layer, longest);
  for (int h = 0; h < heads; ++h) r.set_len(out_layer, h, len->v[h]);
  return longest;
}

}  // namespace

double* CudaPolicyOps::f64_scratch(size_t need) {
  if (need > f64_cap_) {
    const size_t want = std::max(need, f64_cap_ + f64_cap_ / 2);
    free_async(f64_, stream_);  // capture-aware (graph.h)
    f64_ = nullptr;
    f64_cap_ = 0;  // until the allocation below succeeds
    f64_ = static_cast<double*>(malloc_async(want * sizeof(double), stream_));
    f64_cap_ = want;
  }
  return f64_;
}

void CudaPolicyOps::divide_by_query_counts(SlotRows& rows, int layer,
                                           std::span<const int32_t> before, int n_queries) {
  CudaRows& r = device(rows);
  check_rows(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && static_cast<int>(before.size()) <= rows.heads() &&
            n_queries >= 1)
      << "cuda policy ops: divide_by_query_counts of " << before.size() << " heads of "
      << rows.heads() << " rows, " << n_queries << " queries";
  HeadTable from{}, len{};
  int longest = 0;
  for (int h = 0; h < static_cast<int>(before.size()); ++h) {
    len.v[h] = rows.length(layer, h);
    KVB_CHECK(before[h] >= 0 && len.v[h] <= before[h] + n_queries)
        << "cuda policy ops: divide_by_query_counts: head " << h << " holds " << len.v[h]
        << " entries, " << before[h] << " before a block of " << n_queries << " queries";
    from.v[h] = before[h];
    longest = std::max(longest, static_cast<int>(len.v[h]));
  }
  if (longest == 0) return;
  divide_kernel<<<dim3(blocks_for(longest), static_cast<unsigned>(before.size())), 256, 0,
                  stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer), from, len,
                             n_queries);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::cosine_to_mean(SlotRows& out, int out_layer,
                                   const kernels::KvIndex& cache_index, int layer,
                                   ops::CacheRows which, int chunk) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(out);
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "cosine_to_mean");
  KVB_CHECK(chunk >= 0) << "cuda policy ops: cosine_to_mean chunk " << chunk;
  HeadTable len{};
  const int heads = out.heads();
  const int longest = cache_op_rows(r, out, out_layer, cache, layer, "cosine_to_mean", &len);
  if (heads == 0) return;
  const DeviceLayerKvView v = dev.layer(layer);
  const int ld = std::max(longest, 1);
  // Runs of `chunk` slots with their own anchors (chunk 0: one run as long as the longest head).
  const int step = chunk > 0 ? chunk : ld;
  const int runs = (ld + step - 1) / step;
  // Scratch: norms [heads, ld], means [heads, runs, head_dim], anchor norms [heads, runs].
  const size_t anchors = static_cast<size_t>(heads) * runs;
  double* norms = f64_scratch(static_cast<size_t>(heads) * ld + anchors * v.head_dim + anchors);
  double* mean = norms + static_cast<size_t>(heads) * ld;
  double* anorm = mean + anchors * v.head_dim;
  const void* rows = which == ops::CacheRows::kKeys ? v.keys : v.values;
  float* o = static_cast<float*>(r.data(out_layer));
  if (v.dtype == KvDtype::kBf16) {
    launch_cosine(static_cast<const __nv_bfloat16*>(rows), v, len, heads, longest, norms, ld,
                  mean, anorm, o, r.ld(out_layer), step, runs, stream_);
  } else {
    launch_cosine(static_cast<const float*>(rows), v, len, heads, longest, norms, ld, mean,
                  anorm, o, r.ld(out_layer), step, runs, stream_);
  }
  launches_ += 3;
}

void CudaPolicyOps::cache_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache_index,
                                int layer, ops::CacheRows which, bool squared) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(out);
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "cache_norms");
  HeadTable len{};
  const int heads = out.heads();
  const int longest = cache_op_rows(r, out, out_layer, cache, layer, "cache_norms", &len);
  if (heads == 0 || longest == 0) return;
  const DeviceLayerKvView v = dev.layer(layer);
  const void* rows = which == ops::CacheRows::kKeys ? v.keys : v.values;
  float* o = static_cast<float*>(r.data(out_layer));
  const dim3 grid(blocks_for(longest), heads);
  if (v.dtype == KvDtype::kBf16) {
    cache_norms_kernel<<<grid, 256, 0, stream_>>>(static_cast<const __nv_bfloat16*>(rows), v, len,
                                                  o, r.ld(out_layer), squared);
  } else {
    cache_norms_kernel<<<grid, 256, 0, stream_>>>(static_cast<const float*>(rows), v, len, o,
                                                  r.ld(out_layer), squared);
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::normalize_chunks(SlotRows& rows, int layer, int chunk) {
  CudaRows& r = device(rows);
  check_rows(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && chunk >= 0)
      << "cuda policy ops: normalize_chunks of " << chunk << " entries";
  HeadTable len{};
  const int longest = row_lengths(rows, layer, &len);
  if (longest == 0) return;
  const int step = chunk == 0 ? longest : chunk;
  const unsigned chunks = std::min<unsigned>(grid_for(static_cast<size_t>(longest), step), 1024u);
  normalize_chunks_kernel<<<dim3(chunks, rows.heads()), 128, 0, stream_>>>(
      static_cast<float*>(r.data(layer)), r.ld(layer), len, step);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::combine(SlotRows& rows, int layer, const SlotRows& in, int in_layer,
                            ops::Combine how) {
  CudaRows& r = device(rows);
  const CudaRows& b = device(in);
  check_rows(rows, layer);
  check_rows(in, in_layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && in.type() == SlotType::kF32 &&
            in.heads() >= rows.heads() && (&in != &rows || in_layer != layer))
      << "cuda policy ops: combine of " << rows.heads() << " rows with " << in.heads() << " rows";
  HeadTable len{};
  const int longest = row_lengths(rows, layer, &len);
  for (int h = 0; h < rows.heads(); ++h) {
    KVB_CHECK(in.length(in_layer, h) == len.v[h])
        << "cuda policy ops: combine: head " << h << " rows of " << len.v[h] << " and "
        << in.length(in_layer, h);
  }
  if (longest == 0) return;
  combine_kernel<<<dim3(blocks_for(longest), rows.heads()), 256, 0, stream_>>>(
      static_cast<float*>(r.data(layer)), r.ld(layer), static_cast<const float*>(b.data(in_layer)),
      b.ld(in_layer), len, how == ops::Combine::kAdd);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::fill_prefix(SlotRows& rows, int layer, int count, float value) {
  CudaRows& r = device(rows);
  check_rows(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && count >= 0)
      << "cuda policy ops: fill_prefix of " << count << " entries";
  HeadTable len{};
  const int longest = row_lengths(rows, layer, &len);
  if (longest == 0 || count == 0) return;
  fill_prefix_kernel<<<dim3(blocks_for(std::min(count, longest)), rows.heads()), 256, 0,
                       stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer), len, count,
                                  value);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::lag_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache_index,
                               int layer, int sinks, int lag) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(out);
  KVB_CHECK(sinks >= 0 && lag >= 1) << "cuda policy ops: lag_scores with sinks " << sinks
                                    << ", lag " << lag;
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "lag_scores");
  HeadTable len{};
  const int heads = out.heads();
  const int longest = cache_op_rows(r, out, out_layer, cache, layer, "lag_scores", &len);
  int parts = 0;
  for (int h = 0; h < heads; ++h) {
    if (len.v[h] >= sinks + 2 * lag) parts = std::max(parts, (len.v[h] - sinks) / lag - 1);
  }
  if (heads == 0 || longest == 0) return;
  float* o = static_cast<float*>(r.data(out_layer));
  lag_base_kernel<<<dim3(blocks_for(longest), heads), 256, 0, stream_>>>(o, r.ld(out_layer), len,
                                                                         sinks, lag);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
  if (parts == 0) return;
  const DeviceLayerKvView v = dev.layer(layer);
  double* scratch = f64_scratch(static_cast<size_t>(heads) * parts * 2 * lag);
  const size_t shared = 2 * static_cast<size_t>(v.head_dim) * sizeof(double);
  const dim3 grid(parts, heads);
  if (v.dtype == KvDtype::kBf16) {
    lag_partition_kernel<<<grid, 128, shared, stream_>>>(
        static_cast<const __nv_bfloat16*>(v.keys), static_cast<const __nv_bfloat16*>(v.values), v,
        len, sinks, lag, scratch, o, r.ld(out_layer));
  } else {
    lag_partition_kernel<<<grid, 128, shared, stream_>>>(
        static_cast<const float*>(v.keys), static_cast<const float*>(v.values), v, len, sinks,
        lag, scratch, o, r.ld(out_layer));
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

}  // namespace kvb::kernels::cuda
