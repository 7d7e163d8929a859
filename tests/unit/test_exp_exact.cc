// exp_floats (kernels/cpu/exp_exact.h) against the C library's expf, bit for bit: every float of
// [-87.5, 88.5] (the softmax's x - max <= 0 and SiLU's -g; the fast path takes [-87, 88]), in
// shards that ctest runs side by side, and the values outside it (which take std::exp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/exp_exact.h"
#include "float_bits.h"

namespace kvb::kernels::cpu {
namespace {

using test::bits;
using test::from_bits;

// Compares exp_floats with std::exp over the floats whose bits are [lo, hi) (a run of negative
// floats: -0 is 0x80000000, more negative values have larger bits), in blocks whose length is
// not a multiple of 8 (the tail path too), half of them in place.
void expect_bits_over(uint32_t lo, uint32_t hi) {
  constexpr int kBlock = 4099;
  std::vector<float> x(kBlock), y(kBlock);
  int64_t wrong = 0;
  bool in_place = false;
  for (uint64_t b0 = lo; b0 < hi; b0 += kBlock) {
    const int n = static_cast<int>(std::min<uint64_t>(kBlock, hi - b0));
    for (int i = 0; i < n; ++i) x[i] = from_bits(static_cast<uint32_t>(b0 + i));
    if (in_place) {
      y.assign(x.begin(), x.begin() + n);
      exp_floats(y.data(), y.data(), n);
    } else {
      exp_floats(y.data(), x.data(), n);
    }
    in_place = !in_place;
    for (int i = 0; i < n; ++i) {
      const float want = std::exp(x[i]);
      if (bits(y[i]) != bits(want)) {
        if (++wrong <= 5) {
          ADD_FAILURE() << "exp(" << std::hexfloat << x[i] << ") = " << y[i] << ", std::exp "
                        << want;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

constexpr int kShards = 8;
class ExpFloatsShard : public ::testing::TestWithParam<int> {};

// Shards 0 .. kShards-1: [-87.5, -0]; kShards .. 2 kShards-1: [+0, 88.5] (SiLU's exp(-g)).
TEST_P(ExpFloatsShard, EveryFloatOfTheFastDomainIsStdExp) {
  const bool negative = GetParam() < kShards;
  const uint32_t lo = negative ? 0x80000000u : 0u;                        // -0 or +0
  const uint32_t hi = (negative ? bits(-87.5f) : bits(88.5f)) + 1;  // through -87.5, 88.5
  const uint32_t per = (hi - lo + kShards - 1) / kShards;
  const uint32_t a = lo + per * (GetParam() % kShards);
  expect_bits_over(a, std::min(hi, a + per));
}
INSTANTIATE_TEST_SUITE_P(ExpFloats, ExpFloatsShard, ::testing::Range(0, 2 * kShards));

TEST(ExpFloats, OutsideTheDomainIsStdExp) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf,
                          inf,
                          std::nanf(""),
                          -std::nanf(""),
                          0.0f,
                          -0.0f,
                          -87.0f,
                          std::nextafter(-87.0f, 0.0f),
                          std::nextafter(-87.0f, -inf),
                          -88.0f,
                          -103.9f,
                          -104.0f,
                          -150.0f,
                          -1e30f,
                          1e-45f,
                          1e-30f,
                          0.5f,
                          1.0f,
                          10.0f,
                          88.0f,
                          88.8f,
                          100.0f,
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 9; ++i) x.push_back(-1.0f - i);  // a full vector of in-domain values
  std::vector<float> y(x.size());
  exp_floats(y.data(), x.data(), static_cast<int>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(bits(y[i]), bits(std::exp(x[i]))) << std::hexfloat << x[i];
  }
  exp_floats(y.data(), x.data(), 0);  // nothing to do
  // Positive and huge-negative floats, a stride through them.
  int64_t wrong = 0;
  std::vector<float> xs, ys;
  for (uint64_t b = 0; b < 0x100000000ull; b += 65537) {
    const float v = from_bits(static_cast<uint32_t>(b));
    if (v >= -87.5f && v <= 88.5f) continue;  // the shards' ranges
    xs.push_back(v);
  }
  ys.resize(xs.size());
  exp_floats(ys.data(), xs.data(), static_cast<int>(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    wrong += bits(ys[i]) != bits(std::exp(xs[i]));
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(xs.size(), 30000u);
}

}  // namespace
}  // namespace kvb::kernels::cpu
