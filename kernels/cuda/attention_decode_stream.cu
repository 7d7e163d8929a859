// The streamed decode partial pass: see attention_decode_stream.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_decode_seq.h"
#include "kernels/cuda/attention_decode_stream.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/kernel_ready.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/warp.cuh"

namespace kvb::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;    // keys per stage: one per lane when scoring
constexpr int kStages = 3;   // tiles in shared memory: one scored, two in flight
constexpr int kPad = 16;     // bytes after each shared row, so 8 lanes' 16-byte reads of 8
                             // different rows fall in different banks
constexpr int kMaxAcc = 16;  // output values per thread: head_dim * group-rounded-up / 128 max

struct Params {
  DecodeSeqs seqs;  // blockIdx.z's: rows, lengths, query, partial states, raw scores, plan
  int group, d, window, row_bytes;
  float scale;
};

// Grid (num_kv_heads, the sequences' most splits, sequences), kThreads threads. kG: the group
// rounded up to a power of two; the p x V step gives each query head kThreads / kG threads, each
// holding whole 16-byte vectors of the head's output (the vectors of a row, a power of two, over
// min(vectors, threads)).
template <typename T, int kG>
__global__ void __launch_bounds__(kThreads) decode_stream_kernel(Params p) {
  constexpr int V = Vec16<T>::kN;
  extern __shared__ __align__(16) unsigned char smem[];
  const DecodeSeq seq = p.seqs.s[blockIdx.z];
  const int d = p.d, group = p.group, kvh = blockIdx.x, split = blockIdx.y, splits = seq.splits;
  if (split >= splits) return;  // block-uniform: past this sequence's chunks
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_stride = p.row_bytes + kPad;
  const int stage_bytes = 2 * kTile * row_stride;  // K tile, then V tile
  float* sq = reinterpret_cast<float*>(smem + kStages * stage_bytes);  // [group, d]
  float* sp = sq + group * d;  // [kG, kTile]: the tile's probabilities per query head
  float* sm = sp + kG * kTile;  // [kG] running max
  float* sl = sm + kG;          // [kG] running sum
  float* sc = sl + kG;          // [kG] this tile's correction of the earlier sum and output
  const int h0 = kvh * group;
  const int len = seq.lengths[kvh];
  const int lo = p.window > 0 ? max(0, len - p.window) : 0;
  const int c0 = max(split * seq.chunk, lo), c1 = min(len, split * seq.chunk + seq.chunk);
  if (c0 >= c1) {  // block-uniform: no visible key of this head in the chunk
    for (int g = tid; g < group; g += kThreads) {
      seq.part_ml[static_cast<size_t>(h0 + g) * splits + split] = make_float2(-INFINITY, 0.0f);
    }
    return;
  }
  for (int i = tid; i < group * d; i += kThreads) {
    sq[i] = seq.q[static_cast<size_t>(h0) * d + i];
  }
  if (tid < kG) {
    sm[tid] = -INFINITY;
    sl[tid] = 0.0f;
  }
  const int tiles = (c1 - c0 + kTile - 1) / kTile;
  const size_t base = seq.offsets[kvh];
  const int pieces = p.row_bytes / 16;
  auto issue = [&](int t) {
    unsigned char* st = smem + (t % kStages) * stage_bytes;
    const int k0 = c0 + t * kTile;
    for (int i = tid; i < 2 * kTile * pieces; i += kThreads) {
      const int which = i / (kTile * pieces);  // 0: K, 1: V
      const int r = (i / pieces) % kTile, piece = i % pieces;
      const bool valid = k0 + r < c1;
      const size_t row = base + (valid ? k0 + r : c0);  // a readable address either way
      const unsigned char* src = static_cast<const unsigned char*>(which ? seq.values : seq.keys) +
                                 row * p.row_bytes + piece * 16;
      cp_async16(st + (which * kTile + r) * row_stride + piece * 16, src, valid ? 16 : 0);
    }
  };
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles) issue(t);
    cp_async_commit();  // one group per tile, empty past the last, so the counts stay uniform
  }
  // The p x V step's share of this thread: head gv's output vectors col, col + dth, ... (vpt of
  // them) over the tile's keys sub, sub + kr, ...; where a head's vectors are fewer than its
  // threads (kr > 1), the key subsets' sums are added at the end, in subset order.
  const int tph = kThreads / kG, dt = d / V;
  const int dth = min(dt, tph), vpt = dt / dth, kr = tph / dth;
  const int gv = tid / tph, u = tid % tph, col = u % dth, sub = u / dth;
  const bool pv = gv < group;
  float acc[kMaxAcc];
#pragma unroll
  for (int e = 0; e < kMaxAcc; ++e) acc[e] = 0.0f;

  for (int t = 0; t < tiles; ++t) {
    if (t + kStages - 1 < tiles) issue(t + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // this thread's copies of tile t have landed
    __syncthreads();               // ... and everyone's
    const unsigned char* ks = smem + (t % kStages) * stage_bytes;
    const unsigned char* vs = ks + kTile * row_stride;
    const int k0 = c0 + t * kTile, valid_n = min(kTile, c1 - k0);
    for (int g = warp; g < group; g += kWarps) {
      const bool valid = lane < valid_n;
      const float* qg = sq + g * d;
      const T* krow = reinterpret_cast<const T*>(ks + lane * row_stride);
      // Each 16-byte vector's products summed on their own, then the vectors' sums in order:
      // the vectors' chains overlap, the dependent chain is d / V adds long instead of d FMAs.
      float dot = 0.0f;
#pragma unroll 4
      for (int x0 = 0; x0 < d; x0 += V) {
        float kf[V];
        Vec16<T>::load(krow + x0, kf);
        float part = __fmul_rn(qg[x0], kf[0]);
#pragma unroll
        for (int e = 1; e < V; ++e) part = fmaf(qg[x0 + e], kf[e], part);
        dot = __fadd_rn(dot, part);
      }
      const float s = __fmul_rn(dot, p.scale);
      if (seq.scores != nullptr && valid) {
        seq.scores[static_cast<size_t>(h0 + g) * seq.stride + k0 + lane] = s;
      }
      const float m_old = sm[g];
      // Finite: lane 0's key is valid (k0 < c1).
      const float m_new = fmaxf(m_old, warp_max(valid ? s : -INFINITY));
      const float pr = valid ? expf(s - m_new) : 0.0f;
      const float psum = warp_sum(pr);
      sp[g * kTile + lane] = pr;
      __syncwarp();  // every lane has read sm[g] before lane 0 replaces it
      if (lane == 0) {
        const float corr = expf(m_old - m_new);  // 0 on the first tile
        sc[g] = corr;
        sl[g] = sl[g] * corr + psum;
        sm[g] = m_new;
      }
    }
    __syncthreads();
    if (pv) {
      const float corr = sc[gv];
      const float* pg = sp + gv * kTile;
#pragma unroll
      for (int e = 0; e < kMaxAcc; ++e) acc[e] *= corr;
      // Every row of the tile: rows past the chunk are zero-filled and their probabilities 0,
      // so they add exact zeros, and the trip count is fixed (unrolled, loads ahead of use).
#pragma unroll 8
      for (int r = sub; r < kTile; r += kr) {
        const float pr = pg[r];
        const T* vrow = reinterpret_cast<const T*>(vs + r * row_stride);
#pragma unroll
        for (int c = 0; c < kMaxAcc / V; ++c) {
          if (c >= vpt) break;
          float vf[V];
          Vec16<T>::load(vrow + (col + dth * c) * V, vf);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[c * V + e] = fmaf(pr, vf[e], acc[c * V + e]);
        }
      }
    }
    __syncthreads();  // the stage is consumed before a later issue() refills it
  }
  cp_async_wait<0>();  // only empty groups remain; nothing in flight at exit
  if (kr > 1) {
    // The key subsets' sums (vpt == 1 here: one vector of V values per thread) through the
    // stages' memory, which the loop's last barrier freed; subset 0 adds them in order.
    float* red = reinterpret_cast<float*>(smem);  // [kThreads, V]
    if (pv && sub > 0) {
#pragma unroll
      for (int e = 0; e < V; ++e) red[tid * V + e] = acc[e];
    }
    __syncthreads();
    if (pv && sub == 0) {
      for (int s = 1; s < kr; ++s) {
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] += red[(tid + s * dth) * V + e];
      }
    }
  }
  if (pv && sub == 0) {
    const size_t at = static_cast<size_t>(h0 + gv) * splits + split;
#pragma unroll
    for (int c = 0; c < kMaxAcc / V; ++c) {
      if (c >= vpt) break;
      const int x0 = (col + dth * c) * V;
#pragma unroll
      for (int e = 0; e < V; ++e) seq.part_acc[at * d + x0 + e] = acc[c * V + e];
    }
    if (u == 0) seq.part_ml[at] = make_float2(sm[gv], sl[gv]);
  }
}

int pow2_at_least(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

// The kernel instance for a cache dtype and a group rounded up to a power of two.
template <typename T>
const void* kernel_for(int kg) {
  switch (kg) {
    case 1: return reinterpret_cast<const void*>(decode_stream_kernel<T, 1>);
    case 2: return reinterpret_cast<const void*>(decode_stream_kernel<T, 2>);
    case 4: return reinterpret_cast<const void*>(decode_stream_kernel<T, 4>);
    default: return reinterpret_cast<const void*>(decode_stream_kernel<T, 8>);
  }
}

template <typename T, int kG>
void launch_kg(const Params& prm, int num_kv_heads, int splits, size_t smem, cudaStream_t stream) {
  decode_stream_kernel<T, kG>
      <<<dim3(num_kv_heads, splits, prm.seqs.count), kThreads, smem, stream>>>(prm);
  KVB_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_t(const Params& prm, int num_kv_heads, int splits, size_t smem, cudaStream_t stream) {
  switch (pow2_at_least(prm.group)) {
    case 1:
      launch_kg<T, 1>(prm, num_kv_heads, splits, smem, stream);
      break;
    case 2:
      launch_kg<T, 2>(prm, num_kv_heads, splits, smem, stream);
      break;
    case 4:
      launch_kg<T, 4>(prm, num_kv_heads, splits, smem, stream);
      break;
    default:
      launch_kg<T, 8>(prm, num_kv_heads, splits, smem, stream);
      break;
  }
}

}  // namespace

DecodeStreamPlan plan_decode_stream(const DeviceLayerKvView& kv, int group, int max_len,
                                    int decode_blocks) {
  DecodeStreamPlan p;
  const size_t eb = kv_dtype_bytes(kv.dtype);
  const int v = static_cast<int>(16 / eb), d = kv.head_dim;
  if (group < 1 || group > 8 || max_len < 1 || kv.num_kv_heads < 1 || d % v != 0) return p;
  const int dt = d / v;
  if ((dt & (dt - 1)) != 0) return p;  // the p x V step splits whole vectors over powers of two
  const int kg = pow2_at_least(group);
  if ((dt / std::min(dt, kThreads / kg)) * v > kMaxAcc) return p;
  if (reinterpret_cast<uintptr_t>(kv.keys) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(kv.values) % 16 != 0) {
    return p;
  }
  const size_t row = static_cast<size_t>(d) * eb;
  const size_t smem = kStages * 2 * kTile * (row + kPad) +
                      sizeof(float) * (static_cast<size_t>(group) * d + kg * kTile + 3 * kg);
  return plan_decode_grid(
      kv.dtype == KvDtype::kF32 ? kernel_for<float>(kg) : kernel_for<__nv_bfloat16>(kg), kThreads,
      smem, decode_blocks, kv.num_kv_heads, max_len, kTile, 1);
}

void decode_stream(const AttentionArgs& a, int group, size_t smem, const DecodeSeqs& seqs,
                   cudaStream_t stream) {
  KVB_CHECK(seqs.count >= 1 && seqs.count <= kMaxDecodeSeqs && a.n == 1)
      << "cuda::decode_stream: " << seqs.count << " sequences";
  Params prm;
  prm.seqs = seqs;
  prm.group = group;
  prm.d = a.kv.head_dim;
  prm.window = a.window;
  prm.row_bytes = static_cast<int>(a.kv.head_dim * kv_dtype_bytes(a.kv.dtype));
  prm.scale = a.scale;
  int splits = 0;
  for (int i = 0; i < seqs.count; ++i) {
    KVB_CHECK(seqs.s[i].splits > 0) << "cuda::decode_stream: sequence " << i << " has no plan";
    splits = std::max(splits, seqs.s[i].splits);
  }
  if (a.kv.dtype == KvDtype::kF32) {
    launch_t<float>(prm, a.kv.num_kv_heads, splits, smem, stream);
  } else {
    launch_t<__nv_bfloat16>(prm, a.kv.num_kv_heads, splits, smem, stream);
  }
}

}  // namespace kvb::kernels::cuda
