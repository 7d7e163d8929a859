// exp_fast (kernels/cpu/exp_fast.h), the native path's softmax exponential: its ends by hand,
// its error against the C library's double exp, and exp_fast_floats (whichever path KVB_ISA
// leaves active; this binary also runs as .avx2 and .portable) equal to the one-value definition
// bit for bit, on every float of a range and in blocks of every tail length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "float_bits.h"
#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/isa.h"

namespace kvb::kernels::cpu {
namespace {

using test::bits;
using test::from_bits;

TEST(ExpFast, EndsAndExactValuesByHand) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bits(exp_fast(0.0f)), bits(1.0f));  // n = 0, r = 0: p r^2 + r + 1 = 1 exactly
  EXPECT_EQ(bits(exp_fast(-0.0f)), bits(1.0f));
  EXPECT_EQ(bits(exp_fast(-inf)), bits(0.0f));
  EXPECT_EQ(bits(exp_fast(inf)), bits(inf));
  EXPECT_EQ(bits(exp_fast(-87.31f)), bits(0.0f));  // flushed below -87.3
  EXPECT_GT(exp_fast(-87.29f), 0.0f);
  EXPECT_LT(exp_fast(-87.29f), 1.3e-38f);  // e^-87.29 = 1.19e-38
  EXPECT_EQ(bits(exp_fast(88.38f)), bits(inf));
  EXPECT_TRUE(std::isfinite(exp_fast(88.37f)));
  EXPECT_GT(exp_fast(88.37f), 2.3e38f);  // e^88.37 = 2.39e38, 2^127 times e^r
  // A NaN comes back as it went in, payload and sign included.
  for (uint32_t b : {0x7FC00000u, 0xFFC00123u, 0x7F800001u}) {
    EXPECT_EQ(bits(exp_fast(from_bits(b))), b) << std::hex << b;
  }
  // Powers of two of e: n = round(x log2 e) and 2^n from the exponent bits (1 ulp of e^x).
  EXPECT_NEAR(exp_fast(1.0f), 2.7182817f, 2.4e-7f);
  EXPECT_NEAR(exp_fast(-1.0f), 0.36787944f, 6e-8f);
  EXPECT_NEAR(exp_fast(-10.0f), 4.539993e-5f, 8e-12f);
}

// ulps between a float and a double reference, in the reference's binade.
double ulps(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST(ExpFast, WithinTwoUlpOfExpEverywhereItIsNormal) {
  // Every 61st float of [-87.3, 88.37] (about 36 million: every binade, both signs), against
  // std::exp in double rounded nowhere.
  double worst = 0;
  float worst_x = 0;
  int64_t checked = 0;
  auto sweep = [&](uint32_t lo, uint32_t hi) {
    for (uint64_t b = lo; b <= hi; b += 61) {
      const float x = from_bits(static_cast<uint32_t>(b));
      const double want = std::exp(static_cast<double>(x));
      if (want < std::numeric_limits<float>::min()) continue;  // subnormal results: below
      const double e = ulps(exp_fast(x), want);
      if (e > worst) worst = e, worst_x = x;
      ++checked;
    }
  };
  sweep(0x80000000u, bits(-87.3f));  // -0 .. -87.3 (negative floats grow with their bits)
  sweep(0u, bits(88.37f));
  EXPECT_GT(checked, 30000000);
  EXPECT_LE(worst, 2.0) << "at x = " << std::hexfloat << worst_x;
  // Where results are subnormal (x in [-87.3, -87.34): none, -87.3 is above it) nothing is
  // flushed that a normal float could hold: e^-87.3 > FLT_MIN.
  EXPECT_GT(std::exp(-87.3), static_cast<double>(std::numeric_limits<float>::min()));
}

// exp_fast_floats against exp_fast over the floats whose bits are [lo, hi), in blocks of 1021
// values (not a multiple of 8), every other block in place.
void expect_same_bits(uint32_t lo, uint32_t hi, uint32_t step) {
  constexpr int kBlock = 1021;
  std::vector<float> x(kBlock), y(kBlock);
  int64_t wrong = 0;
  bool in_place = false;
  for (uint64_t b0 = lo; b0 < hi; b0 += static_cast<uint64_t>(kBlock) * step) {
    int n = 0;
    for (; n < kBlock && b0 + static_cast<uint64_t>(n) * step < hi; ++n) {
      x[n] = from_bits(static_cast<uint32_t>(b0 + static_cast<uint64_t>(n) * step));
    }
    if (in_place) {
      y.assign(x.begin(), x.begin() + n);
      exp_fast_floats(y.data(), y.data(), n);
    } else {
      exp_fast_floats(y.data(), x.data(), n);
    }
    in_place = !in_place;
    for (int i = 0; i < n; ++i) {
      if (bits(y[i]) != bits(exp_fast(x[i])) && ++wrong <= 5) {
        ADD_FAILURE() << "exp_fast_floats(" << std::hexfloat << x[i] << ") = " << y[i]
                      << ", exp_fast " << exp_fast(x[i]);
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(ExpFast, EveryPathIsTheDefinitionBitForBit) {
  simd_dispatch_counts() = SimdDispatchCounts{};
  // Every fifth float of [-16, 0] (the softmax's usual x - max: 220 million), then every 97th
  // float of the whole line, NaNs and infinities included.
  expect_same_bits(0x80000000u, bits(-16.0f) + 1, 5);
  expect_same_bits(0u, 0xFFFFFFFFu, 97);
  // Every tail length of a short call.
  const std::vector<float> xs = {-1.5f, 0.25f, -87.31f, 3.0f, -0.0f, 88.38f, -20.0f, 1e-7f, -2.0f};
  for (int n = 0; n <= static_cast<int>(xs.size()); ++n) {
    std::vector<float> y(xs.size(), -1.0f);
    exp_fast_floats(y.data(), xs.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(bits(y[i]), bits(exp_fast(xs[i]))) << n << " " << i;
    for (size_t i = n; i < xs.size(); ++i) EXPECT_EQ(y[i], -1.0f) << "wrote past n = " << n;
  }
  const SimdDispatchCounts c = simd_dispatch_counts();
  const Isa want = active_isa() >= Isa::kAvx2 ? Isa::kAvx2 : Isa::kPortable;
  EXPECT_GT(c.of(SimdKernel::kExpFast, want), 0u);
}

// The shifted form is exp_fast of the rounded difference, on every path and at every tail:
// shifts that make differences exact and ones that round (a max of 3.7 against scores of every
// size), a zero shift, and values past both ends once shifted. In place too (the softmax's use).
TEST(ExpFast, ShiftedIsTheDefinitionOfTheRoundedDifference) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> dist(-30.0f, 30.0f);
  std::vector<float> xs(203);
  for (float& x : xs) x = dist(gen);
  xs[3] = std::nanf("");
  xs[4] = -INFINITY;
  xs[5] = 1e30f;
  for (float shift : {0.0f, 3.7f, -2.5f, 29.99f, 100.0f, -70.0f}) {
    for (int n : {0, 1, 7, 8, 9, 16, 203}) {
      std::vector<float> y(xs.size(), -1.0f), in_place = xs;
      exp_fast_floats_shifted(y.data(), xs.data(), n, shift);
      exp_fast_floats_shifted(in_place.data(), in_place.data(), n, shift);
      for (int i = 0; i < n; ++i) {
        const float want = exp_fast(xs[i] - shift);
        ASSERT_EQ(bits(y[i]), bits(want)) << "shift " << shift << " n " << n << " i " << i;
        ASSERT_EQ(bits(in_place[i]), bits(want)) << "in place, shift " << shift << " i " << i;
      }
      for (size_t i = n; i < xs.size(); ++i) ASSERT_EQ(y[i], -1.0f) << "wrote past n = " << n;
    }
  }
}

}  // namespace
}  // namespace kvb::kernels::cpu
