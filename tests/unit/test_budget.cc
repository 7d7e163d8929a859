// Tests the budget arithmetic of kernels/cpu/budget.h against hand-computed values: the integer
// splits of POLICIES.md "Integer budgets", pyramidkv's per-layer budgets and Ada-KV's per-head
// allocation (global top-k counts, alpha floor, round half to even, capping).
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/budget.h"

namespace kvb::kernels::cpu {
namespace {

using V = std::vector<int32_t>;

TEST(IntegerBudgets, HeavyRecent) {
  auto split = [](int b, double f) {
    const HeavyRecentSplit s = split_heavy_recent(b, f);
    return V{s.heavy, s.recent};
  };
  EXPECT_EQ(split(10, 0.5), (V{5, 5}));
  EXPECT_EQ(split(7, 0.5), (V{3, 4}));  // floor(3.5) = 3 heavy, the rest recent
  EXPECT_EQ(split(128, 0.5), (V{64, 64}));
  EXPECT_EQ(split(10, 0.25), (V{2, 8}));  // floor(2.5)
  EXPECT_EQ(split(0, 0.5), (V{0, 0}));
  EXPECT_EQ(split(9, 0.0), (V{0, 9}));
  EXPECT_EQ(split(9, 1.0), (V{9, 0}));
  EXPECT_THROW(split_heavy_recent(10, 1.5), kvb::Error);
  EXPECT_THROW(split_heavy_recent(-1, 0.5), kvb::Error);
}

TEST(IntegerBudgets, Scissorhands) {
  auto split = [](int b) {
    const ScissorhandsSplit s = scissorhands_split(b);
    return V{s.recent, s.drop};
  };
  EXPECT_EQ(split(100), (V{25, 50}));   // min(32, 25), 50
  EXPECT_EQ(split(200), (V{32, 100}));  // min(32, 50), 100
  EXPECT_EQ(split(129), (V{32, 64}));   // min(32, 32), floor(64.5)
  EXPECT_EQ(split(7), (V{1, 3}));       // floor(1.75), floor(3.5)
  EXPECT_EQ(split(2), (V{0, 1}));
  EXPECT_THROW(scissorhands_split(1), kvb::Error);  // drop would be 0
}

TEST(IntegerBudgets, SnapKvWindow) {
  EXPECT_EQ(snapkv_window(128, 32), 32);  // min(32, 64)
  EXPECT_EQ(snapkv_window(40, 32), 20);   // min(32, 20)
  EXPECT_EQ(snapkv_window(41, 32), 20);   // floor(41/2)
  EXPECT_EQ(snapkv_window(64, 8), 8);
  EXPECT_EQ(snapkv_window(3, 32), 1);  // min(32, 1)
  EXPECT_EQ(snapkv_window(1, 32), 1);  // min(32, 0) = 0, raised to 1
  EXPECT_THROW(snapkv_window(128, 0), kvb::Error);
  EXPECT_THROW(snapkv_window(0, 32), kvb::Error);
}

TEST(IntegerBudgets, SubgenKCenter) {
  auto split = [](int b, int r) {
    const KCenterSplit s = subgen_kcenter_split(b, r);
    return V{s.recent, s.centres};
  };
  EXPECT_EQ(split(128, -1), (V{64, 64}));
  EXPECT_EQ(split(7, -1), (V{3, 4}));  // recent floor(3.5), centres the rest
  EXPECT_EQ(split(10, 4), (V{4, 6}));
  EXPECT_EQ(split(10, 10), (V{10, 0}));
  EXPECT_THROW(subgen_kcenter_split(10, 11), kvb::Error);
}

TEST(PyramidKv, LongPrompt) {
  // B 128, w 32, n 1000, L 30: base 96, min 96/20 = 4, max 2*96 - 4 = 188 < n - w = 968;
  // step (188 - 4) / 29 = 184 / 29 = 6; layer l selects 188 - 6 l: 188, 182, ..., 14.
  const V b = pyramid_layer_budgets(128, 32, 1000, 30);
  ASSERT_EQ(b.size(), 30u);
  for (int l = 0; l < 30; ++l) EXPECT_EQ(b[l], 188 - 6 * l) << "layer " << l;
  EXPECT_EQ(b.back(), 14);
  // Sum 30*188 - 6*(0+...+29) = 5640 - 2610 = 3030: mean 101 > base 96, as the spec warns.
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 3030);
}

TEST(PyramidKv, MatchesTheReferenceTableForL32) {
  // The Ada-KV digest's table (L = 32, long inputs), window included: 128h -> layer 0 220,
  // layer 31 65 (step 184/31 = 5: 188 - 155 = 33, +32); 256h -> base 224, min 11, max 437,
  // step 426/31 = 13: layer 0 469, layer 31 437 - 403 + 32 = 66.
  const V b128 = pyramid_layer_budgets(128, 32, 100000, 32);
  EXPECT_EQ(b128.front() + 32, 220);
  EXPECT_EQ(b128.back() + 32, 65);
  const V b256 = pyramid_layer_budgets(256, 32, 100000, 32);
  EXPECT_EQ(b256.front() + 32, 469);
  EXPECT_EQ(b256.back() + 32, 66);
}

TEST(PyramidKv, MaxClampedToPrefix) {
  // B 128, w 32, n 200: max 188 >= n - w = 168 -> max 168, min 2*96 - 168 = 24;
  // step (168 - 24) / 29 = 144 / 29 = 4; layer l selects 168 - 4 l: 168, ..., 52.
  const V b = pyramid_layer_budgets(128, 32, 200, 30);
  for (int l = 0; l < 30; ++l) EXPECT_EQ(b[l], 168 - 4 * l) << "layer " << l;
  // Just above the budget, n 129: max 97, min 95, step 2 / 29 = 0: every layer keeps 97 = n - w.
  EXPECT_EQ(pyramid_layer_budgets(128, 32, 129, 30), V(30, 97));
}

TEST(PyramidKv, ShortPromptIsNotCompressed) {
  // n 100 <= B 128: no compression; every layer keeps the whole prefix n - w = 68.
  EXPECT_EQ(pyramid_layer_budgets(128, 32, 100, 30), V(30, 68));
  EXPECT_EQ(pyramid_layer_budgets(128, 32, 128, 4), V(4, 96));
  EXPECT_EQ(pyramid_layer_budgets(128, 32, 20, 2), V(2, 0));  // prompt shorter than the window
}

TEST(PyramidKv, SingleLayerAndValidation) {
  // L 1: layer 0 selects max - 0*step = max = 188 (n 1000), or 168 when clamped (n 200).
  EXPECT_EQ(pyramid_layer_budgets(128, 32, 1000, 1), (V{188}));
  EXPECT_EQ(pyramid_layer_budgets(128, 32, 200, 1), (V{168}));
  // beta 1: min = base = 96, max = 96, step 0: all layers 96 (plain SnapKV).
  EXPECT_EQ(pyramid_layer_budgets(128, 32, 1000, 3, 1), V(3, 96));
  EXPECT_THROW(pyramid_layer_budgets(128, 32, 1000, 0), kvb::Error);
  EXPECT_THROW(pyramid_layer_budgets(128, 32, 1000, 4, 0), kvb::Error);
  EXPECT_THROW(pyramid_layer_budgets(16, 32, 1000, 4), kvb::Error);  // window > budget
}

// Three heads of three prefix tokens (slot index = position):
//   head 0: 0.9 0.2 0.4
//   head 1: 0.4 0.8 0.4
//   head 2: 0.7 0.4 0.6
// Global order: h0p0 .9, h1p1 .8, h2p0 .7, h2p2 .6, then the 0.4s by position (more recent
// first) and, at equal position, lower head first: h0p2, h1p2, h2p1, h1p0; last h0p1 .2.
const float kScores3x3[9] = {0.9f, 0.2f, 0.4f, 0.4f, 0.8f, 0.4f, 0.7f, 0.4f, 0.6f};
const int32_t kLengths3[3] = {3, 3, 3};

RaggedScores scores3x3() {
  RaggedScores s;
  s.scores = kScores3x3;
  s.lengths = kLengths3;
  s.num_heads = 3;
  s.ld = 3;
  return s;
}

V counts_for(const RaggedScores& s, int k) {
  V c(s.num_heads, -1);
  global_topk_counts(s, k, c.data());
  return c;
}

TEST(AdaKv, GlobalTopkCountsWithTies) {
  const RaggedScores s = scores3x3();
  EXPECT_EQ(counts_for(s, 0), (V{0, 0, 0}));
  EXPECT_EQ(counts_for(s, 4), (V{1, 1, 2}));
  EXPECT_EQ(counts_for(s, 5), (V{2, 1, 2}));  // h0p2 beats h1p2: same score and position
  EXPECT_EQ(counts_for(s, 6), (V{2, 2, 2}));  // h1p2 (position 2) beats h2p1 (position 1)
  EXPECT_EQ(counts_for(s, 7), (V{2, 2, 3}));  // h2p1 beats h1p0 (position 0)
  EXPECT_EQ(counts_for(s, 8), (V{2, 3, 3}));
  EXPECT_EQ(counts_for(s, 9), (V{3, 3, 3}));
  EXPECT_EQ(counts_for(s, 100), (V{3, 3, 3}));  // k above the total: all
}

TEST(AdaKv, ExplicitPositionsAndRaggedLengths) {
  // All scores equal, so only positions rank: head 0 holds positions 0 4 7, head 1 (length 2,
  // ld 3) holds 2 9. Order: 9 (h1), 7 (h0), 4 (h0), 2 (h1), 0 (h0).
  const float scores[6] = {1, 1, 1, 1, 1, 1};
  const int32_t positions[6] = {0, 4, 7, 2, 9, -1};
  const int32_t lengths[2] = {3, 2};
  RaggedScores s;
  s.scores = scores;
  s.positions = positions;
  s.lengths = lengths;
  s.num_heads = 2;
  s.ld = 3;
  EXPECT_EQ(counts_for(s, 1), (V{0, 1}));
  EXPECT_EQ(counts_for(s, 2), (V{1, 1}));
  EXPECT_EQ(counts_for(s, 3), (V{2, 1}));
  EXPECT_EQ(counts_for(s, 4), (V{2, 2}));
  EXPECT_EQ(counts_for(s, 5), (V{3, 2}));
}

TEST(AdaKv, ThreeHeadsAlphaHalf) {
  // Heads of length 4, base 2, alpha 0.5 -> k = h*base = 6, floor(0.5*2) = 1.
  //   head 0: 0.9 0.8 0.7 0.1    head 1: 0.05 x4    head 2: 0.5 0.6 0.7 0.2
  // Top 6: .9 .8 .7(h0) .7(h2) .6 .5 -> counts 3 0 3.
  // B = round_half_even(0.5*count + 1): 2.5 -> 2, 1 -> 1, 2.5 -> 2; sum 5 = 6 - 1, within h/2.
  const float scores[12] = {0.9f,  0.8f,  0.7f, 0.1f, 0.05f, 0.05f,
                            0.05f, 0.05f, 0.5f, 0.6f, 0.7f,  0.2f};
  const int32_t lengths[3] = {4, 4, 4};
  RaggedScores s;
  s.scores = scores;
  s.lengths = lengths;
  s.num_heads = 3;
  s.ld = 4;
  int32_t budgets[3], counts[3];
  ada_head_budgets(s, 2, 0.5, budgets, counts);
  EXPECT_EQ(V(counts, counts + 3), (V{3, 0, 3}));
  EXPECT_EQ(V(budgets, budgets + 3), (V{2, 1, 2}));
  const int total = budgets[0] + budgets[1] + budgets[2];
  EXPECT_EQ(total, 5);
  EXPECT_LE(std::abs(total - 3 * 2) * 2, 3);  // |total - h*base| <= h/2
  // alpha 0 is pure adaptive: the counts themselves. alpha 1 is uniform: floor(base) = 2 each.
  ada_head_budgets(s, 2, 0.0, budgets);
  EXPECT_EQ(V(budgets, budgets + 3), (V{3, 0, 3}));
  ada_head_budgets(s, 2, 1.0, budgets);
  EXPECT_EQ(V(budgets, budgets + 3), (V{2, 2, 2}));
  EXPECT_THROW(ada_head_budgets(s, 2, 1.5, budgets), kvb::Error);
}

TEST(AdaKv, HalfRoundsToEvenBothWays) {
  // Heads of length 6, base 4, alpha 0.5: k 12, floor(2) = 2.
  //   head 0: 0.9 x6 -> all six in; head 1: 0.8 then 0.1 x5 -> one; head 2: 0.5 x5, 0.2 -> five
  // counts 6 1 5 (sum 12). B: 0.5*6+2 = 5; 0.5+2 = 2.5 -> 2 (down to even); 2.5+2 = 4.5 -> 4.
  // With counts 3 (1.5 + 2 = 3.5) rounding goes up to 4, checked via ada_budgets_from_counts.
  std::vector<float> scores = {0.9f, 0.9f, 0.9f, 0.9f, 0.9f, 0.9f, 0.8f, 0.1f, 0.1f,
                               0.1f, 0.1f, 0.1f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.2f};
  const int32_t lengths[3] = {6, 6, 6};
  RaggedScores s;
  s.scores = scores.data();
  s.lengths = lengths;
  s.num_heads = 3;
  s.ld = 6;
  int32_t budgets[3], counts[3];
  ada_head_budgets(s, 4, 0.5, budgets, counts);
  EXPECT_EQ(V(counts, counts + 3), (V{6, 1, 5}));
  EXPECT_EQ(V(budgets, budgets + 3), (V{5, 2, 4}));  // sum 11, |11 - 12| <= 1.5
  const int32_t c2[3] = {3, 3, 6};
  ada_budgets_from_counts(c2, lengths, 3, 4, 0.5, budgets);
  EXPECT_EQ(V(budgets, budgets + 3), (V{4, 4, 5}));  // 3.5 -> 4, 3.5 -> 4, 5
}

TEST(AdaKv, CappedByHeadLength) {
  // Lengths 2 and 4 (ld 4), base 4: k = 8 > 6 entries, so counts = lengths = 2, 4.
  // B0 = round(1 + 2) = 3 -> capped to 2; B1 = round(2 + 2) = 4.
  const float scores[8] = {1, 2, 99, 99, 3, 4, 5, 6};
  const int32_t lengths[2] = {2, 4};
  RaggedScores s;
  s.scores = scores;
  s.lengths = lengths;
  s.num_heads = 2;
  s.ld = 4;
  int32_t budgets[2], counts[2];
  ada_head_budgets(s, 4, 0.5, budgets, counts);
  EXPECT_EQ(V(counts, counts + 2), (V{2, 4}));
  EXPECT_EQ(V(budgets, budgets + 2), (V{2, 4}));
}

TEST(AdaKv, OddBaseCanFallShortByMoreThanHalfH) {
  // base 1, alpha 0.5: floor(0.5) = 0, so the unrounded sum is already h*base - h/2 and
  // round-half-even can take it further down. With the 3x3 scores, k = 3 -> counts 1 1 1 and
  // every B = round_half_even(0.5) = 0: total 0, short by h = 3 (the reference code does this).
  int32_t budgets[3], counts[3];
  ada_head_budgets(scores3x3(), 1, 0.5, budgets, counts);
  EXPECT_EQ(V(counts, counts + 3), (V{1, 1, 1}));
  EXPECT_EQ(V(budgets, budgets + 3), (V{0, 0, 0}));
}

}  // namespace
}  // namespace kvb::kernels::cpu
