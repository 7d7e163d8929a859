// Tests kvb::kernels::cpu::pool1d against hand-computed windows, edges included: max pooling
// ignores the padding, avg pooling divides by the kernel size (PyTorch count_include_pad=True).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/pool.h"

namespace kvb::kernels::cpu {
namespace {

std::vector<float> pool(const std::vector<float>& in, int rows, int kernel, PoolKind kind) {
  std::vector<float> out(in.size(), -123.0f);
  pool1d(in.data(), out.data(), rows, static_cast<int>(in.size()) / rows, kernel, kind);
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "at " << i;
}

TEST(Pool1d, MaxKernel3) {
  // in 1 3 2 5 4, kernel 3 (pad 1): windows [0,1] [0,2] [1,3] [2,4] [3,4]
  //   -> max(1,3)=3, max(1,3,2)=3, max(3,2,5)=5, max(2,5,4)=5, max(5,4)=5
  expect_near(pool({1, 3, 2, 5, 4}, 1, 3, PoolKind::kMax), {3, 3, 5, 5, 5});
}

TEST(Pool1d, AvgKernel3CountsPadding) {
  // Same windows, every sum divided by 3: (1+3)/3, (1+3+2)/3, (3+2+5)/3, (2+5+4)/3, (5+4)/3.
  expect_near(pool({1, 3, 2, 5, 4}, 1, 3, PoolKind::kAvg),
              {4.0f / 3, 2.0f, 10.0f / 3, 11.0f / 3, 3.0f});
}

TEST(Pool1d, AvgKernel5BothEdges) {
  // in 1..6, kernel 5 (pad 2): windows [0,2] [0,3] [0,4] [1,5] [2,5] [3,5]
  //   sums 6, 10, 15, 20, 18, 15 -> /5: 1.2, 2, 3, 4, 3.6, 3
  expect_near(pool({1, 2, 3, 4, 5, 6}, 1, 5, PoolKind::kAvg), {1.2f, 2, 3, 4, 3.6f, 3});
  // max: 3, 4, 5, 6, 6, 6
  expect_near(pool({1, 2, 3, 4, 5, 6}, 1, 5, PoolKind::kMax), {3, 4, 5, 6, 6, 6});
}

TEST(Pool1d, MaxIgnoresPaddingWithNegatives) {
  // All negative: a zero pad would win if it counted. -1 -2 -3, kernel 3:
  //   max: max(-1,-2)=-1, max(-1,-2,-3)=-1, max(-2,-3)=-2
  //   avg: (-1-2)/3=-1, (-1-2-3)/3=-2, (-2-3)/3=-5/3
  expect_near(pool({-1, -2, -3}, 1, 3, PoolKind::kMax), {-1, -1, -2});
  expect_near(pool({-1, -2, -3}, 1, 3, PoolKind::kAvg), {-1, -2, -5.0f / 3});
}

TEST(Pool1d, KernelLongerThanRow) {
  // n = 3, kernel 7 (pad 3): every window covers the whole row.
  //   max 3 everywhere; avg (1+2+3)/7 = 6/7 everywhere.
  expect_near(pool({1, 2, 3}, 1, 7, PoolKind::kMax), {3, 3, 3});
  expect_near(pool({1, 2, 3}, 1, 7, PoolKind::kAvg), {6.0f / 7, 6.0f / 7, 6.0f / 7});
  // n = 1: the single value (max) and value / kernel (avg).
  expect_near(pool({2}, 1, 7, PoolKind::kMax), {2});
  expect_near(pool({2}, 1, 7, PoolKind::kAvg), {2.0f / 7});
}

TEST(Pool1d, Kernel7SnapKvDefault) {
  // n = 9, one spike at index 4: max-pool kernel 7 spreads it to indices 1..7 (|j - 4| <= 3).
  expect_near(pool({0, 0, 0, 0, 1, 0, 0, 0, 0}, 1, 7, PoolKind::kMax), {0, 1, 1, 1, 1, 1, 1, 1, 0});
}

TEST(Pool1d, RowsAreIndependentAndKernel1IsIdentity) {
  // Two rows of 3: pooling never crosses from row 0 (1 9 1) into row 1 (0 0 5).
  expect_near(pool({1, 9, 1, 0, 0, 5}, 2, 3, PoolKind::kMax), {9, 9, 9, 0, 5, 5});
  expect_near(pool({1, 9, 1, 0, 0, 5}, 2, 3, PoolKind::kAvg),
              {10.0f / 3, 11.0f / 3, 10.0f / 3, 0, 5.0f / 3, 5.0f / 3});
  expect_near(pool({0.25f, -7, 3}, 1, 1, PoolKind::kAvg), {0.25f, -7, 3});
  expect_near(pool({0.25f, -7, 3}, 1, 1, PoolKind::kMax), {0.25f, -7, 3});
}

TEST(Pool1d, NaNPropagatesInMax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto out = pool({1, nan, 2, 3, 4}, 1, 3, PoolKind::kMax);
  // Windows touching index 1 (j = 0, 1, 2) are NaN; j = 3: max(2,3,4) = 4; j = 4: 4.
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]) && std::isnan(out[2]));
  EXPECT_FLOAT_EQ(out[3], 4);
  EXPECT_FLOAT_EQ(out[4], 4);
}

TEST(Pool1d, Validation) {
  std::vector<float> in(4, 1.0f), out(4);
  EXPECT_THROW(pool1d(in.data(), out.data(), 1, 4, 4, PoolKind::kMax), kvb::Error);  // even
  EXPECT_THROW(pool1d(in.data(), out.data(), 1, 4, 0, PoolKind::kMax), kvb::Error);
  EXPECT_THROW(pool1d(in.data(), in.data(), 1, 4, 3, PoolKind::kMax), kvb::Error);  // alias
  EXPECT_THROW(pool1d(in.data(), in.data() + 1, 1, 3, 3, PoolKind::kAvg), kvb::Error);
  EXPECT_NO_THROW(pool1d(in.data(), out.data(), 0, 4, 3, PoolKind::kMax));  // empty
}

}  // namespace
}  // namespace kvb::kernels::cpu
