// e^x in float arithmetic, the same bits on every path: the softmax's exponential under
// --dtype native (llama.cpp's arithmetic family; its softmax takes a float polynomial exp too).
//
// Why: exp_floats (exp_exact.h) returns the C library's expf bits by evaluating in double and
// certifying the rounding; on an AVX2-only CPU that is about 5 cycles a value, 15-20% of an
// 8K-token prefill on SmolLM2. The f32 path keeps those bits (it is the reference); the native
// path, whose products are already llama.cpp's quantized ones, takes this one: 0.45 ns a value
// against exp_floats' 1.6 on that CPU (3.6x; 4,096 values a call, one thread).
//
// Definition (exp_fast below; the AVX2 path performs the same IEEE operations in the same
// order, so it returns the same bits, and test_exp_fast checks that on every path):
//   NaN -> the input unchanged; x < -87.3 (and -inf) -> +0; x > 88.37 (and +inf) -> +inf;
//   otherwise n = round(x log2 e) (by adding 1.5 * 2^23 in one fused multiply-add), r = x - n ln2
//   in two fused steps (Cody-Waite: ln2 = 0.693359375 - 2.12194440e-4), Cephes' degree-5
//   polynomial for e^r on [-ln2/2, ln2/2] by Horner in fused multiply-adds, e^r = p r^2 + r + 1,
//   times 2^n made from its exponent bits.
// Error: within 2 ulp of e^x on [-87.3, 88.37] (test_exp_fast measures it against
// std::exp). Results below e^-87.3 (about 1.2e-38, where floats turn subnormal) are flushed to 0:
// a probability that small is 0 to every consumer.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvb::kernels::cpu {

namespace exp_fast_detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kShift = 0x1.8p23f;  // x + kShift rounds x to an integer, kept in the low bits
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kLowest = -87.3f;   // below: +0
constexpr float kHighest = 88.37f;  // below 127.5 ln 2, so n <= 127; above: +inf
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
}  // namespace exp_fast_detail

// The definition, one value (the portable path).
inline float exp_fast(float x) {
  namespace d = exp_fast_detail;
  if (x != x) return x;
  if (x < d::kLowest) return 0.0f;
  if (x > d::kHighest) return HUGE_VALF;
  const float z = std::fma(x, d::kLog2e, d::kShift);
  const float n = z - d::kShift;
  float r = std::fma(n, -d::kLn2Hi, x);
  r = std::fma(n, -d::kLn2Lo, r);
  float p = std::fma(d::kP0, r, d::kP1);
  p = std::fma(p, r, d::kP2);
  p = std::fma(p, r, d::kP3);
  p = std::fma(p, r, d::kP4);
  p = std::fma(p, r, d::kP5);
  const float r2 = r * r;
  p = std::fma(p, r2, r) + 1.0f;
  uint32_t zb;
  std::memcpy(&zb, &z, 4);
  const uint32_t sb = (zb - 0x4B400000u + 127u) << 23;  // 2^n: n in [-126, 127]
  float s;
  std::memcpy(&s, &sb, 4);
  return p * s;
}

// y[i] = exp_fast(x[i]) for i in [0, n), bit for bit on every path; y may be x.
void exp_fast_floats(float* y, const float* x, int n);

// y[i] = exp_fast(x[i] - shift), the difference rounded to float first: exp_fast_floats of the
// differences in one pass (the softmax's p = exp(p - max) without a pass that writes p - max).
// y may be x.
void exp_fast_floats_shifted(float* y, const float* x, int n, float shift);

}  // namespace kvb::kernels::cpu
