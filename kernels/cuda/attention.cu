// Causal GQA attention over the ragged device cache (prefill: flash-style tiling with an online
// softmax; decode: split-K), with the CPU op's statistics. Layout: kv_cache_device.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode_grouped.h"
#include "kernels/cuda/attention_decode_mma.h"
#include "kernels/cuda/attention_decode_stream.h"
#include "kernels/cuda/attention_prefill_mma.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/warp.cuh"

namespace kvb::kernels::cuda {
namespace {

using attn::Common;
using attn::first_visible;
using attn::kThreads;
using attn::kWarps;
constexpr unsigned kFull = kFullMask;
constexpr int kLaneDims = kMaxHeadDim / 32;  // output columns per lane: lane + 32 e
constexpr int kKeyTile = 32;                 // keys per shared-memory tile (one per lane)
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;  // (query, head) rows per prefill block
constexpr int kDecodeChunk = 256;                     // keys per decode block

// The prefill score: sequential FMA over d, then the scale without contraction, so the main and
// the statistics pass compute the same bits for the same (query, key).
__device__ __forceinline__ float tile_score(const float* q, const float* k, int d, float scale) {
  float s = 0.0f;
  for (int x = 0; x < d; ++x) s = fmaf(q[x], k[x], s);
  return __fmul_rn(s, scale);
}


// ---- prefill -------------------------------------------------------------------------------

// Grid (ceil(n * group / 16), num_kv_heads). Row r of a KV head is query r / group of head
// kvh * group + r % group. row_stats: [num_heads, n] (max, sum) for the statistics pass.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    prefill_kernel(Common c, const T* keys, const T* values, float* out, float2* row_stats) {
  extern __shared__ float smem[];
  const int d = c.d, ks_stride = d + 1;   // padded: lane j reads key row j conflict-free
  float* ks = smem;                       // [kKeyTile, d + 1]
  float* vs = ks + kKeyTile * ks_stride;  // [kKeyTile, d]
  float* qs = vs + kKeyTile * d;          // [kRowsPerBlock, d]
  const int kvh = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int len = c.lengths[kvh], before = len - c.n;
  const size_t base = c.offsets[kvh];
  const int rows_total = c.n * c.group, r0 = blockIdx.x * kRowsPerBlock;
  for (int e = threadIdx.x; e < kRowsPerBlock * d; e += kThreads) {
    const int r = r0 + e / d;
    const int h = kvh * c.group + r % c.group;
    qs[e] = r < rows_total ? c.q[(static_cast<size_t>(r / c.group) * c.num_heads + h) * d + e % d]
                           : 0.0f;
  }
  const int last_row = min(r0 + kRowsPerBlock, rows_total) - 1;
  const int keys_end = before + last_row / c.group + 1;  // keys the block's last query sees
  // The block's first query sees the earliest keys; with a window, tiles before its window are
  // skipped (kept aligned to kKeyTile).
  const int keys_begin = first_visible(c, before + r0 / c.group + 1) / kKeyTile * kKeyTile;
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kLaneDims];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int e = 0; e < kLaneDims; ++e) acc[rr][e] = 0.0f;
  }
  for (int t0 = keys_begin; t0 < keys_end; t0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (first time: q is loaded)
    const int tile = min(kKeyTile, keys_end - t0);
    for (int e = threadIdx.x; e < kKeyTile * d; e += kThreads) {
      const int j = e / d, x = e % d;
      float kx = 0.0f, vx = 0.0f;
      if (j < tile) {
        const size_t at = (base + t0 + j) * d + x;
        kx = kv_load(keys + at);
        vx = kv_load(values + at);
      }
      ks[j * ks_stride + x] = kx;
      vs[j * d + x] = vx;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = r0 + warp * kRowsPerWarp + rr;
      if (r >= rows_total) break;  // warp-uniform
      const int visible = before + r / c.group + 1;
      if (t0 >= visible) continue;  // warp-uniform: the whole tile is in this row's future
      const int lo = first_visible(c, visible);
      if (t0 + kKeyTile <= lo) continue;  // warp-uniform: the whole tile is before the window
      const int key = t0 + lane;
      const bool seen = key < visible && key >= lo;
      const float s =
          seen ? tile_score(qs + (warp * kRowsPerWarp + rr) * d, ks + lane * ks_stride, d, c.scale)
               : -INFINITY;
      // Finite: the tile holds a key in [lo, visible) (it starts before `visible` and ends after
      // `lo`), so some lane has seen it.
      const float m_new = fmaxf(m[rr], warp_max(s));
      const float corr = expf(m[rr] - m_new);         // 0 on the first tile
      const float p = seen ? expf(s - m_new) : 0.0f;
      l[rr] = l[rr] * corr + warp_sum(p);
#pragma unroll
      for (int e = 0; e < kLaneDims; ++e) acc[rr][e] *= corr;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(kFull, p, j);
#pragma unroll
        for (int e = 0; e < kLaneDims; ++e) {
          const int x = lane + 32 * e;
          if (x < d) acc[rr][e] = fmaf(pj, vs[j * d + x], acc[rr][e]);
        }
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = r0 + warp * kRowsPerWarp + rr;
    if (r >= rows_total) break;
    const int i = r / c.group, h = kvh * c.group + r % c.group;
    const float inv = 1.0f / l[rr];
    float* o = out + (static_cast<size_t>(i) * c.num_heads + h) * d;
#pragma unroll
    for (int e = 0; e < kLaneDims; ++e) {
      const int x = lane + 32 * e;
      if (x < d) o[x] = acc[rr][e] * inv;
    }
    if (row_stats != nullptr && lane == 0) {
      row_stats[static_cast<size_t>(h) * c.n + i] = make_float2(m[rr], l[rr]);
    }
  }
}

// Grid (ceil(max_len / 32), num_heads): one 32-key tile of one query head; warps take queries
// i = warp, warp + 4, ...; p = exp(s - m_i) / l_i with the first pass's (m_i, l_i). Column sums:
// per warp in query order, then the 4 warps in order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    prefill_stats_kernel(Common c, const T* keys, const float2* row_stats, float* col_sums,
                         float* last_probs, int last_w, int stride) {
  extern __shared__ float smem[];
  const int d = c.d, ks_stride = d + 1;
  float* ks = smem;                       // [kKeyTile, d + 1]
  float* qw = ks + kKeyTile * ks_stride;  // [kWarps, d]
  __shared__ float part[kWarps][32];
  const int h = blockIdx.y, kvh = h / c.group, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int len = c.lengths[kvh], before = len - c.n, t0 = blockIdx.x * kKeyTile;
  if (t0 >= len) return;  // block-uniform
  const size_t base = c.offsets[kvh];
  for (int e = threadIdx.x; e < kKeyTile * d; e += kThreads) {
    const int j = e / d, x = e % d;
    ks[j * ks_stride + x] = t0 + j < len ? kv_load(keys + (base + t0 + j) * d + x) : 0.0f;
  }
  __syncthreads();
  const int key = t0 + lane;
  float csum = 0.0f;
  const int first = col_sums != nullptr ? 0 : c.n - last_w;
  float* q_row = qw + warp * d;
  for (int i = first + warp; i < c.n; i += kWarps) {
    const int visible = before + i + 1;
    if (t0 >= visible) continue;  // warp-uniform
    __syncwarp();
    for (int x = lane; x < d; x += 32)
      q_row[x] = c.q[(static_cast<size_t>(i) * c.num_heads + h) * d + x];
    __syncwarp();
    if (key >= visible) continue;
    const float2 st = row_stats[static_cast<size_t>(h) * c.n + i];
    const float p = expf(tile_score(q_row, ks + lane * ks_stride, d, c.scale) - st.x) / st.y;
    csum += p;
    const int w = i - (c.n - last_w);
    if (last_probs != nullptr && w >= 0) {
      last_probs[(static_cast<size_t>(h) * last_w + w) * stride + key] = p;
    }
  }
  part[warp][lane] = csum;
  __syncthreads();
  if (col_sums != nullptr && warp == 0 && key < len) {
    float total = part[0][lane];
    for (int w = 1; w < kWarps; ++w) total += part[w][lane];
    col_sums[static_cast<size_t>(h) * stride + key] = total;
  }
}

// ---- decode (n == 1) -----------------------------------------------------------------------

// Grid (num_heads, splits): keys [split * 256, +256) of one query head; a warp takes keys
// warp, warp + 4, ... and reads each key row coalesced (lane x, x + 32, ...). Writes the chunk's
// softmax state to part_ml [num_heads, splits] and part_acc [num_heads, splits, d]; raw scaled
// scores to scores[h * stride + key] when scores != nullptr.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_partial_kernel(Common c, const T* keys, const T* values, float2* part_ml,
                          float* part_acc, float* scores, int stride) {
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ float wacc[kWarps][kMaxHeadDim];
  const int h = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int kvh = h / c.group, warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = c.d;
  const int len = c.lengths[kvh];
  const int c0 = max(split * kDecodeChunk, first_visible(c, len));
  const int c1 = min(len, split * kDecodeChunk + kDecodeChunk);
  const size_t base = c.offsets[kvh];
  float qreg[kLaneDims], acc[kLaneDims];
#pragma unroll
  for (int e = 0; e < kLaneDims; ++e) {
    const int x = lane + 32 * e;
    qreg[e] = x < d ? c.q[static_cast<size_t>(h) * d + x] : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
#pragma unroll 2
  for (int key = c0 + warp; key < c1; key += kWarps) {
    const T* krow = keys + (base + key) * d;
    const T* vrow = values + (base + key) * d;
    float partial = 0.0f, v[kLaneDims];
#pragma unroll
    for (int e = 0; e < kLaneDims; ++e) {
      const int x = lane + 32 * e;
      v[e] = x < d ? kv_load(vrow + x) : 0.0f;
      if (x < d) partial = fmaf(qreg[e], kv_load(krow + x), partial);
    }
    const float s = __fmul_rn(warp_sum(partial), c.scale);
    if (scores != nullptr && lane == 0) scores[static_cast<size_t>(h) * stride + key] = s;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int e = 0; e < kLaneDims; ++e) acc[e] = fmaf(p, v[e], acc[e] * corr);
    m = m_new;
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kLaneDims; ++e) {
    const int x = lane + 32 * e;
    if (x < d) wacc[warp][x] = acc[e];
  }
  __syncthreads();
  float mb = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mb = fmaxf(mb, wm[w]);
  const size_t at = static_cast<size_t>(h) * splits + split;
  float scale_w[kWarps];
  float lb = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    scale_w[w] = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - mb);  // an idle warp adds nothing
    lb += wl[w] * scale_w[w];
  }
  if (threadIdx.x == 0) part_ml[at] = make_float2(mb, lb);
  for (int x = threadIdx.x; x < d; x += kThreads) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) a += wacc[w][x] * scale_w[w];
    part_acc[at * d + x] = a;
  }
}

// Grid num_heads: merges the chunk states in chunk order; row_stats[h] = (max, sum).
__global__ void decode_combine_kernel(const float2* part_ml, const float* part_acc, int splits,
                                      int d, float* out, float2* row_stats) {
  const int h = blockIdx.x;
  const float2* ml = part_ml + static_cast<size_t>(h) * splits;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ml[s].x);
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) {
    if (ml[s].x != -INFINITY) sum += ml[s].y * expf(ml[s].x - mx);
  }
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (ml[s].x != -INFINITY) {
        a += part_acc[(static_cast<size_t>(h) * splits + s) * d + x] * expf(ml[s].x - mx);
      }
    }
    out[static_cast<size_t>(h) * d + x] = a / sum;
  }
  if (threadIdx.x == 0 && row_stats != nullptr) row_stats[h] = make_float2(mx, sum);
}

// Grid (ceil(max_len / 256), num_heads): raw scores (in `scores`) to probabilities, written to
// col_sums and/or last_probs (for n == 1 both are the one row of probabilities).
__global__ void decode_probs_kernel(const int32_t* lengths, int group, const float2* row_stats,
                                    const float* scores, float* col_sums, float* last_probs,
                                    int stride) {
  const int h = blockIdx.y, key = blockIdx.x * blockDim.x + threadIdx.x;
  if (key >= lengths[h / group]) return;
  const float2 st = row_stats[h];
  const size_t at = static_cast<size_t>(h) * stride + key;
  const float p = expf(scores[at] - st.x) / st.y;
  if (col_sums != nullptr) col_sums[at] = p;
  if (last_probs != nullptr) last_probs[at] = p;
}

template <typename T>
void launch(const AttentionArgs& a, int group, int max_len, cudaStream_t stream) {
  const int d = a.kv.head_dim;
  const Common c{a.q, a.kv.offsets, a.kv.lengths, a.n, a.num_heads, group, d, a.scale, a.window};
  const T* keys = static_cast<const T*>(a.kv.keys);
  const T* values = static_cast<const T*>(a.kv.values);
  const bool stats = a.col_sums != nullptr || a.last_probs != nullptr;
  StreamScratch row_stats(stats ? sizeof(float2) * a.num_heads * a.n : 0, stream);
  float2* rs = stats ? row_stats.as<float2>() : nullptr;
  if (a.n == 1) {
    // Raw scores go to the statistics row itself and are normalized in place afterwards.
    float* scores = a.col_sums != nullptr ? a.col_sums : a.last_probs;
    const DecodeMmaPlan mp = a.decode_kernel == kDecodeTensorCore && !stats
                                 ? plan_decode_mma(a.kv, group, max_len, a.decode_blocks)
                                 : DecodeMmaPlan{};
    const DecodeStreamPlan sp = mp.splits == 0 && a.decode_kernel != kDecodeGrouped
                                    ? plan_decode_stream(a.kv, group, max_len, a.decode_blocks)
                                    : DecodeStreamPlan{};
    const GroupedPlan gp =
        sp.splits > 0 ? GroupedPlan{}
                      : plan_grouped(a.kv.dtype, d, group, a.kv.num_kv_heads, max_len, a.kv.keys,
                                        a.kv.values, a.decode_rows, a.decode_blocks);
    const int splits = mp.splits > 0   ? mp.splits
                       : sp.splits > 0 ? sp.splits
                       : gp.lanes > 0  ? gp.splits
                                       : std::max(1, (max_len + kDecodeChunk - 1) / kDecodeChunk);
    StreamScratch ml(sizeof(float2) * a.num_heads * splits, stream);
    StreamScratch acc(sizeof(float) * a.num_heads * splits * d, stream);
    if (mp.splits > 0) {
      decode_mma(a, group, mp, ml.as<float2>(), acc.as<float>(), stream);
    } else if (sp.splits > 0) {
      decode_stream(a, group, sp, ml.as<float2>(), acc.as<float>(), scores, a.stats_stride,
                    stream);
    } else if (gp.lanes > 0) {
      launch_grouped(c, a.kv.dtype, keys, values, a.kv.num_kv_heads, gp, ml.as<float2>(), acc.as<float>(),
                        scores, a.stats_stride, stream);
    } else {
      decode_partial_kernel<T><<<dim3(a.num_heads, splits), kThreads, 0, stream>>>(
          c, keys, values, ml.as<float2>(), acc.as<float>(), scores, a.stats_stride);
      KVB_CUDA_CHECK_LAUNCH();
    }
    decode_combine_kernel<<<a.num_heads, kThreads, 0, stream>>>(ml.as<float2>(), acc.as<float>(),
                                                                splits, d, a.out, rs);
    KVB_CUDA_CHECK_LAUNCH();
    if (stats) {
      decode_probs_kernel<<<dim3((max_len + 255) / 256, a.num_heads), 256, 0, stream>>>(
          a.kv.lengths, group, rs, scores, a.col_sums, a.last_probs, a.stats_stride);
      KVB_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (a.tensor_core_prefill && prefill_mma_supported(a.kv)) {
      prefill_mma(a, group, max_len, rs, stream);
      return;
    }
  }
  const size_t smem = sizeof(float) * (kKeyTile * (d + 1) + kKeyTile * d + kRowsPerBlock * d);
  if (smem > 48 * 1024) {
    KVB_CUDA_CHECK(cudaFuncSetAttribute(
        prefill_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  const int blocks = (a.n * group + kRowsPerBlock - 1) / kRowsPerBlock;
  prefill_kernel<T>
      <<<dim3(blocks, a.kv.num_kv_heads), kThreads, smem, stream>>>(c, keys, values, a.out, rs);
  KVB_CUDA_CHECK_LAUNCH();
  if (!stats) return;
  const size_t stats_smem = sizeof(float) * (kKeyTile * (d + 1) + kWarps * d);
  prefill_stats_kernel<T>
      <<<dim3((max_len + kKeyTile - 1) / kKeyTile, a.num_heads), kThreads, stats_smem, stream>>>(
          c, keys, rs, a.col_sums, a.last_probs, a.last_probs ? a.last_w : 0, a.stats_stride);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention(const AttentionArgs& a, cudaStream_t stream) {
  const DeviceLayerKvView& kv = a.kv;
  KVB_CHECK(kv.num_kv_heads > 0 && a.num_heads > 0 && a.num_heads % kv.num_kv_heads == 0)
      << "cuda::attention: num_heads " << a.num_heads << " not a positive multiple of "
      << "num_kv_heads " << kv.num_kv_heads;
  KVB_CHECK(kv.head_dim >= 1 && kv.head_dim <= kMaxHeadDim)
      << "cuda::attention: head_dim " << kv.head_dim << " outside [1, " << kMaxHeadDim << "]";
  KVB_CHECK(a.n >= 0) << "cuda::attention: n = " << a.n;
  KVB_CHECK(kv.host_lengths != nullptr && kv.lengths != nullptr && kv.offsets != nullptr)
      << "cuda::attention: the view has no lengths/offsets";
  const int group = a.num_heads / kv.num_kv_heads;
  int max_len = 0;
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    KVB_CHECK(kv.host_lengths[h] >= a.n)
        << "cuda::attention: head " << h << " holds " << kv.host_lengths[h]
        << " slots, fewer than the " << a.n << " queries";
    max_len = std::max(max_len, static_cast<int>(kv.host_lengths[h]));
  }
  // Every check before the first CUDA call: a bad call changes nothing.
  const bool stats = a.col_sums != nullptr || a.last_probs != nullptr;
  if (stats) {
    KVB_CHECK(a.stats_stride >= max_len)
        << "cuda::attention: stats_stride " << a.stats_stride << " < longest head " << max_len;
  }
  KVB_CHECK(a.window >= 0) << "cuda::attention: window " << a.window;
  KVB_CHECK(a.decode_rows == 0 || a.decode_rows == 1 || a.decode_rows == 2 || a.decode_rows == 4)
      << "cuda::attention: decode_rows " << a.decode_rows << " not 0, 1, 2 or 4";
  KVB_CHECK(a.decode_kernel == kDecodeDefault || a.decode_kernel == kDecodeGrouped ||
            a.decode_kernel == kDecodeStreamed || a.decode_kernel == kDecodeTensorCore)
      << "cuda::attention: decode_kernel " << a.decode_kernel << " not " << kDecodeDefault
      << " (default), " << kDecodeGrouped << " (grouped), " << kDecodeStreamed << " (streamed) or "
      << kDecodeTensorCore << " (tensor cores)";
  KVB_CHECK(a.decode_blocks >= 0 && a.decode_blocks <= kMaxDecodeBlocks)
      << "cuda::attention: decode_blocks " << a.decode_blocks << " outside [0, " << kMaxDecodeBlocks
      << "]";
  KVB_CHECK(a.window == 0 || !stats) << "cuda::attention: no statistics with a window";
  if (a.last_probs) {
    KVB_CHECK(a.last_w >= 1 && a.last_w <= a.n)
        << "cuda::attention: last_w " << a.last_w << " outside [1, " << a.n << "]";
  }
  if (a.n > 0) {
    KVB_CHECK(a.out != nullptr && a.q != nullptr && kv.keys != nullptr && kv.values != nullptr)
        << "cuda::attention: null pointer";
    KVB_CHECK(std::isfinite(a.scale)) << "cuda::attention: scale " << a.scale;
  }
  const size_t rows = static_cast<size_t>(a.num_heads) * a.stats_stride;
  if (a.col_sums) KVB_CUDA_CHECK(cudaMemsetAsync(a.col_sums, 0, rows * sizeof(float), stream));
  if (a.last_probs) {
    KVB_CUDA_CHECK(cudaMemsetAsync(a.last_probs, 0, rows * a.last_w * sizeof(float), stream));
  }
  if (a.n == 0) return;
  if (kv.dtype == KvDtype::kF32) {
    launch<float>(a, group, max_len, stream);
  } else {
    launch<__nv_bfloat16>(a, group, max_len, stream);
  }
}

}  // namespace kvb::kernels::cuda
