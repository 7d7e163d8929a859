// exp_floats: std::exp's bits, eight values at a time where AVX-512 or AVX2 can certify them
// (exp_exact.h has the argument).
#include "kernels/cpu/exp_exact.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "kernels/cpu/isa.h"

namespace kvb::kernels::cpu {
namespace {

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// ln 2 split in two doubles (the nearest double, then the remainder): n * ln2 / 16 for integer
// |n| < 2^12 subtracted in two fused steps loses nothing that matters at 2^-42.
constexpr double kLn2Hi = 0x1.62e42fefa39efp-1;
constexpr double kLn2Lo = 0x1.abc9e3b39803fp-56;
constexpr double kShift = 0x1.8p52;  // x + kShift rounds x to an integer, kept in the low bits

struct Exp2Table {  // 2^(i/16), i in [0, 16)
  alignas(64) double t[16];
  Exp2Table() {
    for (int i = 0; i < 16; ++i) t[i] = std::exp2(i / 16.0);
  }
};

// A float keeps the top 23 of a double's 52 fraction bits: the 29 it drops say how far the
// double is from the midpoint between two floats (2^28), in units of the double's last bit.
// Farther than 2^22 of them: more than 2^-31 relative (2^22 / 2^53, the smallest value of a
// binade), over twice glibc's error bound and ours together.
constexpr int64_t kDropped = (int64_t{1} << 29) - 1;
constexpr int64_t kMidpoint = int64_t{1} << 28;
constexpr int64_t kMargin = int64_t{1} << 22;
// Values per chunk of the vector paths: every value from the vector path, the inputs and the
// uncertain lanes kept aside (y may be x), then the uncertain ones replaced by std::exp.
constexpr int kChunk = 512;

// Replaces the uncertain values of a chunk (bit l of unsure[v]: value 8 v + l) by std::exp.
void redo_unsure(float* y, const float* xs, const uint8_t* unsure, int vectors) {
  for (int v = 0; v < vectors; ++v) {
    for (unsigned m = unsure[v]; m != 0; m &= m - 1) {
      const int l = 8 * v + __builtin_ctz(m);
      y[l] = std::exp(xs[l]);
    }
  }
}
#endif

#if defined(__AVX512F__)
// e^x for x in [-87, 88] (other lanes: unspecified values), relative error below 2^-42:
// e^x = 2^(n/16) e^r, n = round(16 x / ln 2), r = x - n ln2 / 16 in [-ln2/32, ln2/32], e^r by
// Taylor to degree 5 (truncation below 2^-42.6), 2^(n/16) = 2^(n >> 4) * 2^((n & 15) / 16).
inline __m512d exp_pd(__m512d x, __m512d t_lo, __m512d t_hi) {
  const __m512d shift = _mm512_set1_pd(kShift);
  const __m512d z = _mm512_mul_pd(x, _mm512_set1_pd(16 / kLn2Hi));
  __m512d nd = _mm512_add_pd(z, shift);
  const __m512i n = _mm512_sub_epi64(_mm512_castpd_si512(nd), _mm512_castpd_si512(shift));
  nd = _mm512_sub_pd(nd, shift);
  __m512d r = _mm512_fnmadd_pd(nd, _mm512_set1_pd(kLn2Hi / 16), x);
  r = _mm512_fnmadd_pd(nd, _mm512_set1_pd(kLn2Lo / 16), r);
  __m512d p = _mm512_set1_pd(1.0 / 120);
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
  const __m512d t = _mm512_permutex2var_pd(t_lo, _mm512_and_si512(n, _mm512_set1_epi64(15)), t_hi);
  const __m512i e =
      _mm512_slli_epi64(_mm512_srai_epi64(n, 4), 52);  // |n| <= 2031: n >> 4 in [-126, 126]
  return _mm512_mul_pd(_mm512_castsi512_pd(_mm512_add_epi64(_mm512_castpd_si512(t), e)), p);
}

void exp_floats_avx512(float* y, const float* x, int n) {
  static const Exp2Table table;
  const __m512d t_lo = _mm512_load_pd(table.t), t_hi = _mm512_load_pd(table.t + 8);
  const __m512d lowest = _mm512_set1_pd(-87.0), highest = _mm512_set1_pd(88.0);
  const __m512i dropped = _mm512_set1_epi64(kDropped);
  const __m512i midpoint = _mm512_set1_epi64(kMidpoint);
  const __m512i margin = _mm512_set1_epi64(kMargin);
  alignas(32) float xs[kChunk];
  uint8_t unsure[kChunk / 8];
  int i = 0;
  while (i + 8 <= n) {
    const int len = std::min(kChunk, (n - i) / 8 * 8);
    for (int v = 0; v < len / 8; ++v) {
      const __m256 xf = _mm256_loadu_ps(x + i + 8 * v);
      const __m512d xd = _mm512_cvtps_pd(xf);
      const __mmask8 in = _mm512_cmp_pd_mask(xd, lowest, _CMP_GE_OQ) &
                          _mm512_cmp_pd_mask(xd, highest, _CMP_LE_OQ);  // NaN: neither
      const __m512d yd = exp_pd(xd, t_lo, t_hi);
      const __m512i off =
          _mm512_sub_epi64(_mm512_and_si512(_mm512_castpd_si512(yd), dropped), midpoint);
      unsure[v] =
          static_cast<uint8_t>(~(in & _mm512_cmpgt_epi64_mask(_mm512_abs_epi64(off), margin)));
      _mm256_store_ps(xs + 8 * v, xf);
      _mm256_storeu_ps(y + i + 8 * v, _mm512_cvtpd_ps(yd));
    }
    redo_unsure(y + i, xs, unsure, len / 8);
    i += len;
  }
  for (; i < n; ++i) y[i] = std::exp(x[i]);
}
#endif  // __AVX512F__

#if defined(__AVX2__) && defined(__FMA__)
// exp_pd's evaluation four doubles at a time, with AVX2's means: the table through a gather, and
// 2^(n >> 4) as (n & ~15) << 48 (the same bits as the arithmetic shift AVX2 lacks for 64-bit
// lanes). The same operations in the same order, so the same doubles and the same certificate.
inline __m256d exp_pd4(__m256d x, const double* table) {
  const __m256d shift = _mm256_set1_pd(kShift);
  const __m256d z = _mm256_mul_pd(x, _mm256_set1_pd(16 / kLn2Hi));
  __m256d nd = _mm256_add_pd(z, shift);
  const __m256i n = _mm256_sub_epi64(_mm256_castpd_si256(nd), _mm256_castpd_si256(shift));
  nd = _mm256_sub_pd(nd, shift);
  __m256d r = _mm256_fnmadd_pd(nd, _mm256_set1_pd(kLn2Hi / 16), x);
  r = _mm256_fnmadd_pd(nd, _mm256_set1_pd(kLn2Lo / 16), r);
  __m256d p = _mm256_set1_pd(1.0 / 120);
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 24));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 6));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.5));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
  const __m256d t = _mm256_i64gather_pd(table, _mm256_and_si256(n, _mm256_set1_epi64x(15)), 8);
  const __m256i e = _mm256_slli_epi64(_mm256_andnot_si256(_mm256_set1_epi64x(15), n), 48);
  return _mm256_mul_pd(_mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(t), e)), p);
}

// Four lanes of exp_pd4 whose doubles are certain to round to glibc's float (movemask bits).
inline int certain4(__m256d xd, __m256d yd) {
  const __m256d in = _mm256_and_pd(_mm256_cmp_pd(xd, _mm256_set1_pd(-87.0), _CMP_GE_OQ),
                                   _mm256_cmp_pd(xd, _mm256_set1_pd(88.0), _CMP_LE_OQ));
  const __m256i off =
      _mm256_sub_epi64(_mm256_and_si256(_mm256_castpd_si256(yd), _mm256_set1_epi64x(kDropped)),
                       _mm256_set1_epi64x(kMidpoint));
  const __m256i far = _mm256_or_si256(_mm256_cmpgt_epi64(off, _mm256_set1_epi64x(kMargin)),
                                      _mm256_cmpgt_epi64(_mm256_set1_epi64x(-kMargin), off));
  return _mm256_movemask_pd(_mm256_and_pd(in, _mm256_castsi256_pd(far)));
}

void exp_floats_avx2(float* y, const float* x, int n) {
  static const Exp2Table table;
  alignas(32) float xs[kChunk];
  uint8_t unsure[kChunk / 8];
  int i = 0;
  while (i + 8 <= n) {
    const int len = std::min(kChunk, (n - i) / 8 * 8);
    for (int v = 0; v < len / 8; ++v) {
      const __m256 xf = _mm256_loadu_ps(x + i + 8 * v);
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(xf));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(xf, 1));
      const __m256d ylo = exp_pd4(lo, table.t), yhi = exp_pd4(hi, table.t);
      unsure[v] = static_cast<uint8_t>(~(certain4(lo, ylo) | (certain4(hi, yhi) << 4)));
      _mm256_store_ps(xs + 8 * v, xf);
      _mm256_storeu_ps(y + i + 8 * v, _mm256_set_m128(_mm256_cvtpd_ps(yhi), _mm256_cvtpd_ps(ylo)));
    }
    redo_unsure(y + i, xs, unsure, len / 8);
    i += len;
  }
  for (; i < n; ++i) y[i] = std::exp(x[i]);
}
#endif  // AVX2 and FMA

// std::exp one value at a time: the path without AVX2.
void exp_floats_portable(float* y, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

}  // namespace

void exp_floats(float* y, const float* x, int n) {
#if defined(__AVX512F__)
  if (active_isa() == Isa::kAvx512) {
    count_dispatch(SimdKernel::kExpFloats, Isa::kAvx512);
    exp_floats_avx512(y, x, n);
    return;
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (active_isa() >= Isa::kAvx2) {
    count_dispatch(SimdKernel::kExpFloats, Isa::kAvx2);
    exp_floats_avx2(y, x, n);
    return;
  }
#endif
  count_dispatch(SimdKernel::kExpFloats, Isa::kPortable);
  exp_floats_portable(y, x, n);
}

}  // namespace kvb::kernels::cpu
