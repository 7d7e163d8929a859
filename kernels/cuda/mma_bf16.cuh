// bf16 tensor-core helpers shared by the mma kernels (attention_prefill_mma.cu,
// attention_decode_mma.cu): mma.sync.m16n8k16 with bf16 operands and f32 accumulators (PTX ISA
// "Matrix fragments for mma.m16n8k16 with floating point type"), the operand packing, the
// reductions over a quad (the 4 lanes that hold one accumulator row), and the flash-attention
// tile steps both kernels take the same way: scores, the online softmax, P x V. Internal to the
// kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kvb::kernels::cuda::mma {

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// Two bf16 (nearest even) in one register, `lo` in the low half: the element with the smaller
// column index, as the mma fragments expect.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// d (16 x 8, f32) += a (16 x 16, bf16, row-major) * b (16 x 8, bf16, column-major). Fragments,
// with gid = lane / 4 and tig = lane % 4: a = {(gid, 2tig..+1), (gid+8, 2tig..+1), (gid,
// 2tig+8..+9), (gid+8, 2tig+8..+9)}; b = {(k 2tig..+1, n gid), (k 2tig+8..+9, n gid)}; d = {(gid,
// 2tig), (gid, 2tig+1), (gid+8, 2tig), (gid+8, 2tig+1)}. Needs compute capability 8.0 (the
// kernels' plans refuse older devices).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Scaled scores of a warp's 16 query rows (bf16, shared [16, kS]: qs) against the kKeys keys of a
// shared tile (ks, [kKeys, kS]): s[j] is the accumulator fragment of keys 8j .. 8j + 7. The same
// operands at the same tile positions give the same bits (the prefill's two passes rely on it).
template <int D, int kKeys, int kS>
__device__ __forceinline__ void tile_scores(const uint16_t* qs, const uint16_t* ks, float scale,
                                            float (&s)[kKeys / 8][4]) {
  const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
  }
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    const uint16_t* qa = qs + gid * kS + kc * 16 + 2 * tig;
    const uint32_t a[4] = {ld32(qa), ld32(qa + 8 * kS), ld32(qa + 8), ld32(qa + 8 * kS + 8)};
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
      const uint16_t* kb = ks + (8 * j + gid) * kS + kc * 16 + 2 * tig;
      mma_bf16(s[j], a, ld32(kb), ld32(kb + 8));
    }
  }
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = __fmul_rn(s[j][e], scale);
  }
}

// o += P (bf16) x V over a tile of kKeys keys (vs: shared [kKeys, kS]), o the accumulator
// fragments of output columns 8dn .. 8dn + 7; the probability fragments (s, as tile_scores laid
// them out) of keys 16kk .. 16kk + 15 are the A fragment as they lie.
template <int D, int kKeys, int kS>
__device__ __forceinline__ void tile_pv(const float (&s)[kKeys / 8][4], const uint16_t* vs,
                                        float (&o)[D / 8][4]) {
  const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                           pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                           pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const uint16_t* vk = vs + (16 * kk + 2 * tig) * kS + gid;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      const uint16_t* v = vk + 8 * dn;  // keys 2tig, 2tig + 1 (+8, +9), column 8dn + gid
      const uint32_t b0 = v[0] | static_cast<uint32_t>(v[kS]) << 16;
      const uint32_t b1 = v[8 * kS] | static_cast<uint32_t>(v[9 * kS]) << 16;
      mma_bf16(o[dn], a, b0, b1);
    }
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One tile of the online softmax over a warp's rows a (gid) and b (gid + 8), from tile_scores'
// fragments (masked entries -inf): the rows' new maxima m (over the quad), s replaced by p =
// exp(s - m), l (this lane's columns) and o rescaled by exp(m_old - m) and l increased by this
// lane's p. A row that has seen no key yet keeps max -inf and subtracts 0 instead (every p 0).
template <int D, int kKeys>
__device__ __forceinline__ void online_softmax(float (&s)[kKeys / 8][4], float& m_a, float& m_b,
                                               float& l_a, float& l_b, float (&o)[D / 8][4]) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
    mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
    mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
  }
  const float new_a = fmaxf(m_a, quad_max(mx_a)), new_b = fmaxf(m_b, quad_max(mx_b));
  const float use_a = new_a == -INFINITY ? 0.0f : new_a;
  const float use_b = new_b == -INFINITY ? 0.0f : new_b;
  const float corr_a = expf(m_a - use_a), corr_b = expf(m_b - use_b);  // 0 on the first keys
  m_a = new_a;
  m_b = new_b;
  float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
    s[j][0] = expf(s[j][0] - use_a);
    s[j][1] = expf(s[j][1] - use_a);
    s[j][2] = expf(s[j][2] - use_b);
    s[j][3] = expf(s[j][3] - use_b);
    sum_a += s[j][0] + s[j][1];
    sum_b += s[j][2] + s[j][3];
  }
  l_a = l_a * corr_a + sum_a;
  l_b = l_b * corr_b + sum_b;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    o[dn][0] *= corr_a;
    o[dn][1] *= corr_a;
    o[dn][2] *= corr_b;
    o[dn][3] *= corr_b;
  }
}

}  // namespace kvb::kernels::cuda::mma
