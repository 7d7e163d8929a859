// exp_fast_floats: exp_fast (exp_fast.h) eight values at a time where AVX2 is, one at a time
// otherwise; the same IEEE operations in the same order, so the same bits.
#include "kernels/cpu/exp_fast.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/cpu/isa.h"

namespace kvb::kernels::cpu {
namespace {

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 exp_fast8(__m256 x) {
  namespace d = exp_fast_detail;
  const __m256 shift = _mm256_set1_ps(d::kShift);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(d::kLog2e), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-d::kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-d::kLn2Lo), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(d::kP0), r, _mm256_set1_ps(d::kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(d::kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(d::kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(d::kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(d::kP5));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i sb = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(z), _mm256_set1_epi32(0x4B400000)),
                       _mm256_set1_epi32(127)),
      23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(sb));
  // The ends, then NaN (last: a NaN input compares false with both ends).
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(),
                       _mm256_cmp_ps(x, _mm256_set1_ps(d::kLowest), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(HUGE_VALF),
                       _mm256_cmp_ps(x, _mm256_set1_ps(d::kHighest), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

void exp_fast_floats_avx2(float* y, const float* x, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_fast8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = exp_fast(x[i]);
}

void exp_fast_floats_shifted_avx2(float* y, const float* x, int n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, exp_fast8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  }
  for (; i < n; ++i) y[i] = exp_fast(x[i] - shift);
}
#endif

}  // namespace

void exp_fast_floats(float* y, const float* x, int n) {
#if defined(__AVX2__) && defined(__FMA__)
  if (active_isa() >= Isa::kAvx2) {
    count_dispatch(SimdKernel::kExpFast, Isa::kAvx2);
    exp_fast_floats_avx2(y, x, n);
    return;
  }
#endif
  count_dispatch(SimdKernel::kExpFast, Isa::kPortable);
  for (int i = 0; i < n; ++i) y[i] = exp_fast(x[i]);
}

void exp_fast_floats_shifted(float* y, const float* x, int n, float shift) {
#if defined(__AVX2__) && defined(__FMA__)
  if (active_isa() >= Isa::kAvx2) {
    count_dispatch(SimdKernel::kExpFast, Isa::kAvx2);
    exp_fast_floats_shifted_avx2(y, x, n, shift);
    return;
  }
#endif
  count_dispatch(SimdKernel::kExpFast, Isa::kPortable);
  for (int i = 0; i < n; ++i) y[i] = exp_fast(x[i] - shift);
}

}  // namespace kvb::kernels::cpu
