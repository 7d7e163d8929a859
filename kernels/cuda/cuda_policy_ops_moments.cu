// CudaPolicyOps' query-statistics ops (cuda_policy_ops.h; kvpress ExpectedAttentionPress on the
// vocabulary, POLICIES.md "kvpress's presses"): query_moments, quadratic_scores, softmax and
// add_scalar; and CriticalKVPress's projected_value_norms. Every product-sum is an explicit f64
// fused multiply-add in the CPU instance's order and every other step one IEEE operation, so the
// entries are the CPU's bits (softmax's exp is the device's: it may differ from glibc's in the last
// bit). The rotation's factors travel as a kernel argument; nothing is copied to the host and
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

using ops::SlotRows;
using ops::SlotType;
using ops_detail::CudaRows;
using ops_detail::blocks_for;
using ops_detail::device;
using ops_detail::row_lengths;

constexpr int kMaxHeadDim = 256;  // query_moments' rotation factors and threads per head
constexpr int kChunk = 16;        // queries staged in shared memory per step of the covariance

// The rotation as a kernel argument: cos then sin, rot_dim / 2 each.
struct Rotation {
  float cs[kMaxHeadDim];
  int half;
  int adjacent;
};

void check_rows(const SlotRows& rows, int layer, const char* op) {
  KVB_CHECK(layer >= 0 && layer < rows.layers() && rows.type() == SlotType::kF32)
      << "cuda policy ops: " << op << " on layer " << layer << " of rows for " << rows.layers()
      << " layers";
  KVB_USAGE_CHECK(rows.heads() <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " heads per layer; this "
      << "policy's rows have " << rows.heads();
}

// Entry i of query x rotated (PairRotation's rule, the CPU's rotate_pairs).
__device__ double rotated(const float* x, int i, const Rotation& r) {
  const int half = r.half;
  if (i >= 2 * half) return x[i];
  int p, a, b;
  if (r.adjacent) {
    p = i / 2;
    a = 2 * p;
    b = a + 1;
  } else {
    p = i < half ? i : i - half;
    a = p;
    b = p + half;
  }
  const double xa = x[a], xb = x[b], c = r.cs[p], s = r.cs[half + p];
  return i == a ? fma(xa, c, -__dmul_rn(xb, s)) : fma(xa, s, __dmul_rn(xb, c));
}

// One block per query head, a thread per dimension: the f64 mean (scratch) and its f32 copy.
__global__ void moments_mean_kernel(const float* queries, int num_heads, int d, int first, int n,
                                    Rotation rot, double* mean, float* out, int ld) {
  const int q = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    double acc = 0;
    for (int t = first; t < n; ++t) {
      acc = __dadd_rn(acc, rotated(queries + (static_cast<size_t>(t) * num_heads + q) * d, i, rot));
    }
    const double m = __ddiv_rn(acc, static_cast<double>(n - first));
    mean[static_cast<size_t>(q) * d + i] = m;
    out[static_cast<size_t>(q) * ld + i] = static_cast<float>(m);
  }
}

// Blocks (entry tile, query head), a thread per covariance entry (i, j): the centred rotated
// queries of kChunk steps at a time in shared memory, each entry's sum in t order.
__global__ void moments_cov_kernel(const float* queries, int num_heads, int d, int first, int n,
                                   Rotation rot, const double* mean, float* out, int ld) {
  extern __shared__ double e[];  // [kChunk, d]
  const int q = blockIdx.y;
  const int entry = blockIdx.x * blockDim.x + threadIdx.x;
  const double* mu = mean + static_cast<size_t>(q) * d;
  const int i = entry / d, j = entry % d;
  double acc = 0;
  for (int t0 = first; t0 < n; t0 += kChunk) {
    const int steps = min(kChunk, n - t0);
    __syncthreads();
    for (int k = threadIdx.x; k < steps * d; k += blockDim.x) {
      const int t = t0 + k / d, c = k % d;
      e[k] =
          __dsub_rn(rotated(queries + (static_cast<size_t>(t) * num_heads + q) * d, c, rot), mu[c]);
    }
    __syncthreads();
    if (entry < d * d) {
      for (int s = 0; s < steps; ++s) acc = fma(e[s * d + i], e[s * d + j], acc);
    }
  }
  if (entry < d * d) {
    out[static_cast<size_t>(q) * ld + d + entry] =
        static_cast<float>(__ddiv_rn(acc, static_cast<double>(n - first)));
  }
}

// A thread per slot of query head blockIdx.y (cache head q / group).
template <typename T>
__global__ void quadratic_kernel(const T* keys, DeviceLayerKvView v, HeadTable len, int group,
                                 const float* moments, int m_ld, double a, double b, float* out,
                                 int ld) {
  const int q = blockIdx.y, h = q / group, d = v.head_dim;
  const float* mo = moments + static_cast<size_t>(q) * m_ld;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len.v[h]; j += gridDim.x * blockDim.x) {
    const T* k = keys + (static_cast<size_t>(v.offsets[h]) + j) * d;
    double dot = 0;
    for (int i = 0; i < d; ++i)
      dot = fma(static_cast<double>(kv_load(k + i)), static_cast<double>(mo[i]), dot);
    float result;
    if (b == 0) {
      result = static_cast<float>(__dmul_rn(a, dot));
    } else {
      double quad = 0;
      for (int i = 0; i < d; ++i) {
        const float* c = mo + d + static_cast<size_t>(i) * d;
        double inner = 0;
        for (int l = 0; l < d; ++l) {
          inner = fma(static_cast<double>(c[l]), static_cast<double>(kv_load(k + l)), inner);
        }
        quad = fma(static_cast<double>(kv_load(k + i)), inner, quad);
      }
      result = static_cast<float>(fma(b, quad, __dmul_rn(a, dot)));
    }
    out[static_cast<size_t>(q) * ld + j] = result;
  }
}

// One block per row: thread 0 finds the maximum and sums the exponentials in index order (the
// CPU's sum), then every entry is divided.
__global__ void softmax_kernel(float* rows, int ld, HeadTable len, int first) {
  const int h = blockIdx.x, n = len.v[h];
  if (first >= n) return;
  float* row = rows + static_cast<size_t>(h) * ld;
  __shared__ double top, sum;
  if (threadIdx.x == 0) {
    double m = row[first];
    for (int j = first + 1; j < n; ++j) m = fmax(m, static_cast<double>(row[j]));
    double s = 0;
    for (int j = first; j < n; ++j)
      s = __dadd_rn(s, exp(__dsub_rn(static_cast<double>(row[j]), m)));
    top = m;
    sum = s;
  }
  __syncthreads();
  for (int j = first + threadIdx.x; j < n; j += blockDim.x) {
    row[j] = static_cast<float>(__ddiv_rn(exp(__dsub_rn(static_cast<double>(row[j]), top)), sum));
  }
}

// A thread per slot of query head blockIdx.y (cache head q / group): sum_o |sum_i v[i] W[o][q d +
// i]|, the CPU's order.
template <typename T, typename W>
__global__ void projected_norms_kernel(const T* values, DeviceLayerKvView v, HeadTable len,
                                       int group, const W* wo, int dim, int qd, float* out,
                                       int ld) {
  const int q = blockIdx.y, h = q / group, d = v.head_dim;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len.v[h]; j += gridDim.x * blockDim.x) {
    const T* x = values + (static_cast<size_t>(v.offsets[h]) + j) * d;
    double l1 = 0;
    for (int o = 0; o < dim; ++o) {
      const W* w = wo + static_cast<size_t>(o) * qd + static_cast<size_t>(q) * d;
      double z = 0;
      for (int i = 0; i < d; ++i) {
        z = fma(static_cast<double>(kv_load(x + i)), static_cast<double>(kv_load(w + i)), z);
      }
      l1 = __dadd_rn(l1, fabs(z));
    }
    out[static_cast<size_t>(q) * ld + j] = static_cast<float>(l1);
  }
}

__global__ void add_scalar_kernel(float* rows, int ld, HeadTable len, float value) {
  const int h = blockIdx.y;
  float* row = rows + static_cast<size_t>(h) * ld;
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < len.v[h]; s += gridDim.x * blockDim.x) {
    row[s] = __fadd_rn(row[s], value);
  }
}

}  // namespace

void CudaPolicyOps::query_moments(SlotRows& out, int out_layer, const ops::LayerStats& st,
                                  int head_dim, int first, const ops::PairRotation& rot,
                                  bool covariance) {
  CudaRows& r = device(out);
  check_rows(out, out_layer, "query_moments");
  const int d = head_dim, n = st.n_new;
  KVB_CHECK(out.heads() == st.num_heads && first >= 0 && n - first >= 1 &&
            st.pre_rope_queries != nullptr && d >= 1 && d <= kMaxHeadDim && rot.rot_dim >= 0 &&
            rot.rot_dim <= d && rot.rot_dim % 2 == 0 &&
            rot.cos.size() == static_cast<size_t>(rot.rot_dim / 2) &&
            rot.sin.size() == rot.cos.size())
      << "cuda policy ops: query_moments: " << out.heads() << " rows for " << st.num_heads
      << " query heads, queries [" << first << ", " << n << ") of " << d << " dimensions (at most "
      << kMaxHeadDim << "), rotation of " << rot.rot_dim;
  Rotation rp{};
  rp.half = rot.rot_dim / 2;
  rp.adjacent = rot.adjacent ? 1 : 0;
  for (int i = 0; i < rp.half; ++i) {
    rp.cs[i] = rot.cos[i];
    rp.cs[rp.half + i] = rot.sin[i];
  }
  const int heads = out.heads();
  const int width = covariance ? d + d * d : d;
  r.reserve(out_layer, width);
  for (int q = 0; q < heads; ++q) r.set_len(out_layer, q, width);
  if (heads == 0) return;
  double* mean = f64_scratch(static_cast<size_t>(heads) * d);
  float* o = static_cast<float*>(r.data(out_layer));
  moments_mean_kernel<<<heads, std::min(256, std::max(32, d)), 0, stream_>>>(
      st.pre_rope_queries, st.num_heads, d, first, n, rp, mean, o, r.ld(out_layer));
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
  if (!covariance) return;
  const unsigned tiles = grid_for(static_cast<size_t>(d) * d, 256);
  moments_cov_kernel<<<dim3(tiles, heads), 256, kChunk * d * sizeof(double), stream_>>>(
      st.pre_rope_queries, st.num_heads, d, first, n, rp, mean, o, r.ld(out_layer));
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::quadratic_scores(SlotRows& out, int out_layer,
                                     const kernels::KvIndex& cache_index, int layer,
                                     const SlotRows& moments, int moments_layer, int group,
                                     double a, double b) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(out);
  const CudaRows& m = device(moments);
  check_rows(out, out_layer, "quadratic_scores");
  check_rows(moments, moments_layer, "quadratic_scores");
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "quadratic_scores");
  const int heads = out.heads();
  KVB_CHECK(layer >= 0 && layer < cache.shape().num_layers && moments.heads() == heads &&
            group >= 1 && heads % group == 0 && heads / group <= cache.shape().num_kv_heads)
      << "cuda policy ops: quadratic_scores: " << heads << " rows of " << moments.heads()
      << " moments, group " << group << ", over a cache of " << cache.shape().num_kv_heads
      << " heads";
  const DeviceLayerKvView v = dev.layer(layer);
  const int d = v.head_dim;
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < heads / group; ++h) {
    len.v[h] = cache.length(layer, h);
    longest = std::max(longest, static_cast<int>(len.v[h]));
  }
  for (int q = 0; q < heads; ++q) {
    const int w = moments.length(moments_layer, q);
    KVB_CHECK(w == d + d * d || (b == 0 && w == d))
        << "cuda policy ops: quadratic_scores: query head " << q << "'s moments hold " << w
        << " entries for " << d << " dimensions";
  }
  r.reserve(out_layer, longest);
  for (int q = 0; q < heads; ++q) r.set_len(out_layer, q, len.v[q / group]);
  if (heads == 0 || longest == 0) return;
  const dim3 grid(blocks_for(longest), heads);
  const float* mo = static_cast<const float*>(m.data(moments_layer));
  float* o = static_cast<float*>(r.data(out_layer));
  if (v.dtype == KvDtype::kBf16) {
    quadratic_kernel<<<grid, 128, 0, stream_>>>(static_cast<const __nv_bfloat16*>(v.keys), v, len,
                                                group, mo, m.ld(moments_layer), a, b, o,
                                                r.ld(out_layer));
  } else {
    quadratic_kernel<<<grid, 128, 0, stream_>>>(static_cast<const float*>(v.keys), v, len, group,
                                                mo, m.ld(moments_layer), a, b, o, r.ld(out_layer));
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::softmax(SlotRows& rows, int layer, int first) {
  CudaRows& r = device(rows);
  check_rows(rows, layer, "softmax");
  KVB_CHECK(first >= 0) << "cuda policy ops: softmax from entry " << first;
  HeadTable len{};
  const int longest = row_lengths(rows, layer, &len);
  if (longest <= first) return;
  softmax_kernel<<<rows.heads(), 256, 0, stream_>>>(static_cast<float*>(r.data(layer)), r.ld(layer),
                                                    len, first);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::projected_value_norms(SlotRows& out, int out_layer,
                                          const kernels::KvIndex& cache_index, int layer,
                                          const void* wo, bool wo_bf16, int dim, int group) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(out);
  check_rows(out, out_layer, "projected_value_norms");
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "projected_value_norms");
  const int heads = out.heads();
  KVB_CHECK(layer >= 0 && layer < cache.shape().num_layers && wo != nullptr && dim >= 1 &&
            group >= 1 && heads % group == 0 && heads / group <= cache.shape().num_kv_heads)
      << "cuda policy ops: projected_value_norms: " << heads << " rows, group " << group
      << ", an output projection of " << dim << " rows, over a cache of "
      << cache.shape().num_kv_heads << " heads";
  const DeviceLayerKvView v = dev.layer(layer);
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < heads / group; ++h) {
    len.v[h] = cache.length(layer, h);
    longest = std::max(longest, static_cast<int>(len.v[h]));
  }
  r.reserve(out_layer, longest);
  for (int q = 0; q < heads; ++q) r.set_len(out_layer, q, len.v[q / group]);
  if (heads == 0 || longest == 0) return;
  const dim3 grid(blocks_for(longest), heads);
  const int qd = heads * v.head_dim;
  float* o = static_cast<float*>(r.data(out_layer));
  const int ld = r.ld(out_layer);
  auto launch = [&](auto* values) {
    if (wo_bf16) {
      projected_norms_kernel<<<grid, 128, 0, stream_>>>(
          values, v, len, group, static_cast<const __nv_bfloat16*>(wo), dim, qd, o, ld);
    } else {
      projected_norms_kernel<<<grid, 128, 0, stream_>>>(
          values, v, len, group, static_cast<const float*>(wo), dim, qd, o, ld);
    }
  };
  if (v.dtype == KvDtype::kBf16) {
    launch(static_cast<const __nv_bfloat16*>(v.values));
  } else {
    launch(static_cast<const float*>(v.values));
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

void CudaPolicyOps::add_scalar(SlotRows& rows, int layer, float value) {
  CudaRows& r = device(rows);
  check_rows(rows, layer, "add_scalar");
  HeadTable len{};
  const int longest = row_lengths(rows, layer, &len);
  if (longest == 0) return;
  add_scalar_kernel<<<dim3(blocks_for(longest), rows.heads()), 256, 0, stream_>>>(
      static_cast<float*>(r.data(layer)), r.ld(layer), len, value);
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

}  // namespace kvb::kernels::cuda
