// exp_floats: std::exp's bits, eight values at a time where AVX-512 can certify them
// (exp_exact.h has the argument).
#include "kernels/cpu/exp_exact.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/cpu/isa.h"

namespace kvb::kernels::cpu {
namespace {

#if defined(__AVX512F__)
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
  // A float keeps the top 23 of a double's 52 fraction bits: the 29 it drops say how far the
  // double is from the midpoint between two floats (2^28), in units of the double's last bit.
  // Farther than 2^22 of them: more than 2^-31 relative (2^22 / 2^53, the smallest value of a
  // binade), over twice glibc's error bound and ours together.
  const __m512i dropped = _mm512_set1_epi64((int64_t{1} << 29) - 1);
  const __m512i midpoint = _mm512_set1_epi64(int64_t{1} << 28);
  const __m512i margin = _mm512_set1_epi64(int64_t{1} << 22);
  // Per chunk: every value from the vector path, the inputs and the uncertain lanes kept aside
  // (y may be x), then the uncertain ones replaced by std::exp.
  constexpr int kChunk = 512;
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
    for (int v = 0; v < len / 8; ++v) {
      for (unsigned m = unsure[v]; m != 0; m &= m - 1) {
        const int l = 8 * v + __builtin_ctz(m);
        y[i + l] = std::exp(xs[l]);
      }
    }
    i += len;
  }
  for (; i < n; ++i) y[i] = std::exp(x[i]);
}
#endif  // __AVX512F__

// std::exp one value at a time: the path without AVX-512 (no AVX2 one: isa.h).
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
  count_dispatch(SimdKernel::kExpFloats, Isa::kPortable);
  exp_floats_portable(y, x, n);
}

}  // namespace kvb::kernels::cpu
