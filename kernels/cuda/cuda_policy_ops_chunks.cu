// CudaPolicyOps' chunk_attention_sums and standardize (policy_ops.h; kvpress NonCausalAttnPress,
// CompactorPress's attention half). Every dot product is an f32 fused multiply-add chain in the
// CPU instance's index order and every sum an f64 sum in its order, so the entries are the CPU's
// bits except where the device's expf differs from glibc's in the last bit. The queries are
// rotated by cuda::rope (the engine's bits) in scratch; its frequencies are the one upload (counted
// in transfers()); nothing is copied to the host and nothing waits.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

using ops::SlotRows;
using ops::SlotType;
using ops_detail::CudaRows;
using ops_detail::device;

constexpr float kPadLogit = -1e-9f;  // kvpress's mask value (the CPU instance's)
constexpr int kThreads = 128;

__global__ void positions_kernel(int32_t* pos, int n, int32_t first) {
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
    pos[t] = first + t;
  }
}

// y_t . k_j: f32 fused multiply-adds in index order from 0 (the CPU's per-key chain).
template <typename T>
__device__ float dot_f32(const float* y, const T* k, int d) {
  float acc = 0.0f;
  for (int i = 0; i < d; ++i) acc = __fmaf_rn(y[i], kv_load(k + i), acc);
  return acc;
}

// Tokens and slots are counted from `first` (y holds the range's queries; the chunks start there).
// A thread per (query t, query head blockIdx.y): the maximum logit of its chunk's row and the f64
// sum of its exponentials (real keys in order, then the padding).
template <typename T>
__global__ void row_stats_kernel(const float* y, const T* keys, DeviceLayerKvView v, int first,
                                 int n, int heads, int group, int chunk, float* maxes,
                                 double* sums) {
  const int q = blockIdx.y, h = q / group, d = v.head_dim;
  const T* base = keys + (static_cast<size_t>(v.offsets[h]) + first) * d;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
    const int c0 = t / chunk * chunk, real = min(chunk, n - c0);
    const float* yt = y + (static_cast<size_t>(t) * heads + q) * d;
    float m = dot_f32(yt, base + static_cast<size_t>(c0) * d, d);
    for (int j = 1; j < real; ++j)
      m = fmaxf(m, dot_f32(yt, base + static_cast<size_t>(c0 + j) * d, d));
    if (real < chunk) m = fmaxf(m, kPadLogit);
    double s = 0;
    for (int j = 0; j < real; ++j) {
      s = __dadd_rn(s, expf(__fsub_rn(dot_f32(yt, base + static_cast<size_t>(c0 + j) * d, d), m)));
    }
    if (real < chunk) {
      const double ep = expf(__fsub_rn(kPadLogit, m));
      for (int j = real; j < chunk; ++j) s = __dadd_rn(s, ep);
    }
    maxes[static_cast<size_t>(q) * n + t] = m;
    sums[static_cast<size_t>(q) * n + t] = s;
  }
}

// A thread per (slot j, query head blockIdx.y): the f64 sum over its chunk's queries in order of
// e_j / s, then the padded queries' share pad_p (the last chunk, when it is short).
template <typename T>
__global__ void column_sums_kernel(const float* y, const T* keys, DeviceLayerKvView v, int first,
                                   int n, int heads, int group, int chunk, const float* maxes,
                                   const double* sums, double pad_p, float* out, int ld) {
  const int q = blockIdx.y, h = q / group, d = v.head_dim;
  const T* base = keys + (static_cast<size_t>(v.offsets[h]) + first) * d;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    const int c0 = j / chunk * chunk, real = min(chunk, n - c0);
    const T* k = base + static_cast<size_t>(j) * d;
    double col = 0;
    for (int t = c0; t < c0 + real; ++t) {
      const float* yt = y + (static_cast<size_t>(t) * heads + q) * d;
      const size_t at = static_cast<size_t>(q) * n + t;
      const float e = expf(__fsub_rn(dot_f32(yt, k, d), maxes[at]));
      col = __dadd_rn(col, __ddiv_rn(static_cast<double>(e), sums[at]));
    }
    if (real < chunk) {
      for (int t = real; t < chunk; ++t) col = __dadd_rn(col, pad_p);
    }
    out[static_cast<size_t>(q) * ld + j] = static_cast<float>(col);
  }
}

// standardize in one block: each thread sums runs of kStandardizeRun entries (run r of head h is
// partial h * runs + r), thread 0 adds the partials in (head, run) order; twice (the mean, then
// the squared deviations); then every entry is rewritten.
__global__ void standardize_kernel(float* rows, int ld, HeadTable len, int heads, int runs,
                                   double count, double* partial) {
  constexpr int kRun = static_cast<int>(ops::kStandardizeRun);
  __shared__ double mean, sd;
  for (int pass = 0; pass < 2; ++pass) {
    for (int p = threadIdx.x; p < heads * runs; p += blockDim.x) {
      const int h = p / runs, b = (p % runs) * kRun;
      const float* row = rows + static_cast<size_t>(h) * ld;
      double acc = 0;
      for (int j = b; j < min(len.v[h], b + kRun); ++j) {
        if (pass == 0) {
          acc = __dadd_rn(acc, static_cast<double>(row[j]));
        } else {
          const double dx = __dsub_rn(static_cast<double>(row[j]), mean);
          acc = fma(dx, dx, acc);
        }
      }
      partial[p] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0;
      for (int h = 0; h < heads; ++h) {
        for (int r = 0; r * kRun < len.v[h]; ++r) total = __dadd_rn(total, partial[h * runs + r]);
      }
      if (pass == 0) {
        mean = __ddiv_rn(total, count);
      } else {
        sd = count < 2 ? 1e-6 : fmax(sqrt(__ddiv_rn(total, count - 1)), 1e-6);
      }
    }
    __syncthreads();
  }
  for (int p = threadIdx.x; p < heads * runs * kRun; p += blockDim.x) {
    const int h = p / (runs * kRun), j = p % (runs * kRun);
    if (j >= len.v[h]) continue;
    float& x = rows[static_cast<size_t>(h) * ld + j];
    x = static_cast<float>(__ddiv_rn(__dsub_rn(static_cast<double>(x), mean), sd));
  }
}

__global__ void slice_kernel(const float* in, int in_ld, int first, int count, float* out,
                             int out_ld) {
  const int h = blockIdx.y;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < count; j += gridDim.x * blockDim.x) {
    out[static_cast<size_t>(h) * out_ld + j] = in[static_cast<size_t>(h) * in_ld + first + j];
  }
}

// A thread per row: the CPU's running f32 sum in index order.
__global__ void cumsum_kernel(float* rows, int ld, HeadTable len, int heads) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  float* row = rows + static_cast<size_t>(h) * ld;
  for (int j = 1; j < len.v[h]; ++j) row[j] = __fadd_rn(row[j], row[j - 1]);
}

// Head blockIdx.y's entries t < count.v[h] from its indices at offset.v[h].
__global__ void gather_kernel(const float* in, int in_ld, const int32_t* indices, HeadTable offset,
                              HeadTable count, float* out, int out_ld) {
  const int h = blockIdx.y;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < count.v[h]; t += gridDim.x * blockDim.x) {
    out[static_cast<size_t>(h) * out_ld + t] =
        in[static_cast<size_t>(h) * in_ld + indices[offset.v[h] + t]];
  }
}

// pad_with_max in one block: thread 0 takes the maximum in (head, index) order (the CPU's
// std::max), then every thread writes.
__global__ void pad_max_kernel(const float* in, int in_ld, HeadTable len, int heads, int before,
                               int after, float* out, int out_ld) {
  __shared__ float top;
  if (threadIdx.x == 0) {
    bool any = false;
    float m = 0;
    for (int h = 0; h < heads; ++h) {
      for (int j = 0; j < len.v[h]; ++j) {
        const float x = in[static_cast<size_t>(h) * in_ld + j];
        m = any ? (m < x ? x : m) : x;
        any = true;
      }
    }
    top = m;
  }
  __syncthreads();
  for (int h = 0; h < heads; ++h) {
    const int n = before + len.v[h] + after;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const bool inside = j >= before && j < before + len.v[h];
      out[static_cast<size_t>(h) * out_ld + j] =
          inside ? in[static_cast<size_t>(h) * in_ld + j - before] : top;
    }
  }
}

}  // namespace

void CudaPolicyOps::slice(const SlotRows& in, int in_layer, int first, int count, SlotRows& out,
                          int out_layer) {
  const CudaRows& a = device(in);
  CudaRows& r = device(out);
  KVB_CHECK(in_layer >= 0 && in_layer < in.layers() && out_layer >= 0 && out_layer < out.layers() &&
            in.type() == SlotType::kF32 && out.type() == SlotType::kF32 && &in != &out &&
            out.heads() <= in.heads() && first >= 0 && count >= 0)
      << "cuda policy ops: slice: entries [" << first << ", " << first + count << ") of "
      << in.heads() << " rows into " << out.heads();
  for (int h = 0; h < out.heads(); ++h) {
    KVB_CHECK(first + count <= in.length(in_layer, h))
        << "cuda policy ops: slice: entries [" << first << ", " << first + count << ") of head "
        << h << "'s row of " << in.length(in_layer, h);
  }
  r.reserve(out_layer, count);
  for (int h = 0; h < out.heads(); ++h) r.set_len(out_layer, h, count);
  if (out.heads() == 0 || count == 0) return;
  slice_kernel<<<dim3(ops_detail::blocks_for(count), out.heads()), 256, 0, stream_>>>(
      static_cast<const float*>(a.data(in_layer)), a.ld(in_layer), first, count,
      static_cast<float*>(r.data(out_layer)), r.ld(out_layer));
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::cumsum(SlotRows& rows, int layer) {
  CudaRows& r = device(rows);
  KVB_CHECK(layer >= 0 && layer < rows.layers() && rows.type() == SlotType::kF32)
      << "cuda policy ops: cumsum on layer " << layer << " of rows for " << rows.layers()
      << " layers" << (rows.type() == SlotType::kF32 ? "" : " (u64 rows)");
  KVB_CHECK(rows.heads() <= kMaxParamHeads)
      << "cuda policy ops: cumsum over " << rows.heads() << " rows";
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < rows.heads(); ++h) {
    len.v[h] = rows.length(layer, h);
    longest = std::max(longest, len.v[h]);
  }
  if (longest <= 1) return;
  cumsum_kernel<<<1, 128, 0, stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer), len,
                                        rows.heads());
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::gather(const SlotRows& in, int in_layer, std::span<const int32_t> indices,
                           std::span<const int32_t> counts, SlotRows& out, int out_layer) {
  const CudaRows& a = device(in);
  CudaRows& r = device(out);
  const int heads = static_cast<int>(counts.size());
  KVB_CHECK(in_layer >= 0 && in_layer < in.layers() && out_layer >= 0 && out_layer < out.layers() &&
            in.type() == SlotType::kF32 && out.type() == SlotType::kF32 && &in != &out &&
            heads <= out.heads() && heads <= in.heads() && heads <= kMaxParamHeads)
      << "cuda policy ops: gather: " << heads << " heads from " << in.heads() << " rows into "
      << out.heads();
  HeadTable offset{}, count{};
  size_t total = 0;
  int longest = 0;
  for (int h = 0; h < heads; ++h) {
    KVB_CHECK(counts[h] >= 0) << "cuda policy ops: gather: head " << h << " gathers " << counts[h]
                              << " entries";
    offset.v[h] = static_cast<int32_t>(total);
    count.v[h] = counts[h];
    longest = std::max(longest, counts[h]);
    total += static_cast<size_t>(counts[h]);
  }
  KVB_CHECK(total == indices.size()) << "cuda policy ops: gather: " << indices.size()
                                     << " indices for counts summing to " << total;
  for (int h = 0; h < heads; ++h) {
    const int len = in.length(in_layer, h);
    for (int t = 0; t < counts[h]; ++t) {
      const int32_t i = indices[static_cast<size_t>(offset.v[h]) + t];
      KVB_CHECK(i >= 0 && i < len)
          << "cuda policy ops: gather: index " << i << " of head " << h << "'s row of " << len;
    }
  }
  r.reserve(out_layer, longest);
  for (int h = 0; h < heads; ++h) r.set_len(out_layer, h, counts[h]);
  if (heads == 0 || longest == 0) return;
  // The indices in the f64 scratch (stream-ordered: the previous op's use precedes this one's).
  auto* dev_indices = reinterpret_cast<int32_t*>(f64_scratch((total + 1) / 2));
  upload_async(dev_indices, indices.data(), total * sizeof(int32_t), stream_);
  ++transfers_.h2d_copies;
  transfers_.h2d_bytes += total * sizeof(int32_t);
  gather_kernel<<<dim3(ops_detail::blocks_for(longest), heads), 256, 0, stream_>>>(
      static_cast<const float*>(a.data(in_layer)), a.ld(in_layer), dev_indices, offset, count,
      static_cast<float*>(r.data(out_layer)), r.ld(out_layer));
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::pad_with_max(const SlotRows& in, int in_layer, int before, int after,
                                 SlotRows& out, int out_layer) {
  const CudaRows& a = device(in);
  CudaRows& r = device(out);
  KVB_CHECK(in_layer >= 0 && in_layer < in.layers() && out_layer >= 0 && out_layer < out.layers() &&
            in.type() == SlotType::kF32 && out.type() == SlotType::kF32 && &in != &out &&
            out.heads() <= in.heads() && before >= 0 && after >= 0)
      << "cuda policy ops: pad_with_max: " << before << " and " << after << " entries around "
      << in.heads() << " rows into " << out.heads();
  KVB_USAGE_CHECK(out.heads() <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " heads per layer; this "
      << "policy's rows have " << out.heads();
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < out.heads(); ++h) {
    len.v[h] = in.length(in_layer, h);
    longest = std::max(longest, static_cast<int>(len.v[h]));
  }
  r.reserve(out_layer, before + longest + after);
  for (int h = 0; h < out.heads(); ++h) r.set_len(out_layer, h, before + len.v[h] + after);
  if (out.heads() == 0) return;
  pad_max_kernel<<<1, 256, 0, stream_>>>(static_cast<const float*>(a.data(in_layer)),
                                         a.ld(in_layer), len, out.heads(), before, after,
                                         static_cast<float*>(r.data(out_layer)), r.ld(out_layer));
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::chunk_attention_sums(SlotRows& out, int out_layer,
                                         const kernels::KvIndex& cache_index, int layer,
                                         const ops::LayerStats& st, int first, int count,
                                         int chunk) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(out);
  KVB_CHECK(out_layer >= 0 && out_layer < out.layers() && out.type() == SlotType::kF32)
      << "cuda policy ops: chunk_attention_sums on layer " << out_layer << " of rows for "
      << out.layers() << " layers";
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "chunk_attention_sums");
  const int heads = out.heads(), total = st.n_new, kv = cache.shape().num_kv_heads;
  KVB_USAGE_CHECK(heads <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " heads per layer; this "
      << "policy's rows have " << heads;
  KVB_CHECK(layer >= 0 && layer < cache.shape().num_layers && heads == st.num_heads && heads >= 1 &&
            kv >= 1 && heads % kv == 0 && chunk >= 1 && first >= 0 && count >= 1 &&
            first + count <= total && st.pre_rope_queries != nullptr && st.rope != nullptr)
      << "cuda policy ops: chunk_attention_sums: " << heads << " rows for " << st.num_heads
      << " query heads over a cache of " << kv << " heads, chunks of " << chunk << ", tokens ["
      << first << ", " << first + count << ") of " << total << " queries"
      << (st.pre_rope_queries && st.rope ? "" : " (no pre-RoPE queries or RoPE)");
  for (int h = 0; h < kv; ++h) {
    KVB_CHECK(cache.length(layer, h) == total)
        << "cuda policy ops: chunk_attention_sums: head " << h << " holds "
        << cache.length(layer, h) << " slots, not the block's " << total
        << " (a prompt's prefill into an empty cache)";
  }
  const int n = count;  // below: tokens and slots counted from `first`
  const int group = heads / kv;
  const DeviceLayerKvView v = dev.layer(layer);
  const int d = v.head_dim;
  r.reserve(out_layer, n);
  for (int q = 0; q < heads; ++q) r.set_len(out_layer, q, n);
  // Scratch: the rows' f64 sums [heads, n], then as floats the rotated queries [n, heads, d], the
  // rows' maxima [heads, n] and the positions [n] (int32).
  const size_t rows_n = static_cast<size_t>(heads) * n;
  const size_t floats = static_cast<size_t>(n) * heads * d + rows_n + n;
  double* sums = f64_scratch(rows_n + (floats + 1) / 2);
  float* y = reinterpret_cast<float*>(sums + rows_n);
  float* maxes = y + static_cast<size_t>(n) * heads * d;
  int32_t* pos = reinterpret_cast<int32_t*>(maxes + rows_n);
  KVB_CUDA_CHECK(cudaMemcpyAsync(y, st.pre_rope_queries + static_cast<size_t>(first) * heads * d,
                                 static_cast<size_t>(n) * heads * d * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_));
  positions_kernel<<<ops_detail::blocks_for(n), 256, 0, stream_>>>(pos, n,
                                                                   st.block_end - total + first);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
  rope(y, pos, n, heads, d, *st.rope, stream_);  // one launch, its frequencies uploaded
  ++launches_;
  ++transfers_.h2d_copies;
  transfers_.h2d_bytes += static_cast<size_t>(st.rope->rot_dim / 2) * sizeof(float);
  // The padded queries' share of each real key of a short last chunk (the CPU's host arithmetic).
  const int last = n % chunk;
  double pad_p = 0;
  if (last != 0) {
    double s = 0;
    for (int j = 0; j < last; ++j) s += 1.0;
    const double e = std::exp(kPadLogit - 0.0f);
    for (int j = last; j < chunk; ++j) s += e;
    pad_p = 1.0 / s;
  }
  const dim3 grid(std::min(64u, grid_for(static_cast<size_t>(n), kThreads)), heads);
  float* o = static_cast<float*>(r.data(out_layer));
  if (v.dtype == KvDtype::kBf16) {
    const auto* keys = static_cast<const __nv_bfloat16*>(v.keys);
    row_stats_kernel<<<grid, kThreads, 0, stream_>>>(y, keys, v, first, n, heads, group, chunk,
                                                     maxes, sums);
    KVB_CUDA_CHECK_LAUNCH();
    column_sums_kernel<<<grid, kThreads, 0, stream_>>>(y, keys, v, first, n, heads, group, chunk,
                                                       maxes, sums, pad_p, o, r.ld(out_layer));
  } else {
    const auto* keys = static_cast<const float*>(v.keys);
    row_stats_kernel<<<grid, kThreads, 0, stream_>>>(y, keys, v, first, n, heads, group, chunk,
                                                     maxes, sums);
    KVB_CUDA_CHECK_LAUNCH();
    column_sums_kernel<<<grid, kThreads, 0, stream_>>>(y, keys, v, first, n, heads, group, chunk,
                                                       maxes, sums, pad_p, o, r.ld(out_layer));
  }
  KVB_CUDA_CHECK_LAUNCH();
  launches_ += 2;
}

void CudaPolicyOps::standardize(SlotRows& rows, int layer) {
  CudaRows& r = device(rows);
  KVB_CHECK(layer >= 0 && layer < rows.layers() && rows.type() == SlotType::kF32)
      << "cuda policy ops: standardize on layer " << layer << " of rows for " << rows.layers()
      << " layers";
  KVB_USAGE_CHECK(rows.heads() <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " heads per layer; this "
      << "policy's rows have " << rows.heads();
  HeadTable len{};
  const int longest = ops_detail::row_lengths(rows, layer, &len);
  size_t count = 0;
  for (int h = 0; h < rows.heads(); ++h) count += len.v[h];
  if (count == 0) return;
  const int run = static_cast<int>(ops::kStandardizeRun);
  const int runs = (longest + run - 1) / run;
  double* partial = f64_scratch(static_cast<size_t>(rows.heads()) * runs);
  standardize_kernel<<<1, 1024, 0, stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer), len,
                                              rows.heads(), runs, static_cast<double>(count),
                                              partial);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

}  // namespace kvb::kernels::cuda
