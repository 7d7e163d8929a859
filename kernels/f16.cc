// f16 <-> f32 by their bit patterns (kernels/f16.h).
#include "kernels/f16.h"

#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace kvb::kernels {

uint16_t f32_to_f16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // infinity, or NaN: quiet, the payload's top bits
    if (a == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520: rounds past 65504, to infinity
  if (a >= 0x38800000u) {                       // >= 2^-14: a normal f16
    // Round the 23-bit mantissa to 10 at bit 13, ties to even (a carry rolls into the exponent),
    // then rebias the exponent from 127 to 15.
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  // Below 2^-14: a multiple of 2^-24 (an f16 subnormal; 1024 x 2^-24 is the least normal, whose
  // encoding the count continues into). x = m x 2^(e - 150), m with its implicit bit.
  const int e = static_cast<int>(a >> 23);
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const int shift = 126 - e;  // 14..24: x / 2^-24 = m / 2^shift
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
  return static_cast<uint16_t>(sign | q);
}

// F16C's conversions where the build has them (an exact conversion and one rounding: the same
// bits as the scalar definitions, which test_f16 checks for every f16 and for f32 edge cases).
void f32_to_f16(const float* x, uint16_t* y, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
#endif
  for (; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

void f16_to_f32(const uint16_t* x, float* y, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

}  // namespace kvb::kernels
