// The tensor-core decode partial pass: see attention_decode_mma.h. Fragment layouts: mma_bf16.cuh;
// the P x V and score fragments are read as attention_prefill_mma.cu reads them.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_decode_mma.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/kernel_ready.h"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

using namespace mma;  // ld32, pack_bf16, bf16_bits, mma_bf16, quad_max, quad_sum

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;     // query rows of the mma tile: the group's heads, then zeros
constexpr int kStages = 3;    // tiles of a warp in shared memory: one used, two in flight
constexpr int kMinTiles = 4;  // a chunk's tiles at least (one per warp) where the heads allow
constexpr int kMaxGroup = kRows;

// Keys per warp tile: 32, or 16 at head_dim 256 (the output accumulators, head_dim / 2 floats
// per lane, and the stages' shared memory stay within bounds).
template <int D>
constexpr int kKeysOf = D >= 256 ? 16 : 32;
// Shared rows padded by 8 bf16 (16 bytes), as in the prefill kernel: the fragment reads hit 32
// distinct banks and rows stay 16-byte aligned for cp.async.
template <int D>
constexpr int kStrideOf = D + 8;
// bf16 elements of one stage (a K tile, then a V tile) and of the block's shared memory.
template <int D>
constexpr int kStageOf = kStrideOf<D> * 2 * kKeysOf<D>;
template <int D>
constexpr size_t kSmemOf = sizeof(uint16_t) * (static_cast<size_t>(kRows) * kStrideOf<D> +
                                               kWarps * kStages * kStageOf<D>);

struct Params {
  DecodeSeqs seqs;  // blockIdx.z's: bf16 rows, lengths, query, partial states, plan
  int group, window;
  float scale;
};

// Grid (num_kv_heads, the sequences' most splits, sequences), kThreads threads. Block (kvh,
// split) of sequence blockIdx.z covers keys [c0, c1) of KV
// head kvh: chunk `split`, from the window's first visible key on. Query row r of the mma tile is
// query head kvh * group + r (r < group), a zero row past the group: its scores are 0, finite,
// and never written out.
template <int D>
__global__ void __launch_bounds__(kThreads) decode_mma_kernel(Params p) {
  constexpr int kKeys = kKeysOf<D>, kS = kStrideOf<D>, kStage = kStageOf<D>;
  constexpr int kChunks = D / 8;  // 16-byte pieces of a row
  extern __shared__ uint4 smem_raw[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);  // [kRows, kS]
  const DecodeSeq seq = p.seqs.s[blockIdx.z];
  const int kvh = blockIdx.x, split = blockIdx.y, splits = seq.splits;
  if (split >= splits) return;  // block-uniform: past this sequence's chunks
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  uint16_t* stages = qs + kRows * kS + warp * kStages * kStage;  // this warp's
  const int h0 = kvh * p.group;
  const int len = seq.lengths[kvh];
  const int lo = p.window > 0 ? max(0, len - p.window) : 0;
  const int c0 = max(split * seq.chunk, lo), c1 = min(len, split * seq.chunk + seq.chunk);
  if (c0 >= c1) {  // block-uniform: no visible key of this head in the chunk
    for (int g = threadIdx.x; g < p.group; g += kThreads) {
      seq.part_ml[static_cast<size_t>(h0 + g) * splits + split] = make_float2(-INFINITY, 0.0f);
    }
    return;
  }
  for (int e = threadIdx.x; e < kRows * D; e += kThreads) {
    const int r = e / D, x = e % D;
    const float v = r < p.group ? seq.q[static_cast<size_t>(h0 + r) * D + x] : 0.0f;
    qs[r * kS + x] = bf16_bits(v);
  }
  __syncthreads();

  const size_t base = seq.offsets[kvh];
  const int tiles = (c1 - c0 + kKeys - 1) / kKeys;
  const int mine = tiles > warp ? (tiles - warp + kWarps - 1) / kWarps : 0;  // this warp's tiles
  // The warp's i-th tile (chunk tile warp + i * kWarps) into stage i % kStages; rows past c1 are
  // zero-filled from a readable address (their probabilities are 0, and 0 * 0 stays 0).
  auto issue = [&](int i) {
    uint16_t* st = stages + (i % kStages) * kStage;
    const int k0 = c0 + (warp + i * kWarps) * kKeys;
    for (int e = lane; e < 2 * kKeys * kChunks; e += 32) {
      const int which = e / (kKeys * kChunks);  // 0: K, 1: V
      const int r = (e / kChunks) % kKeys, c = e % kChunks;
      const bool valid = k0 + r < c1;
      const size_t row = base + (valid ? k0 + r : c0);
      const uint16_t* src =
          static_cast<const uint16_t*>(which ? seq.values : seq.keys) + row * D + c * 8;
      cp_async16(st + (which * kKeys + r) * kS + c * 8, src, valid ? 16 : 0);
    }
  };
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < mine) issue(i);
    cp_async_commit();  // one group per tile, empty past the last: the counts stay uniform
  }

  float o[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dn][e] = 0.0f;
  }
  // Rows a (gid) and b (gid + 8) of the tile; l: this lane's columns until the end.
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  for (int i = 0; i < mine; ++i) {
    if (i + kStages - 1 < mine) issue(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // this lane's copies of tile i have landed
    __syncwarp();                  // ... and every lane's
    const uint16_t* ks = stages + (i % kStages) * kStage;
    const uint16_t* vs = ks + kKeys * kS;
    const int k0 = c0 + (warp + i * kWarps) * kKeys;
    // Scores: s[j] is the accumulator fragment of keys 8j .. 8j + 7 of the tile; keys past the
    // chunk (zero rows) masked.
    float s[kKeys / 8][4];
    tile_scores<D, kKeys, kS>(qs, ks, p.scale, s);
    if (k0 + kKeys > c1) {  // warp-uniform: the chunk ends inside this tile
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (k0 + 8 * j + 2 * tig + (e & 1) >= c1) s[j][e] = -INFINITY;
        }
      }
    }
    online_softmax<D, kKeys>(s, m_a, m_b, l_a, l_b, o);
    tile_pv<D, kKeys, kS>(s, vs, o);  // P (bf16) x V
    __syncwarp();  // every lane is done with stage i % kStages before a later issue() refills it
  }
  cp_async_wait<0>();  // only empty groups remain; nothing in flight past here
  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);

  // Merge the warps' states through the stages' memory, which every warp has left: per warp and
  // query head (rows < group) the max, the sum and the output row; a warp without tiles has max
  // -inf and adds nothing.
  __syncthreads();
  float* wml = reinterpret_cast<float*>(qs + kRows * kS);  // [kWarps][kMaxGroup][2]
  float* wo = wml + kWarps * kMaxGroup * 2;                // [kWarps][kMaxGroup][D]
  const int row_a = gid, row_b = gid + 8;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    const int x = 8 * dn + 2 * tig;
    if (row_a < p.group) {
      wo[(warp * kMaxGroup + row_a) * D + x] = o[dn][0];
      wo[(warp * kMaxGroup + row_a) * D + x + 1] = o[dn][1];
    }
    if (row_b < p.group) {
      wo[(warp * kMaxGroup + row_b) * D + x] = o[dn][2];
      wo[(warp * kMaxGroup + row_b) * D + x + 1] = o[dn][3];
    }
  }
  if (tig == 0) {
    if (row_a < p.group) {
      wml[(warp * kMaxGroup + row_a) * 2] = m_a;
      wml[(warp * kMaxGroup + row_a) * 2 + 1] = l_a;
    }
    if (row_b < p.group) {
      wml[(warp * kMaxGroup + row_b) * 2] = m_b;
      wml[(warp * kMaxGroup + row_b) * 2 + 1] = l_b;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < p.group * D; e += kThreads) {
    const int g = e / D, x = e % D;
    float mb = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mb = fmaxf(mb, wml[(w * kMaxGroup + g) * 2]);
    float acc = 0.0f, lb = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = wml[(w * kMaxGroup + g) * 2];
      if (mw == -INFINITY) continue;  // no tiles (warp 0 always has one: mb is finite)
      const float f = expf(mw - mb);
      acc += wo[(w * kMaxGroup + g) * D + x] * f;
      lb += wml[(w * kMaxGroup + g) * 2 + 1] * f;
    }
    const size_t at = static_cast<size_t>(h0 + g) * splits + split;
    seq.part_acc[at * D + x] = acc;
    if (x == 0) seq.part_ml[at] = make_float2(mb, lb);
  }
}

// Calls f(std::integral_constant<int, D>) for a compiled head_dim D; false for any other.
template <typename F>
bool with_head_dim(int d, F&& f) {
  switch (d) {
    case 32:
      f(std::integral_constant<int, 32>{});
      return true;
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 96:
      f(std::integral_constant<int, 96>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    case 256:
      f(std::integral_constant<int, 256>{});
      return true;
    default:
      return false;
  }
}

}  // namespace

DecodeMmaPlan plan_decode_mma(const DeviceLayerKvView& kv, int group, int max_len,
                              int decode_blocks) {
  DecodeMmaPlan p;
  const void* kernel = nullptr;
  size_t smem = 0;
  int keys = 0;
  const bool compiled = with_head_dim(kv.head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    kernel = reinterpret_cast<const void*>(decode_mma_kernel<D>);
    smem = kSmemOf<D>;
    keys = kKeysOf<D>;
  });
  if (kv.dtype != KvDtype::kBf16 || !compiled) return p;
  if (group < 1 || group > kMaxGroup || max_len < 1 || kv.num_kv_heads < 1) return p;
  if (reinterpret_cast<uintptr_t>(kv.keys) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(kv.values) % 16 != 0) {
    return p;
  }
  return plan_decode_grid(kernel, kThreads, smem, decode_blocks, kv.num_kv_heads, max_len, keys,
                          kMinTiles);
}

void decode_mma(const AttentionArgs& a, int group, size_t smem, const DecodeSeqs& seqs,
                cudaStream_t stream) {
  // `a` gives the shape only (its own statistics may differ: it can be another sequence of the
  // batch, on another kernel); each sequence's are checked below.
  KVB_CHECK(seqs.count >= 1 && seqs.count <= kMaxDecodeSeqs && a.n == 1 &&
            a.kv.dtype == KvDtype::kBf16)
      << "cuda::decode_mma: " << seqs.count << " sequences, n = " << a.n << ", "
      << kv_dtype_name(a.kv.dtype);
  Params prm;
  prm.seqs = seqs;
  prm.group = group;
  prm.window = a.window;
  prm.scale = a.scale;
  int splits = 0;
  for (int i = 0; i < seqs.count; ++i) {
    KVB_CHECK(seqs.s[i].splits > 0 && seqs.s[i].scores == nullptr)
        << "cuda::decode_mma: sequence " << i << " has no plan or asks for scores";
    splits = std::max(splits, seqs.s[i].splits);
  }
  const bool compiled = with_head_dim(a.kv.head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    decode_mma_kernel<D>
        <<<dim3(a.kv.num_kv_heads, splits, seqs.count), kThreads, smem, stream>>>(prm);
  });
  KVB_CHECK(compiled) << "cuda::decode_mma: head_dim " << a.kv.head_dim << " not compiled";
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
