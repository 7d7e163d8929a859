// Prefill attention on bf16 tensor cores (attention_prefill_mma.h): FlashAttention-2 style tiles,
// mma.sync.m16n8k16 (PTX ISA "Matrix fragments for mma.m16n8k16 with floating point type"),
// online softmax; then an optional exact statistics pass. Layout: kv_cache_device.h.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_prefill_mma.h"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

using namespace mma;  // ld32, pack_bf16, bf16_bits, mma_bf16, quad_max, quad_sum

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;  // rows of a warp tile: the m of m16n8k16

// Keys per shared-memory tile: 64, or 32 at head_dim 256 (keeps the score tile and the output
// accumulators, 4 * (keys + head_dim) / 8 floats per lane, within the register file).
template <int D>
constexpr int kKeyTileOf = D >= 256 ? 32 : 64;
// Shared rows are padded by 8 bf16 (16 bytes): the fragment loads below (lane = 4 * gid + tig
// reads row gid, column 2 * tig; or rows 2 * tig, 2 * tig + 1, column gid) then hit 32 distinct
// banks for every head_dim here, and every row stays 16-byte aligned for the uint4 stores.
template <int D>
constexpr int kStrideOf = D + 8;

struct Params {
  const float* q;          // [n, num_heads, D], post-RoPE, f32
  const uint16_t* keys;    // bf16 bits [slots_in_layer, D]
  const uint16_t* values;  // bf16 bits [slots_in_layer, D]
  const int32_t* offsets;  // device [num_kv_heads]
  const int32_t* lengths;  // device [num_kv_heads]
  float* out;              // [n, num_heads, D]
  float2* row_stats;       // [num_heads, n]: (max, sum) of each row's scores, or null
  float* col_sums;         // [num_heads, stride] (statistics pass)
  float* last_probs;       // [num_heads, last_w, stride] (statistics pass)
  int n, num_heads, group, window, last_w, stride;
  float scale;
};

// Rows q0 .. q0 + 15 of query head `head` to the warp's shared tile [16, D + 8] as bf16; rows
// past n are zeros (their scores are finite and never written out).
template <int D>
__device__ __forceinline__ void load_q_tile(const Params& p, int q0, int head, uint16_t* qs) {
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < kRows * D; e += 32) {
    const int r = e / D, x = e % D;
    const float v =
        q0 + r < p.n ? p.q[(static_cast<size_t>(q0 + r) * p.num_heads + head) * D + x] : 0.0f;
    qs[r * kStrideOf<D> + x] = bf16_bits(v);
  }
}

// Rows [t0, t0 + count) of one KV head's keys (and values when vs != null) to shared [kKeys, D +
// 8]; rows past count are zeros (a masked probability is 0 and 0 * 0 stays 0). Whole block.
template <int D>
__device__ __forceinline__ void load_kv_tile(const uint16_t* keys, const uint16_t* values,
                                             size_t row0, int count, uint16_t* ks, uint16_t* vs) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int e = threadIdx.x; e < kKeyTileOf<D> * kChunks; e += kThreads) {
    const int j = e / kChunks, c = e % kChunks;
    uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
    if (j < count) {
      const size_t at = (row0 + j) * D + c * 8;
      kv = *reinterpret_cast<const uint4*>(keys + at);
      if (vs != nullptr) vv = *reinterpret_cast<const uint4*>(values + at);
    }
    *reinterpret_cast<uint4*>(ks + j * kStrideOf<D> + c * 8) = kv;
    if (vs != nullptr) *reinterpret_cast<uint4*>(vs + j * kStrideOf<D> + c * 8) = vv;
  }
}

// Grid (ceil(tiles / 4), num_kv_heads), tiles = ceil(n / 16) * group. Warp tile T of a KV head is
// queries [16 (T / group), +16) of query head kvh * group + T % group; a block's 4 warps share
// each K/V tile (for group >= 4: one query tile of 4 heads of the group). Blocks run in reverse
// order, so those with the most keys start first.
template <int D>
__global__ void __launch_bounds__(kThreads) prefill_mma_kernel(Params p) {
  constexpr int kKeys = kKeyTileOf<D>, kS = kStrideOf<D>;
  extern __shared__ uint4 smem_raw[];
  uint16_t* qs_all = reinterpret_cast<uint16_t*>(smem_raw);  // [kWarps][16, kS]
  uint16_t* ks = qs_all + kWarps * kRows * kS;               // [kKeys, kS]
  uint16_t* vs = ks + kKeys * kS;                            // [kKeys, kS]
  const int kvh = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int len = p.lengths[kvh], before = len - p.n;
  const size_t base = p.offsets[kvh];
  const int tiles = (p.n + kRows - 1) / kRows * p.group;
  const int block = gridDim.x - 1 - blockIdx.x;
  const int tile = block * kWarps + warp;
  const bool active = tile < tiles;
  const int q0 = tile / p.group * kRows, head = kvh * p.group + tile % p.group;
  uint16_t* qs = qs_all + warp * kRows * kS;
  if (active) load_q_tile<D>(p, q0, head, qs);
  // The keys the block needs: up to its last query's; from its first query's window on.
  const int last_tile = min(block * kWarps + kWarps, tiles) - 1;
  const int first_q = block * kWarps / p.group * kRows;
  const int last_q = min(p.n - 1, last_tile / p.group * kRows + kRows - 1);
  const int keys_end = before + last_q + 1;
  const int keys_begin = p.window > 0 ? max(0, before + first_q + 1 - p.window) / kKeys * kKeys : 0;
  // This lane's two rows (a: gid, b: gid + 8); rows past n are masked as query n - 1.
  const int vis_a = before + min(q0 + gid, p.n - 1) + 1;
  const int vis_b = before + min(q0 + gid + 8, p.n - 1) + 1;
  const int lo_a = p.window > 0 ? max(0, vis_a - p.window) : 0;
  const int lo_b = p.window > 0 ? max(0, vis_b - p.window) : 0;
  const int warp_end = before + min(q0 + kRows, p.n);
  const int warp_lo = p.window > 0 ? max(0, before + q0 + 1 - p.window) : 0;
  // Tiles in [all_lo, all_vis) are seen whole by every row: no mask needed there.
  const int all_vis = before + q0 + 1;
  const int all_lo = p.window > 0 ? max(0, warp_end - p.window) : 0;
  float o[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dn][e] = 0.0f;
  }
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this lane's columns
  for (int t0 = keys_begin; t0 < keys_end; t0 += kKeys) {
    __syncthreads();  // the previous tile is consumed
    load_kv_tile<D>(p.keys, p.values, base + t0, min(kKeys, keys_end - t0), ks, vs);
    __syncthreads();
    // Warp-uniform: the tile lies wholly in the future of, or before the window of, all 16 rows.
    if (!active || t0 >= warp_end || t0 + kKeys <= warp_lo) continue;
    float s[kKeys / 8][4];
    tile_scores<D, kKeys, kS>(qs, ks, p.scale, s);  // both passes: the same bits
    if (t0 + kKeys > all_vis || t0 < all_lo) {  // warp-uniform
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = t0 + 8 * j + 2 * tig + (e & 1);
          const bool b = e >= 2;
          const bool seen = key < (b ? vis_b : vis_a) && key >= (b ? lo_b : lo_a);
          s[j][e] = seen ? s[j][e] : -INFINITY;
        }
      }
    }
    online_softmax<D, kKeys>(s, m_a, m_b, l_a, l_b, o);
    tile_pv<D, kKeys, kS>(s, vs, o);  // P (bf16) x V
  }
  if (!active) return;
  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);
  const int row_a = q0 + gid, row_b = q0 + gid + 8;
  const float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    const int x = 8 * dn + 2 * tig;
    if (row_a < p.n) {
      *reinterpret_cast<float2*>(p.out + (static_cast<size_t>(row_a) * p.num_heads + head) * D +
                                 x) = make_float2(o[dn][0] * inv_a, o[dn][1] * inv_a);
    }
    if (row_b < p.n) {
      *reinterpret_cast<float2*>(p.out + (static_cast<size_t>(row_b) * p.num_heads + head) * D +
                                 x) = make_float2(o[dn][2] * inv_b, o[dn][3] * inv_b);
    }
  }
  if (p.row_stats != nullptr && tig == 0) {
    if (row_a < p.n) p.row_stats[static_cast<size_t>(head) * p.n + row_a] = make_float2(m_a, l_a);
    if (row_b < p.n) p.row_stats[static_cast<size_t>(head) * p.n + row_b] = make_float2(m_b, l_b);
  }
}

// Grid (ceil(max_len / kKeys), num_heads): one key tile of one query head. Warps take query tiles
// w, w + 4, ... (from the first tile holding a last_probs query when only last_probs is asked),
// recompute the scores as the first pass did and write p = exp(s - m) / l. Column sums: each lane
// adds its rows in query order, then the 16 rows of a tile in a fixed butterfly, then the warps
// in order (deterministic, not the CPU's order). No window (attention.h: no statistics with one).
template <int D>
__global__ void __launch_bounds__(kThreads) prefill_mma_stats_kernel(Params p) {
  constexpr int kKeys = kKeyTileOf<D>, kS = kStrideOf<D>;
  extern __shared__ uint4 smem_raw[];
  uint16_t* qs_all = reinterpret_cast<uint16_t*>(smem_raw);  // [kWarps][16, kS]
  uint16_t* ks = qs_all + kWarps * kRows * kS;               // [kKeys, kS]
  __shared__ float part[kWarps][kKeys];
  const int h = blockIdx.y, kvh = h / p.group, t0 = blockIdx.x * kKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int len = p.lengths[kvh], before = len - p.n;
  if (t0 >= len) return;  // block-uniform
  load_kv_tile<D>(p.keys, nullptr, static_cast<size_t>(p.offsets[kvh]) + t0, min(kKeys, len - t0),
                  ks, nullptr);
  __syncthreads();
  uint16_t* qs = qs_all + warp * kRows * kS;
  float cs[kKeys / 8][2];
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) cs[j][0] = cs[j][1] = 0.0f;
  const int first = p.col_sums != nullptr ? 0 : p.n - p.last_w;
  for (int q0 = (first / kRows + warp) * kRows; q0 < p.n; q0 += kWarps * kRows) {
    if (before + min(q0 + kRows, p.n) <= t0) continue;  // warp-uniform: all 16 rows precede it
    __syncwarp();
    load_q_tile<D>(p, q0, h, qs);
    __syncwarp();
    float s[kKeys / 8][4];
    tile_scores<D, kKeys, kS>(qs, ks, p.scale, s);  // both passes: the same bits
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = q0 + gid + 8 * half;
      if (row >= p.n) continue;
      const int visible = before + row + 1;
      const float2 st = p.row_stats[static_cast<size_t>(h) * p.n + row];
      const int w = row - (p.n - p.last_w);
      float* lp = p.last_probs != nullptr && w >= 0
                      ? p.last_probs + (static_cast<size_t>(h) * p.last_w + w) * p.stride
                      : nullptr;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = t0 + 8 * j + 2 * tig + e;
          if (key >= visible) continue;
          const float pr = expf(s[j][2 * half + e] - st.x) / st.y;
          cs[j][e] += pr;
          if (lp != nullptr) lp[key] = pr;
        }
      }
    }
  }
  if (p.col_sums == nullptr) return;  // block-uniform
    // Sum the 8 row groups (lanes with the same tig), then the warps in order.
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = cs[j][e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (gid == 0) part[warp][8 * j + 2 * tig + e] = v;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kKeys; c += kThreads) {
    if (t0 + c >= len) break;
    float total = part[0][c];
    for (int w = 1; w < kWarps; ++w) total += part[w][c];
    p.col_sums[static_cast<size_t>(h) * p.stride + t0 + c] = total;
  }
}

template <int D>
void launch(const Params& p, int num_kv_heads, int max_len, bool stats, cudaStream_t stream) {
  constexpr int kKeys = kKeyTileOf<D>, kS = kStrideOf<D>;
  const size_t q_bytes = sizeof(uint16_t) * kWarps * kRows * kS;
  const size_t kv_bytes = sizeof(uint16_t) * kKeys * kS;
  const size_t smem = q_bytes + 2 * kv_bytes;
  // Raised every call (a per-device attribute; cheap, no synchronisation).
  KVB_CUDA_CHECK(cudaFuncSetAttribute(
      prefill_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int tiles = (p.n + kRows - 1) / kRows * p.group;
  prefill_mma_kernel<D>
      <<<dim3((tiles + kWarps - 1) / kWarps, num_kv_heads), kThreads, smem, stream>>>(p);
  KVB_CUDA_CHECK_LAUNCH();
  if (!stats) return;
  const size_t stats_smem = q_bytes + kv_bytes;
  KVB_CUDA_CHECK(cudaFuncSetAttribute(prefill_mma_stats_kernel<D>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(stats_smem)));
  prefill_mma_stats_kernel<D>
      <<<dim3((max_len + kKeys - 1) / kKeys, p.num_heads), kThreads, stats_smem, stream>>>(p);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool prefill_mma_supported(const DeviceLayerKvView& kv) {
  if (kv.dtype != KvDtype::kBf16) return false;
  const int d = kv.head_dim;
  if (d != 32 && d != 64 && d != 96 && d != 128 && d != 256) return false;
  if (reinterpret_cast<uintptr_t>(kv.keys) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(kv.values) % 16 != 0) {
    return false;
  }
  int device = 0, major = 0;
  KVB_CUDA_CHECK(cudaGetDevice(&device));
  KVB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

void prefill_mma(const AttentionArgs& a, int group, int max_len, float2* row_stats,
                 cudaStream_t stream) {
  const bool stats = a.col_sums != nullptr || a.last_probs != nullptr;
  KVB_CHECK(a.n >= 2 && (!stats || row_stats != nullptr))
      << "cuda::prefill_mma: n = " << a.n << (stats ? ", statistics without row_stats" : "");
  Params p;
  p.q = a.q;
  p.keys = static_cast<const uint16_t*>(a.kv.keys);
  p.values = static_cast<const uint16_t*>(a.kv.values);
  p.offsets = a.kv.offsets;
  p.lengths = a.kv.lengths;
  p.out = a.out;
  p.row_stats = stats ? row_stats : nullptr;
  p.col_sums = a.col_sums;
  p.last_probs = a.last_probs;
  p.n = a.n;
  p.num_heads = a.num_heads;
  p.group = group;
  p.window = a.window;
  p.last_w = a.last_probs != nullptr ? a.last_w : 0;
  p.stride = a.stats_stride;
  p.scale = a.scale;
  const int kvh = a.kv.num_kv_heads;
  switch (a.kv.head_dim) {  // the compiled head_dims (prefill_mma_supported)
    case 32:
      launch<32>(p, kvh, max_len, stats, stream);
      break;
    case 64:
      launch<64>(p, kvh, max_len, stats, stream);
      break;
    case 96:
      launch<96>(p, kvh, max_len, stats, stream);
      break;
    case 128:
      launch<128>(p, kvh, max_len, stats, stream);
      break;
    case 256:
      launch<256>(p, kvh, max_len, stats, stream);
      break;
    default:
      KVB_CHECK(false) << "cuda::prefill_mma: head_dim " << a.kv.head_dim << " not compiled";
  }
}

}  // namespace kvb::kernels::cuda
