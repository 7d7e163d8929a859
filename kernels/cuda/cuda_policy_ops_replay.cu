// CudaPolicyOps' replay_attention_max (policy_ops.h; kvpress KVzipPress, POLICIES.md `kvzip`).
// Every logit is the CPU instance's f32 fused multiply-add chain in index order divided by
// sqrtf(head_dim), every row's normaliser the CPU's 8-lane f64 sum of expf, so the entries
// are the CPU's bits except where the device's expf differs from glibc's in the last bit. The
// pass's queries (host rows) are the one upload, counted in transfers(); nothing waits.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

using ops::SlotRows;
using ops::SlotType;
using ops_detail::CudaRows;
using ops_detail::device;

constexpr int kThreads = 128;

// The slots a query of the pass reads, in the CPU's order: the sinks, the chunk, the pass's own
// keys up to the query (causal).
struct ReplayKeys {
  int sinks, first, count, block;  // block: the head's first slot of the pass
  __device__ int slot(int j) const {
    return j < sinks ? j : j < sinks + count ? first + j - sinks : block + j - sinks - count;
  }
};

template <typename T>
__device__ float logit(const float* y, const T* k, int d, float div) {
  float acc = 0.0f;
  for (int i = 0; i < d; ++i) acc = __fmaf_rn(y[i], kv_load(k + i), acc);
  return __fdiv_rn(acc, div);
}

// A thread per (query t, query head blockIdx.y): its row's maximum logit and the f64 sum of
// expf(logit - maximum) in slot order.
template <typename T>
__global__ void replay_rows_kernel(const float* y, const T* keys, DeviceLayerKvView v,
                                   HeadTable len, int m, int heads, int group, int sinks,
                                   int first, int count, float div, float* maxes, double* sums) {
  const int q = blockIdx.y, h = q / group, d = v.head_dim;
  const T* base = keys + static_cast<size_t>(v.offsets[h]) * d;
  const ReplayKeys rk{sinks, first, count, len.v[h] - m};
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < m; t += gridDim.x * blockDim.x) {
    const float* yt = y + (static_cast<size_t>(t) * heads + q) * d;
    const int real = sinks + count + t + 1;
    float mx = logit(yt, base + static_cast<size_t>(rk.slot(0)) * d, d, div);
    for (int j = 1; j < real; ++j) {
      mx = fmaxf(mx, logit(yt, base + static_cast<size_t>(rk.slot(j)) * d, d, div));
    }
    // The CPU's 8 lanes: lane k sums the keys j = k mod 8 in order, then the lanes pairwise.
    double lane[8] = {};
    for (int j = 0; j < real; ++j) {
      const float l = logit(yt, base + static_cast<size_t>(rk.slot(j)) * d, d, div);
      lane[j % 8] = __dadd_rn(lane[j % 8], static_cast<double>(expf(__fsub_rn(l, mx))));
    }
    const double s = __dadd_rn(__dadd_rn(__dadd_rn(lane[0], lane[1]), __dadd_rn(lane[2], lane[3])),
                               __dadd_rn(__dadd_rn(lane[4], lane[5]), __dadd_rn(lane[6], lane[7])));
    maxes[static_cast<size_t>(q) * m + t] = mx;
    sums[static_cast<size_t>(q) * m + t] = s;
  }
}

// A thread per (chunk slot j, KV head blockIdx.y): the largest probability any query of the
// group gives it, from 0.
template <typename T>
__global__ void replay_columns_kernel(const float* y, const T* keys, DeviceLayerKvView v, int m,
                                      int heads, int group, int first, int count, float div,
                                      const float* maxes, const double* sums, float* out, int ld) {
  const int h = blockIdx.y, d = v.head_dim;
  const T* base = keys + static_cast<size_t>(v.offsets[h]) * d;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < count; j += gridDim.x * blockDim.x) {
    const T* k = base + static_cast<size_t>(first + j) * d;
    float best = 0.0f;
    for (int g = 0; g < group; ++g) {
      const int q = h * group + g;
      for (int t = 0; t < m; ++t) {
        const float* yt = y + (static_cast<size_t>(t) * heads + q) * d;
        const size_t at = static_cast<size_t>(q) * m + t;
        const float e = expf(__fsub_rn(logit(yt, k, d, div), maxes[at]));
        best = fmaxf(best, static_cast<float>(__ddiv_rn(static_cast<double>(e), sums[at])));
      }
    }
    out[static_cast<size_t>(h) * ld + j] = best;
  }
}

// The two kernels over keys of type T: row statistics, then the chunk's column maxima.
template <typename T>
void launch_replay(const T* keys, const float* y, const DeviceLayerKvView& v, HeadTable len,
                   int m, int heads, int group, int sinks, int first, int count, float div,
                   float* maxes, double* sums, float* out, int ld, cudaStream_t stream) {
  const int kv = heads / group;
  const dim3 rows_grid(std::min(64u, grid_for(static_cast<size_t>(m), kThreads)), heads);
  const dim3 cols_grid(std::min(64u, grid_for(static_cast<size_t>(count), kThreads)), kv);
  replay_rows_kernel<<<rows_grid, kThreads, 0, stream>>>(y, keys, v, len, m, heads, group, sinks,
                                                         first, count, div, maxes, sums);
  KVB_CUDA_CHECK_LAUNCH();
  replay_columns_kernel<<<cols_grid, kThreads, 0, stream>>>(y, keys, v, m, heads, group, first,
                                                            count, div, maxes, sums, out, ld);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaPolicyOps::replay_attention_max(SlotRows& out, int out_layer,
                                         const kernels::KvIndex& cache_index, int layer,
                                         const ops::LayerStats& st, int sinks, int first,
                                         int count) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CudaRows& r = device(out);
  KVB_CHECK(out_layer >= 0 && out_layer < out.layers() && out.type() == SlotType::kF32)
      << "cuda policy ops: replay_attention_max on layer " << out_layer << " of rows for "
      << out.layers() << " layers";
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "replay_attention_max");
  const int heads = out.heads(), kv = cache.shape().num_kv_heads, m = st.n_queries;
  KVB_USAGE_CHECK(st.num_heads <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " heads per layer; this model "
      << "has " << st.num_heads << " query heads";
  KVB_CHECK(layer >= 0 && layer < cache.shape().num_layers && heads == kv &&
            st.num_heads % kv == 0 && st.last_queries != nullptr && m >= 1 && sinks >= 0 &&
            sinks <= first && count >= 0)
      << "cuda policy ops: replay_attention_max: " << heads << " rows over a cache of " << kv
      << " heads, " << st.num_heads << " query heads, " << m << " queries, sinks " << sinks
      << ", slots [" << first << ", " << first + count << ")";
  HeadTable len{};
  for (int h = 0; h < kv; ++h) {
    len.v[h] = dev.length(layer, h);
    KVB_CHECK(first + count <= len.v[h] - m)
        << "cuda policy ops: replay_attention_max: head " << h << " holds " << len.v[h]
        << " slots: the chunk [" << first << ", " << first + count << ") and the block's " << m
        << " keys overlap";
  }
  r.reserve(out_layer, count);
  for (int h = 0; h < heads; ++h) r.set_len(out_layer, h, count);
  if (count == 0) return;
  const DeviceLayerKvView v = dev.layer(layer);
  const int d = v.head_dim, group = st.num_heads / kv;
  // Scratch: the rows' f64 sums [q heads, m], then as floats the queries [m, q heads, d] and the
  // rows' maxima [q heads, m].
  const size_t rows_n = static_cast<size_t>(st.num_heads) * m;
  const size_t q_n = static_cast<size_t>(m) * st.num_heads * d;
  double* sums = f64_scratch(rows_n + (q_n + rows_n + 1) / 2);
  float* y = reinterpret_cast<float*>(sums + rows_n);
  float* maxes = y + q_n;
  upload_async(y, st.last_queries, q_n * sizeof(float), stream_);
  ++transfers_.h2d_copies;
  transfers_.h2d_bytes += q_n * sizeof(float);
  const float div = std::sqrt(static_cast<float>(d));
  float* o = static_cast<float*>(r.data(out_layer));
  if (v.dtype == KvDtype::kBf16) {
    launch_replay(static_cast<const __nv_bfloat16*>(v.keys), y, v, len, m, st.num_heads, group,
                  sinks, first, count, div, maxes, sums, o, r.ld(out_layer), stream_);
  } else {
    launch_replay(static_cast<const float*>(v.keys), y, v, len, m, st.num_heads, group, sinks,
                  first, count, div, maxes, sums, o, r.ld(out_layer), stream_);
  }
  launches_ += 2;
}

}  // namespace kvb::kernels::cuda
