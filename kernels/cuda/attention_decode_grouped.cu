// The GQA-grouped decode partial pass: see attention_decode_grouped.h.
#include "kernels/cuda/attention_decode_grouped.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention.h"
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

constexpr int kMaxLaneElems = 8;  // elements of a key row per lane: max(V, head_dim / 32)

// Lanes that share one key row: head_dim / V vectors over min(32, that) lanes; 0 when the
// grouped kernel cannot take the shape (the vectors must split evenly over a power of two).
template <typename T>
int grouped_row_lanes(int d) {
  constexpr int V = Vec16<T>::kN;
  if (d % V != 0) return 0;
  const int nv = d / V;
  if (nv >= 32) return nv % 32 == 0 && nv / 32 * V <= kMaxLaneElems ? 32 : 0;
  return (nv & (nv - 1)) == 0 ? nv : 0;
}

// Grid (num_kv_heads, splits), kThreads threads: one block reads each K/V row of its chunk once
// for all `group` query heads of its KV head (attention.cu's per-query-head kernel reads it group
// times). A row is split over `lanes` lanes, each loading 16-byte vectors (vector sl + lanes*i),
// so a warp holds 32 / lanes rows at once; each row group keeps its own online softmax state per
// query head, merged through shared memory at the end into the same [num_heads, splits] partial
// states decode_combine_kernel reads. Raw scaled scores to scores[h * stride + key] when asked.
// kRows: keys a row group takes per iteration. It issues all kRows rows' K and V loads before
// any math (more bytes in flight per warp), then scores the kRows keys and updates its softmax
// state once per batch: one new maximum over the batch's valid keys, one correction factor.
// Batch r of the warp's row groups holds keys first + r * rows_per_warp + sub, so each load
// instruction of the warp still covers adjacent rows. kRows = 1 is the one-key-at-a-time loop
// (the same operations in the same order as before the batching). Launch bounds: kRows > 1 asks
// for at least one resident block per multiprocessor, so ptxas sizes registers for the batch
// rather than for its own occupancy target (with the thread bound alone it held bf16 group-4
// kRows = 2 to 96 registers and spilled); kRows = 1 keeps the bound it always had.
template <typename T, int kG, int kRows>
__global__ void __launch_bounds__(kThreads, kRows > 1 ? 1 : 0)
    decode_grouped_kernel(Common c, const T* keys, const T* values, int lanes, int chunk,
                          float2* part_ml, float* part_acc, float* scores, int stride) {
  constexpr int V = Vec16<T>::kN;
  extern __shared__ float smem[];
  const int d = c.d, group = c.group;
  const int kvh = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows_per_warp = 32 / lanes, rows = kWarps * rows_per_warp;
  const int sub = lane / lanes, sl = lane % lanes;
  const int row = warp * rows_per_warp + sub;
  const int per_lane = d / V / lanes;  // vectors per lane (1, or 2 for f32 rows of 256)
  // Shared: q [group, d], then per row group: m [group], l [group], acc [group, d].
  float* sq = smem;
  float* st_m = sq + group * d;
  float* st_l = st_m + rows * group;
  float* st_acc = st_l + rows * group;
  for (int i = threadIdx.x; i < group * d; i += kThreads) {
    sq[i] = c.q[static_cast<size_t>(kvh) * group * d + i];
  }
  __syncthreads();
  const int len = c.lengths[kvh];
  const int c0 = max(split * chunk, first_visible(c, len)), c1 = min(len, split * chunk + chunk);
  const size_t base = c.offsets[kvh];
  float m[kG], l[kG], acc[kG][kMaxLaneElems];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxLaneElems; ++e) acc[g][e] = 0.0f;
  }
  constexpr int kMaxPer = kMaxLaneElems / V;
  // The warp's trip count is the same for all its lanes (the shuffles need every lane): a row
  // past the chunk's end loads nothing and updates nothing. Keys grow with r, so when batch 0's
  // key is past the end, so are all of the batch's.
  for (int first = c0 + warp * rows_per_warp * kRows; first < c1; first += rows * kRows) {
    float k[kRows][kMaxLaneElems] = {}, v[kRows][kMaxLaneElems] = {};
    bool valid[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int key = first + r * rows_per_warp + sub;
      valid[r] = key < c1;
      if (valid[r]) {
        const T* krow = keys + (base + key) * d;
        const T* vrow = values + (base + key) * d;
#pragma unroll
        for (int i = 0; i < kMaxPer; ++i) {
          if (i >= per_lane) break;
          Vec16<T>::load(krow + (sl + lanes * i) * V, k[r] + i * V);
          Vec16<T>::load(vrow + (sl + lanes * i) * V, v[r] + i * V);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g >= group) break;
      const float* qg = sq + g * d;
      float partial[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) partial[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxPer; ++i) {
        if (i >= per_lane) break;
        const int x0 = (sl + lanes * i) * V;
#pragma unroll
        for (int j = 0; j < V; ++j) {
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            partial[r] = fmaf(qg[x0 + j], k[r][i * V + j], partial[r]);
        }
      }
      // Sum over the row's lanes (xor within the aligned group of `lanes` lanes).
      for (int o = lanes / 2; o > 0; o /= 2) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) partial[r] += __shfl_xor_sync(kFull, partial[r], o);
      }
      if (!valid[0]) continue;
      float s[kRows];
      float m_new = m[g];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r] = __fmul_rn(partial[r], c.scale);
        if (!valid[r]) continue;
        if (scores != nullptr && sl == 0) {
          const int key = first + r * rows_per_warp + sub;
          scores[static_cast<size_t>(kvh * group + g) * stride + key] = s[r];
        }
        m_new = fmaxf(m_new, s[r]);
      }
      // Batch 0 is valid here: corr and p[0] are as in a one-key step; later keys add in order.
      const float corr = expf(m[g] - m_new);
      float p[kRows];
      p[0] = expf(s[0] - m_new);
      float psum = p[0];
#pragma unroll
      for (int r = 1; r < kRows; ++r) {
        p[r] = valid[r] ? expf(s[r] - m_new) : 0.0f;
        psum += p[r];
      }
      l[g] = l[g] * corr + psum;
#pragma unroll
      for (int e = 0; e < kMaxLaneElems; ++e) acc[g][e] = fmaf(p[0], v[0][e], acc[g][e] * corr);
#pragma unroll
      for (int r = 1; r < kRows; ++r) {
        if (!valid[r]) break;
#pragma unroll
        for (int e = 0; e < kMaxLaneElems; ++e) acc[g][e] = fmaf(p[r], v[r][e], acc[g][e]);
      }
      m[g] = m_new;
    }
  }
  // Each row group's state to shared memory (lane sl holds the dims of its vectors).
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g >= group) break;
    if (sl == 0) {
      st_m[row * group + g] = m[g];
      st_l[row * group + g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i) {
      if (i >= per_lane) break;
      const int x0 = (sl + lanes * i) * V;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        st_acc[(static_cast<size_t>(row) * group + g) * d + x0 + j] = acc[g][i * V + j];
      }
    }
  }
  __syncthreads();
  // Merge the row groups in row order, per query head of the group.
  for (int g = 0; g < group; ++g) {
    float mb = -INFINITY;
    for (int r = 0; r < rows; ++r) mb = fmaxf(mb, st_m[r * group + g]);
    const int h = kvh * group + g;
    const size_t at = static_cast<size_t>(h) * splits + split;
    if (threadIdx.x == 0) {
      float lb = 0.0f;
      for (int r = 0; r < rows; ++r) {
        const float mr = st_m[r * group + g];
        if (mr != -INFINITY) lb += st_l[r * group + g] * expf(mr - mb);  // idle rows add nothing
      }
      part_ml[at] = make_float2(mb, lb);
    }
    for (int x = threadIdx.x; x < d; x += kThreads) {
      float a = 0.0f;
      for (int r = 0; r < rows; ++r) {
        const float mr = st_m[r * group + g];
        if (mr != -INFINITY) a += st_acc[(static_cast<size_t>(r) * group + g) * d + x] * expf(mr - mb);
      }
      part_acc[at * d + x] = a;
    }
  }
}

constexpr int kDefaultDecodeBlocks = 256;
constexpr int kDefaultDecodeRows = 4;

template <typename T>
GroupedPlan plan_grouped_t(int d, int group, int num_kv_heads, int max_len, const void* keys,
                           const void* values, int decode_rows, int decode_blocks) {
  GroupedPlan p;
  const int lanes = grouped_row_lanes<T>(d);
  if (lanes == 0 || group > 8) return p;
  if (reinterpret_cast<uintptr_t>(keys) % 16 != 0 || reinterpret_cast<uintptr_t>(values) % 16 != 0) {
    return p;
  }
  const int rows = kWarps * (32 / lanes);
  p.smem = sizeof(float) *
           (static_cast<size_t>(group) * d + static_cast<size_t>(rows) * group * (2 + d));
  if (p.smem > 48 * 1024) return p;
  const int blocks = decode_blocks > 0 ? decode_blocks : kDefaultDecodeBlocks;
  const int by_blocks = std::max(1, (blocks + num_kv_heads - 1) / num_kv_heads);
  const int by_len = std::max(1, (max_len + 63) / 64);
  p.splits = std::min(by_blocks, by_len);
  p.chunk = (max_len + p.splits - 1) / p.splits;
  p.lanes = lanes;
  p.rows = decode_rows > 0 ? decode_rows : kDefaultDecodeRows;
  return p;
}

template <typename T, int kRows>
void launch_grouped_rows(const Common& c, const T* keys, const T* values, int num_kv_heads,
                         const GroupedPlan& p, float2* part_ml, float* part_acc, float* scores,
                         int stride, cudaStream_t stream) {
  const int group = c.group;
  const dim3 grid(num_kv_heads, p.splits);
  auto go = [&](auto kernel) {
    kernel<<<grid, kThreads, p.smem, stream>>>(c, keys, values, p.lanes, p.chunk, part_ml, part_acc,
                                               scores, stride);
  };
  if (group <= 1) {
    go(decode_grouped_kernel<T, 1, kRows>);
  } else if (group <= 2) {
    go(decode_grouped_kernel<T, 2, kRows>);
  } else if (group <= 4) {
    go(decode_grouped_kernel<T, 4, kRows>);
  } else {
    go(decode_grouped_kernel<T, 8, kRows>);
  }
  KVB_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_grouped_t(const Common& c, const T* keys, const T* values, int num_kv_heads,
                      const GroupedPlan& p, float2* part_ml, float* part_acc, float* scores,
                      int stride, cudaStream_t stream) {
  switch (p.rows) {
    case 1:
      launch_grouped_rows<T, 1>(c, keys, values, num_kv_heads, p, part_ml, part_acc, scores, stride,
                                stream);
      break;
    case 2:
      launch_grouped_rows<T, 2>(c, keys, values, num_kv_heads, p, part_ml, part_acc, scores, stride,
                                stream);
      break;
    default:
      launch_grouped_rows<T, 4>(c, keys, values, num_kv_heads, p, part_ml, part_acc, scores, stride,
                                stream);
      break;
  }
}

}  // namespace

GroupedPlan plan_grouped(KvDtype dtype, int d, int group, int num_kv_heads, int max_len,
                         const void* keys, const void* values, int decode_rows, int decode_blocks) {
  return dtype == KvDtype::kF32
             ? plan_grouped_t<float>(d, group, num_kv_heads, max_len, keys, values, decode_rows,
                                     decode_blocks)
             : plan_grouped_t<__nv_bfloat16>(d, group, num_kv_heads, max_len, keys, values,
                                             decode_rows, decode_blocks);
}

void launch_grouped(const Common& c, KvDtype dtype, const void* keys, const void* values,
                    int num_kv_heads, const GroupedPlan& p, float2* part_ml, float* part_acc,
                    float* scores, int stride, cudaStream_t stream) {
  if (dtype == KvDtype::kF32) {
    launch_grouped_t(c, static_cast<const float*>(keys), static_cast<const float*>(values),
                     num_kv_heads, p, part_ml, part_acc, scores, stride, stream);
  } else {
    launch_grouped_t(c, static_cast<const __nv_bfloat16*>(keys),
                     static_cast<const __nv_bfloat16*>(values), num_kv_heads, p, part_ml,
                     part_acc, scores, stride, stream);
  }
}

}  // namespace kvb::kernels::cuda
