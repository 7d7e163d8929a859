// Causal GQA attention over the ragged device cache (prefill: flash-style tiling with an online
// softmax; decode: split-K), with the CPU op's statistics. Layout: kv_cache_device.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode_grouped.h"
#include "kernels/cuda/attention_decode_mma.h"
#include "kernels/cuda/attention_decode_seq.h"
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

// Grid (num_heads, sequences): merges sequence blockIdx.y's chunk states in chunk order;
// row_stats[h] = (max, sum) where the sequence asked for statistics.
__global__ void decode_combine_kernel(DecodeSeqs p, int d) {
  const DecodeSeq seq = p.s[blockIdx.y];
  const int h = blockIdx.x, splits = seq.splits;
  const float2* ml = seq.part_ml + static_cast<size_t>(h) * splits;
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
        a += seq.part_acc[(static_cast<size_t>(h) * splits + s) * d + x] * expf(ml[s].x - mx);
      }
    }
    seq.out[static_cast<size_t>(h) * d + x] = a / sum;
  }
  if (threadIdx.x == 0 && seq.row_stats != nullptr) seq.row_stats[h] = make_float2(mx, sum);
}

// Grid (ceil(the longest stride / 256), num_heads, sequences): sequence blockIdx.z's raw scores
// (in `scores`, one of its statistics rows) to probabilities, written to col_sums and/or
// last_probs (for n == 1 both are the one row of probabilities); entries past the head's keys,
// up to the stride, are 0. Sequences without statistics (row_stats null) have nothing to do.
__global__ void decode_probs_kernel(DecodeSeqs p, int group) {
  const DecodeSeq seq = p.s[blockIdx.z];
  const int h = blockIdx.y, key = blockIdx.x * blockDim.x + threadIdx.x;
  if (seq.row_stats == nullptr || key >= seq.stride) return;
  const size_t at = static_cast<size_t>(h) * seq.stride + key;
  float pr = 0.0f;
  if (key < seq.lengths[h / group]) {
    const float2 st = seq.row_stats[h];
    pr = expf(seq.scores[at] - st.x) / st.y;
  }
  if (seq.col_sums != nullptr) seq.col_sums[at] = pr;
  if (seq.last_probs != nullptr) seq.last_probs[at] = pr;
}

// ---- the decode driver: one or several sequences ----------------------------------------------

enum class DecodePath { kTensor, kStreamed, kGrouped, kPerHead };

struct DecodeChoice {
  DecodePath path = DecodePath::kPerHead;
  DecodeStreamPlan plan;  // kTensor (a DecodeMmaPlan is one) and kStreamed
  GroupedPlan grouped;    // kGrouped
  int splits = 0;
};

// The partial kernel a decode step runs (AttentionArgs::decode_kernel's rule) and its plan.
DecodeChoice choose_decode(const AttentionArgs& a, int group, int max_len) {
  const bool stats = a.col_sums != nullptr || a.last_probs != nullptr;
  DecodeChoice c;
  if (a.decode_kernel == kDecodeTensorCore && !stats) {
    c.plan = plan_decode_mma(a.kv, group, max_len, a.decode_blocks);
    if (c.plan.splits > 0) {
      c.path = DecodePath::kTensor;
      c.splits = c.plan.splits;
      return c;
    }
  }
  if (a.decode_kernel != kDecodeGrouped) {
    c.plan = plan_decode_stream(a.kv, group, max_len, a.decode_blocks);
    if (c.plan.splits > 0) {
      c.path = DecodePath::kStreamed;
      c.splits = c.plan.splits;
      return c;
    }
  }
  c.plan = DecodeStreamPlan{};
  c.grouped = plan_grouped(a.kv.dtype, a.kv.head_dim, group, a.kv.num_kv_heads, max_len, a.kv.keys,
                           a.kv.values, a.decode_rows, a.decode_blocks);
  if (c.grouped.lanes > 0) {
    c.path = DecodePath::kGrouped;
    c.splits = c.grouped.splits;
  } else {
    c.path = DecodePath::kPerHead;
    c.splits = std::max(1, (max_len + kDecodeChunk - 1) / kDecodeChunk);
  }
  return c;
}

// Decode steps (n == 1) of seqs.size() sequences that share the shape of seqs[0] (validated):
// each one's partial pass on its own kernel and plan, the streamed and tensor-core ones up to
// kMaxDecodeSeqs sequences a launch; then one combine launch and, where any asked, one
// probabilities launch per kMaxDecodeSeqs sequences. Every sequence gets the bits its own call
// would. Returns the kernel launches.
int decode(std::span<const AttentionArgs> seqs, std::span<const int> max_lens, int group,
           cudaStream_t stream) {
  const int count = static_cast<int>(seqs.size());
  const AttentionArgs& a0 = seqs[0];
  const int d = a0.kv.head_dim, nh = a0.num_heads;
  std::vector<DecodeChoice> choice(count);
  size_t parts = 0, stat_rows = 0;
  for (int b = 0; b < count; ++b) {
    choice[b] = choose_decode(seqs[b], group, max_lens[b]);
    parts += static_cast<size_t>(nh) * choice[b].splits;
    if (seqs[b].col_sums != nullptr || seqs[b].last_probs != nullptr) stat_rows += nh;
  }
  // One allocation for the partial states and the combined row statistics (each a stream-ordered
  // cudaMallocAsync / cudaFreeAsync pair: one per call, not three).
  // The output partials start 256-byte aligned, as an allocation of their own would.
  const size_t acc_at = (sizeof(float2) * (parts + stat_rows) + 255) / 256 * 256;
  StreamScratch scratch(acc_at + sizeof(float) * parts * d, stream);
  float2* const ml = scratch.as<float2>();
  float2* const row_stats = ml + parts;
  float* const acc = reinterpret_cast<float*>(scratch.as<unsigned char>() + acc_at);
  std::vector<DecodeSeq> all(count);
  size_t part_at = 0, stat_at = 0;
  for (int b = 0; b < count; ++b) {
    const AttentionArgs& a = seqs[b];
    DecodeSeq& q = all[b];
    q.q = a.q;
    q.out = a.out;
    q.keys = a.kv.keys;
    q.values = a.kv.values;
    q.offsets = a.kv.offsets;
    q.lengths = a.kv.lengths;
    q.part_ml = ml + part_at;
    q.part_acc = acc + part_at * d;
    part_at += static_cast<size_t>(nh) * choice[b].splits;
    // Raw scores go to the statistics row itself and are normalized in place afterwards.
    q.scores = a.col_sums != nullptr ? a.col_sums : a.last_probs;
    if (q.scores != nullptr) {
      q.row_stats = row_stats + stat_at;
      stat_at += nh;
    }
    q.col_sums = a.col_sums;
    q.last_probs = a.last_probs;
    q.stride = a.stats_stride;
    q.chunk = choice[b].plan.chunk;
    q.splits = choice[b].splits;
  }
  int launches = 0;
  DecodeSeqs pack;
  auto flush = [&](DecodePath path, size_t smem) {
    if (pack.count == 0) return;
    if (path == DecodePath::kTensor) {
      decode_mma(a0, group, smem, pack, stream);
    } else {
      decode_stream(a0, group, smem, pack, stream);
    }
    ++launches;
    pack.count = 0;
  };
  for (const DecodePath path : {DecodePath::kTensor, DecodePath::kStreamed}) {
    size_t smem = 0;
    for (int b = 0; b < count; ++b) {
      if (choice[b].path != path) continue;
      smem = choice[b].plan.smem;  // the shape's: the same for every sequence
      pack.s[pack.count++] = all[b];
      if (pack.count == kMaxDecodeSeqs) flush(path, smem);
    }
    flush(path, smem);
  }
  for (int b = 0; b < count; ++b) {
    const AttentionArgs& a = seqs[b];
    const DecodeSeq& q = all[b];
    const Common c{a.q, a.kv.offsets, a.kv.lengths, a.n, nh, group, d, a.scale, a.window};
    if (choice[b].path == DecodePath::kGrouped) {
      launch_grouped(c, a.kv.dtype, a.kv.keys, a.kv.values, a.kv.num_kv_heads, choice[b].grouped,
                     q.part_ml, q.part_acc, q.scores, q.stride, stream);
      ++launches;
    } else if (choice[b].path == DecodePath::kPerHead) {
      const dim3 grid(nh, q.splits);
      if (a.kv.dtype == KvDtype::kF32) {
        decode_partial_kernel<float><<<grid, kThreads, 0, stream>>>(
            c, static_cast<const float*>(a.kv.keys), static_cast<const float*>(a.kv.values),
            q.part_ml, q.part_acc, q.scores, q.stride);
      } else {
        decode_partial_kernel<__nv_bfloat16>
            <<<grid, kThreads, 0, stream>>>(c, static_cast<const __nv_bfloat16*>(a.kv.keys),
                                            static_cast<const __nv_bfloat16*>(a.kv.values),
                                            q.part_ml, q.part_acc, q.scores, q.stride);
      }
      KVB_CUDA_CHECK_LAUNCH();
      ++launches;
    }
  }
  for (int b0 = 0; b0 < count; b0 += kMaxDecodeSeqs) {
    pack.count = std::min(kMaxDecodeSeqs, count - b0);
    for (int i = 0; i < pack.count; ++i) pack.s[i] = all[b0 + i];
    decode_combine_kernel<<<dim3(nh, pack.count), kThreads, 0, stream>>>(pack, d);
    KVB_CUDA_CHECK_LAUNCH();
    ++launches;
  }
  pack.count = 0;
  int longest_stride = 0;
  auto flush_probs = [&] {
    if (pack.count == 0) return;
    decode_probs_kernel<<<dim3((longest_stride + 255) / 256, nh, pack.count), 256, 0, stream>>>(
        pack, group);
    KVB_CUDA_CHECK_LAUNCH();
    ++launches;
    pack.count = 0;
    longest_stride = 0;
  };
  for (int b = 0; b < count; ++b) {
    if (all[b].row_stats == nullptr) continue;
    pack.s[pack.count++] = all[b];
    longest_stride = std::max(longest_stride, all[b].stride);
    if (pack.count == kMaxDecodeSeqs) flush_probs();
  }
  flush_probs();
  return launches;
}

// Prefill (n >= 2).
template <typename T>
void launch(const AttentionArgs& a, int group, int max_len, cudaStream_t stream) {
  const int d = a.kv.head_dim;
  const Common c{a.q, a.kv.offsets, a.kv.lengths, a.n, a.num_heads, group, d, a.scale, a.window};
  const T* keys = static_cast<const T*>(a.kv.keys);
  const T* values = static_cast<const T*>(a.kv.values);
  const bool stats = a.col_sums != nullptr || a.last_probs != nullptr;
  StreamScratch row_stats(stats ? sizeof(float2) * a.num_heads * a.n : 0, stream);
  float2* rs = stats ? row_stats.as<float2>() : nullptr;
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

// Every check of cuda::attention, before any CUDA call (a bad call changes nothing); the
// longest head.
int validate(const AttentionArgs& a) {
  const DeviceLayerKvView& kv = a.kv;
  KVB_CHECK(kv.num_kv_heads > 0 && a.num_heads > 0 && a.num_heads % kv.num_kv_heads == 0)
      << "cuda::attention: num_heads " << a.num_heads << " not a positive multiple of "
      << "num_kv_heads " << kv.num_kv_heads;
  KVB_CHECK(kv.head_dim >= 1 && kv.head_dim <= kMaxHeadDim)
      << "cuda::attention: head_dim " << kv.head_dim << " outside [1, " << kMaxHeadDim << "]";
  KVB_CHECK(a.n >= 0) << "cuda::attention: n = " << a.n;
  KVB_CHECK(kv.host_lengths != nullptr && kv.lengths != nullptr && kv.offsets != nullptr)
      << "cuda::attention: the view has no lengths/offsets";
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
  return max_len;
}

}  // namespace

void attention(const AttentionArgs& a, cudaStream_t stream) {
  const int max_len = validate(a);
  const int group = a.num_heads / a.kv.num_kv_heads;
  if (a.n == 1) {
    decode({&a, 1}, {&max_len, 1}, group, stream);
    return;
  }
  const size_t rows = static_cast<size_t>(a.num_heads) * a.stats_stride;
  if (a.col_sums) KVB_CUDA_CHECK(cudaMemsetAsync(a.col_sums, 0, rows * sizeof(float), stream));
  if (a.last_probs) {
    KVB_CUDA_CHECK(cudaMemsetAsync(a.last_probs, 0, rows * a.last_w * sizeof(float), stream));
  }
  if (a.n == 0) return;
  if (a.kv.dtype == KvDtype::kF32) {
    launch<float>(a, group, max_len, stream);
  } else {
    launch<__nv_bfloat16>(a, group, max_len, stream);
  }
}

int attention_batch(std::span<const AttentionArgs> seqs, cudaStream_t stream) {
  KVB_CHECK(!seqs.empty()) << "cuda::attention_batch: no sequences";
  std::vector<int> max_lens(seqs.size());
  const AttentionArgs& a0 = seqs[0];
  for (size_t b = 0; b < seqs.size(); ++b) {
    const AttentionArgs& a = seqs[b];
    max_lens[b] = validate(a);
    KVB_CHECK(a.n == 1) << "cuda::attention_batch: sequence " << b << " has n = " << a.n
                        << " (decode steps only: one query each)";
    KVB_CHECK(a.num_heads == a0.num_heads && a.kv.num_kv_heads == a0.kv.num_kv_heads &&
              a.kv.head_dim == a0.kv.head_dim && a.kv.dtype == a0.kv.dtype &&
              a.window == a0.window && a.scale == a0.scale)
        << "cuda::attention_batch: sequence " << b << " (" << a.num_heads << " heads over "
        << a.kv.num_kv_heads << ", head_dim " << a.kv.head_dim << ", " << kv_dtype_name(a.kv.dtype)
        << ", window " << a.window << ", scale " << a.scale << ") differs from sequence 0's shape ("
        << a0.num_heads << " over " << a0.kv.num_kv_heads << ", " << a0.kv.head_dim << ", "
        << kv_dtype_name(a0.kv.dtype) << ", " << a0.window << ", " << a0.scale << ")";
  }
  return decode(seqs, max_lens, a0.num_heads / a0.kv.num_kv_heads, stream);
}

}  // namespace kvb::kernels::cuda
