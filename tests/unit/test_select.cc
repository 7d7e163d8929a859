// Tests kvb::kernels::cpu select_topk* / select_argmin against hand-computed selections, with the
// tie rule of POLICIES.md "Ties": equal scores -> the more recent (higher index) is kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/select.h"

namespace kvb::kernels::cpu {
namespace {

std::vector<int32_t> topk(const std::vector<float>& s, int k) {
  std::vector<int32_t> out(s.size() + 1, -7);
  const int m = select_topk(s.data(), static_cast<int>(s.size()), k, out.data());
  out.resize(m);
  return out;
}

using V = std::vector<int32_t>;

TEST(SelectTopk, HandComputed) {
  // scores 3 1 4 1 5 9 2 6: the three largest are 9 (index 5), 6 (7), 5 (4) -> {4, 5, 7}.
  EXPECT_EQ(topk({3, 1, 4, 1, 5, 9, 2, 6}, 3), (V{4, 5, 7}));
  // k = 5 adds 4 (index 2) and 3 (index 0).
  EXPECT_EQ(topk({3, 1, 4, 1, 5, 9, 2, 6}, 5), (V{0, 2, 4, 5, 7}));
}

TEST(SelectTopk, TiesKeepTheMoreRecent) {
  // 2 appears at 1, 2, 3; one slot after the 3 at index 4 (k = 2): the most recent 2 (index 3).
  EXPECT_EQ(topk({1, 2, 2, 2, 3}, 2), (V{3, 4}));
  // All equal: k = 3 keeps the last three.
  EXPECT_EQ(topk({0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, 3), (V{2, 3, 4}));
  // -0 and +0 are equal scores: the later one wins whichever sign it has.
  EXPECT_EQ(topk({0.0f, -0.0f}, 1), (V{1}));
  EXPECT_EQ(topk({-0.0f, 0.0f}, 1), (V{1}));
}

TEST(SelectTopk, SizeEdges) {
  EXPECT_EQ(topk({4, 2, 7}, 3), (V{0, 1, 2}));   // k == n: all
  EXPECT_EQ(topk({4, 2, 7}, 10), (V{0, 1, 2}));  // k > n: all
  EXPECT_EQ(topk({4, 2, 7}, 0), V{});            // k == 0: none
  EXPECT_EQ(topk({4, 2, 7}, -3), V{});           // k < 0: none
  EXPECT_EQ(topk({42}, 1), (V{0}));              // n == 1
  EXPECT_EQ(topk({42}, 0), V{});
  EXPECT_EQ(topk({}, 2), V{});  // n == 0
}

TEST(SelectTopk, InfinitiesAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // NaN ranks below -inf: with k = 2 out of {NaN, -inf, 1, NaN} the picks are -inf (1) and 1 (2).
  EXPECT_EQ(topk({nan, -inf, 1, nan}, 2), (V{1, 2}));
  EXPECT_EQ(topk({1, inf, 2}, 1), (V{1}));
  // Two NaNs, one slot: the tie goes to the later NaN.
  EXPECT_EQ(topk({nan, nan}, 1), (V{1}));
}

TEST(SelectTopk, RangeAndMask) {
  const std::vector<float> s = {9, 1, 5, 5, 2, 8, 7};
  int32_t out[8];
  // Within [1, 5): 1 5 5 2 -> top 2 are the two 5s (indices 2, 3); absolute indices come back.
  ASSERT_EQ(select_topk_range(s.data(), 1, 5, 2, out), 2);
  EXPECT_EQ(V(out, out + 2), (V{2, 3}));
  // Within [1, 5), k = 1: the tie between 5s goes to index 3.
  ASSERT_EQ(select_topk_range(s.data(), 1, 5, 1, out), 1);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(select_topk_range(s.data(), 3, 3, 4, out), 0);  // empty range
  ASSERT_EQ(select_topk_range(s.data(), 4, 7, 9, out), 3);  // k above the range: all of it
  EXPECT_EQ(V(out, out + 3), (V{4, 5, 6}));
  EXPECT_THROW(select_topk_range(s.data(), 5, 4, 1, out), kvb::Error);
  // Mask: eligible 0, 2, 4, 6 (scores 9 5 2 7), k = 2 -> 9 (0) and 7 (6).
  const uint8_t eligible[7] = {1, 0, 1, 0, 1, 0, 1};
  ASSERT_EQ(select_topk_masked(s.data(), eligible, 7, 2, out), 2);
  EXPECT_EQ(V(out, out + 2), (V{0, 6}));
  // k above the eligible count: only the eligible come back.
  ASSERT_EQ(select_topk_masked(s.data(), eligible, 7, 6, out), 4);
  EXPECT_EQ(V(out, out + 4), (V{0, 2, 4, 6}));
  ASSERT_EQ(select_topk_masked(s.data(), nullptr, 7, 1, out), 1);  // nullptr mask: all
  EXPECT_EQ(out[0], 0);
}

TEST(SelectTopk, Rows) {
  // Three heads, ld 4, lengths 4, 2, 3 and budgets 2, 5, 0.
  //   row 0: 0.1 0.4 0.4 0.2 -> k 2: both 0.4s -> {1, 2}
  //   row 1: 3 1 (length 2) -> k 5 > length: {0, 1}
  //   row 2: k 0 -> nothing
  const float scores[12] = {0.1f, 0.4f, 0.4f, 0.2f, 3, 1, 99, 99, 5, 6, 7, 99};
  const int32_t lengths[3] = {4, 2, 3}, k[3] = {2, 5, 0};
  int32_t out[12], counts[3];
  select_topk_rows(scores, 3, 4, lengths, k, out, counts);
  EXPECT_EQ(V(counts, counts + 3), (V{2, 2, 0}));
  EXPECT_EQ(V(out, out + 2), (V{1, 2}));
  EXPECT_EQ(V(out + 4, out + 6), (V{0, 1}));
  const int32_t bad_lengths[3] = {4, 5, 3};  // 5 > ld
  EXPECT_THROW(select_topk_rows(scores, 3, 4, bad_lengths, k, out, counts), kvb::Error);
}

TEST(SelectTopk, MatchesSortedReferenceWithManyTies) {
  // Scores from {0, 1, 2, 3} give many ties; the reference sorts (score desc, index desc).
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> d(0, 3);
  for (int n : {1, 3, 7, 17, 200}) {
    std::vector<float> s(n);
    for (float& x : s) x = static_cast<float>(d(gen));
    for (int k : {0, 1, n / 2, n - 1, n, n + 1}) {
      std::vector<int32_t> order(n);
      for (int i = 0; i < n; ++i) order[i] = i;
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return s[a] != s[b] ? s[a] > s[b] : a > b; });
      order.resize(std::clamp(k, 0, n));
      std::sort(order.begin(), order.end());
      EXPECT_EQ(topk(s, k), order) << "n " << n << " k " << k;
    }
  }
}

TEST(SelectArgmin, HandComputed) {
  // 3 1 2 1: the two 1s tie; the older (index 1) is evicted, the more recent (3) kept.
  const float s[4] = {3, 1, 2, 1};
  EXPECT_EQ(select_argmin(s, nullptr, 4), 1);
  // Index 1 not eligible: the other 1 (index 3).
  const uint8_t e1[4] = {1, 0, 1, 1};
  EXPECT_EQ(select_argmin(s, e1, 4), 3);
  // Only 0 and 2 eligible: 2 (index 2) < 3 (index 0).
  const uint8_t e2[4] = {1, 0, 1, 0};
  EXPECT_EQ(select_argmin(s, e2, 4), 2);
  const uint8_t none[4] = {0, 0, 0, 0};
  EXPECT_EQ(select_argmin(s, none, 4), -1);
  EXPECT_EQ(select_argmin(s, nullptr, 0), -1);
  EXPECT_EQ(select_argmin(s, nullptr, 1), 0);
  // All equal: the oldest goes.
  const float eq[3] = {2, 2, 2};
  EXPECT_EQ(select_argmin(eq, nullptr, 3), 0);
  // NaN ranks lowest, so it is evicted first; -0 and +0 tie (the older goes).
  const float odd[3] = {-1, std::numeric_limits<float>::quiet_NaN(), -2};
  EXPECT_EQ(select_argmin(odd, nullptr, 3), 1);
  const float zeros[2] = {0.0f, -0.0f};
  EXPECT_EQ(select_argmin(zeros, nullptr, 2), 0);
}

TEST(SelectArgmin, ConsistentWithTopk) {
  // Evicting argmin from n tokens leaves exactly the top-(n-1) set.
  const std::vector<float> s = {0.3f, 0.1f, 0.2f, 0.1f, 0.5f, 0.1f};
  const int evict = select_argmin(s.data(), nullptr, 6);
  EXPECT_EQ(evict, 1);
  EXPECT_EQ(topk(s, 5), (V{0, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace kvb::kernels::cpu
