// The fixed summation tree of matmul.h's contract (16 lanes of k, then pairs 8, 4, 2, 1), one
// definition for matmul.cc and matmul_bf16.cc, whose results must agree bit for bit.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVB_MATMUL_TREE_AVX512 1
#endif

namespace kvb::kernels::cpu::detail {

constexpr int kLanes = 16;  // the lane split of k (one zmm of f32)

// The tree over the 16 lane sums; a: [16].
inline float reduce_lanes(const float* a) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#if defined(KVB_MATMUL_TREE_AVX512)
// GCC 12 warns that _mm512_undefined_ps (inside _mm512_shuffle_f32x4) is uninitialized once
// inlined: a false positive (GCC PR 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Reduces 16 lane vectors a[r + 4 * c] with the tree, transposed so that the 16 trees run side
// by side: 128-bit lane r of the result holds the dots (r, c = 0..3). Pairings match
// reduce_lanes exactly (f32 addition is commutative bit for bit), so the bits are the same.
// Callable from code built for AVX-512 or from functions with an AVX-512 target attribute.
__attribute__((target("avx512f"))) inline __m512 reduce16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int t = 0; t < 8; ++t) {  // b[t] = [s8 of a[2t] | s8 of a[2t+1]]
    b[t] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * t], a[2 * t + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * t], a[2 * t + 1], 0xEE));
  }
  for (int u = 0; u < 4; ++u) {  // c[u] = [s4 of a[4u] | a[4u+1] | a[4u+2] | a[4u+3]]
    c[u] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * u], b[2 * u + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * u], b[2 * u + 1], 0xDD));
  }
  for (int v = 0; v < 2; ++v) {  // d[v] lane L = [s2 of a[8v+L] (2) | s2 of a[8v+4+L] (2)]
    d[v] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * v], c[2 * v + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * v], c[2 * v + 1], 0xEE));
  }
  // lane L = [a[L], a[4+L], a[8+L], a[12+L]]
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}
#pragma GCC diagnostic pop
#endif

#if defined(__AVX2__)
// The tree over eight dots' lane sums at once, with AVX2's eight lanes: dot j's 16 lane sums are
// two vectors (lanes 0-7 and 8-15) whose sum s8[j] is the tree's first level, and the eight s8
// reduce side by side with reduce_lanes' pairings (s4[l] = s8[l] + s8[l + 4], then
// (s4[0] + s4[2]) + (s4[1] + s4[3])), so every dot has reduce_lanes' bits. Returns the eight dots
// in order.
inline __m256 reduce8(const __m256* s8) {
  __m256 s4[4];
  for (int u = 0; u < 4; ++u) {  // [s4 of dot 2u | s4 of dot 2u + 1]
    s4[u] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * u], s8[2 * u + 1], 0x20),
                          _mm256_permute2f128_ps(s8[2 * u], s8[2 * u + 1], 0x31));
  }
  // Halves: [s4[0] + s4[2], s4[1] + s4[3]] of dots (0, 2) | (1, 3), then (4, 6) | (5, 7).
  const __m256 t1 =
      _mm256_add_ps(_mm256_shuffle_ps(s4[0], s4[1], 0x44), _mm256_shuffle_ps(s4[0], s4[1], 0xEE));
  const __m256 t2 =
      _mm256_add_ps(_mm256_shuffle_ps(s4[2], s4[3], 0x44), _mm256_shuffle_ps(s4[2], s4[3], 0xEE));
  // [dots 0, 2, 4, 6 | 1, 3, 5, 7], then in order.
  const __m256 dots =
      _mm256_add_ps(_mm256_shuffle_ps(t1, t2, 0x88), _mm256_shuffle_ps(t1, t2, 0xDD));
  return _mm256_permutevar8x32_ps(dots, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

}  // namespace kvb::kernels::cpu::detail
