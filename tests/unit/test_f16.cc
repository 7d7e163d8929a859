// kernels/f16.h: f32 -> f16 rounding to nearest even and the exact f16 -> f32, against an
// independent search (the nearest of the two f16 values around x, found by bisection over the
// ordered f16 values, ties to the even encoding), hand-computed cases at every boundary, and
// the bulk conversions against the scalar ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/f16.h"
#include "float_bits.h"

namespace kvb::kernels {
namespace {

using test::bits;
using test::from_bits;

// The f16 nearest to finite x >= 0, by search: the positive finite f16 encodings 0..0x7BFF are in
// increasing order of value; beyond 65504 a value rounds to infinity from the midpoint 65520 on.
uint16_t nearest_by_search(double x) {
  if (x >= 65520.0) return 0x7C00;
  int lo = 0, hi = 0x7BFF;  // the largest encoding whose value is <= x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<double>(f16_to_f32(static_cast<uint16_t>(mid))) <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (lo == 0x7BFF) return 0x7BFF;
  const double a = f16_to_f32(static_cast<uint16_t>(lo)), b = f16_to_f32(static_cast<uint16_t>(lo + 1));
  if (x - a < b - x) return static_cast<uint16_t>(lo);
  if (x - a > b - x) return static_cast<uint16_t>(lo + 1);
  return static_cast<uint16_t>(lo % 2 == 0 ? lo : lo + 1);  // a tie: the even encoding
}

TEST(F16, HandComputedCases) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);       // the largest finite
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7BFF);     // just below the midpoint to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);       // the midpoint: to even, which is infinity
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);   // the least normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);   // the least subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);   // half of it: a tie, to even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);   // above the tie
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);   // 1.5 units: a tie, to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // the last subnormal tie: to normal
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // a tie: to even (1.0)
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);      // a tie: to even (1 + 2^-9)
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(f32_to_f16(2047.5f), 0x6800);  // 2048 - 0.5: ulp 1 above 1024, a tie to 2048 (even)
  // NaN: quiet, the sign and the payload's top bits kept (F16C's vcvtps2ph).
  EXPECT_EQ(f32_to_f16(from_bits(0x7FC00000u)), 0x7E00);
  EXPECT_EQ(f32_to_f16(from_bits(0xFF800001u)), 0xFE00);  // signalling, payload below bit 13
  EXPECT_EQ(f32_to_f16(from_bits(0x7FA02000u)), 0x7F01);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);
}

// Every f16 value converts to f32 and back to itself (NaNs to a quiet NaN of the same sign).
TEST(F16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float x = f16_to_f32(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(x)) << h;
      ASSERT_EQ(f32_to_f16(x), h | 0x200) << h;
    } else {
      ASSERT_EQ(f32_to_f16(x), h) << h;
      if (h != 0x7C00 && h != 0xFC00) {  // finite: the search finds it too
        ASSERT_EQ(nearest_by_search(std::fabs(static_cast<double>(x))), h & 0x7FFF) << h;
      }
    }
  }
}

// Random f32 values of every magnitude f16 covers (and beyond), and the exact midpoints between
// neighbouring f16 values, round as the search says.
TEST(F16, RandomValuesAndMidpointsRoundToTheNearestEven) {
  std::mt19937 rng(20261205);
  std::uniform_int_distribution<uint32_t> any(0, 0x7F7FFFFFu);
  std::uniform_int_distribution<uint32_t> f16_range(0x33000000u, 0x47800000u);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t b = i % 4 == 0 ? any(rng) : f16_range(rng);
    const float x = from_bits(b);
    const uint16_t want = nearest_by_search(x);
    ASSERT_EQ(f32_to_f16(x), want) << x << " (0x" << std::hex << b << ")";
    ASSERT_EQ(f32_to_f16(-x), want | 0x8000) << -x;
  }
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const double mid = (static_cast<double>(f16_to_f32(static_cast<uint16_t>(h))) +
                        f16_to_f32(static_cast<uint16_t>(h + 1))) / 2;
    const float x = static_cast<float>(mid);
    if (static_cast<double>(x) != mid) continue;  // not an f32 (never, in f16's range)
    ASSERT_EQ(f32_to_f16(x), h % 2 == 0 ? h : h + 1) << "midpoint after 0x" << std::hex << h;
  }
}

// The bulk conversions (F16C where the build has it) give the scalar bits, every length.
TEST(F16, BulkConversionsAreTheScalarOnes) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFFFFFFu);
  for (const size_t n : {0, 1, 7, 8, 9, 64, 133}) {
    std::vector<float> x(n), back(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t b = any(rng);
      x[i] = i % 5 == 0 ? from_bits(b) : std::ldexp(static_cast<float>(b % 4096) - 2048.0f,
                                                      static_cast<int>(b % 40) - 30);
    }
    std::vector<uint16_t> h(n);
    f32_to_f16(x.data(), h.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], f32_to_f16(x[i])) << n << " " << i;
    f16_to_f32(h.data(), back.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits(back[i]), bits(f16_to_f32(h[i]))) << n << " " << i;
  }
}

}  // namespace
}  // namespace kvb::kernels
