// The policy ops table's CPU instance on hand-computed cases (kernels/ops/policy_ops.h),
// and what a device instance's decisions do to the host index (EvictionPlan::keep_on_device,
// KvCache's stale positions), with device rows simulated on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/error.h"
#include "kernels/eviction_plan.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"
#include "kernels/policies/snapkv_scores.h"

namespace kvb {
namespace {

using kernels::EvictionPlan;
using kernels::KvCache;
using policies::GqaReduce;
using policies::KeepTop;
using policies::SlotRows;
using policies::SlotType;
using policies::SnapKvScoreOptions;
using policies::WindowReduce;
using PoolKind = kernels::cpu::PoolKind;

// A host index of one layer whose head h holds the positions pos[h].
KvCache index_with_positions(const std::vector<std::vector<int32_t>>& pos) {
  int cap = 1;
  for (const auto& p : pos) cap = std::max(cap, static_cast<int>(p.size()));
  KvCache cache({1, static_cast<int>(pos.size()), 4}, cap, /*host_rows=*/false);
  for (size_t h = 0; h < pos.size(); ++h) {
    for (int32_t p : pos[h]) cache.append(0, static_cast<int>(h), nullptr, nullptr, p);
  }
  return cache;
}

// Window-scores statistics: probabilities [num_heads, w, stride] of a layer-0 block.
policies::LayerStats window_stats(const std::vector<float>& probs, int num_heads, int w,
                                  int stride) {
  policies::LayerStats st;
  st.layer = 0;
  st.n_new = w;
  st.num_heads = num_heads;
  st.stride = stride;
  st.last_w = w;
  st.last_probs = probs.data();
  return st;
}

SnapKvScoreOptions score_options(WindowReduce window, GqaReduce gqa, int kernel, PoolKind kind) {
  SnapKvScoreOptions o;
  o.window_reduce = window;
  o.gqa_reduce = gqa;
  o.pool_kernel = kernel;
  o.pooling = kind;
  return o;
}

TEST(PolicyOps, ResizeTruncatesOrExtendsWithZeros) {
  kvb::kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 2, 2);
  EXPECT_EQ(r->bytes(), 0u);
  ops.resize(*r, 1, std::vector<int32_t>{3, 1});
  const std::vector<float> src = {1, 2, 3, 4};  // one head row of 4; heads 1 row apart
  ops.accumulate(*r, 1, src.data(), 0, 4, 1, GqaReduce::kMean);
  EXPECT_EQ(ops.read_f32(*r, 1, 0), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(ops.read_f32(*r, 1, 1), (std::vector<float>{1}));
  ops.resize(*r, 1, std::vector<int32_t>{2, 4});
  EXPECT_EQ(ops.read_f32(*r, 1, 0), (std::vector<float>{1, 2}));
  EXPECT_EQ(ops.read_f32(*r, 1, 1), (std::vector<float>{1, 0, 0, 0}));
  EXPECT_EQ(r->length(1, 1), 4);
  EXPECT_EQ(r->length(0, 0), 0);
  EXPECT_EQ(r->bytes(), 6 * sizeof(float));
  std::unique_ptr<SlotRows> u = ops.make_rows(SlotType::kU64, 1, 1);
  ops.resize(*u, 0, std::vector<int32_t>{5});
  EXPECT_EQ(u->bytes(), 5 * sizeof(uint64_t));
}

// Two KV heads of a group of 2 query heads; rows of stride 3.
TEST(PolicyOps, AccumulateAddsTheGroupsMeanOrMax) {
  kvb::kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 2);
  ops.resize(*r, 0, std::vector<int32_t>{3, 2});
  // query heads 0,1 -> KV head 0; 2,3 -> KV head 1
  const std::vector<float> col = {1, 2, 3,  3, 6, 1,  0.5f, 1, 9,  1.5f, 0, 9};
  ops.accumulate(*r, 0, col.data(), 2 * 3, 3, 2, GqaReduce::kMean);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{2, 4, 2}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{1, 0.5f}));  // entry 2 is past length
  ops.accumulate(*r, 0, col.data(), 2 * 3, 3, 2, GqaReduce::kMax);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{5, 10, 5}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{2.5f, 1.5f}));
}

TEST(PolicyOps, KeepTopKeepsTheTopOfThePrefixAndTheRestAndCompactsTheState) {
  kvb::kernels::ops::CpuPolicyOps ops;
  KvCache cache({1, 3, 4}, 8, /*host_rows=*/false);
  for (int h = 0; h < 3; ++h) {
    for (int s = 0; s < 5; ++s) cache.append(0, h, nullptr, nullptr, 10 * s);
  }
  std::unique_ptr<SlotRows> scores = ops.make_rows(SlotType::kF32, 1, 3);
  std::unique_ptr<SlotRows> state = ops.make_rows(SlotType::kF32, 1, 3);
  ops.resize(*scores, 0, std::vector<int32_t>{5, 5, 5});
  ops.resize(*state, 0, std::vector<int32_t>{5, 5, 5});
  const std::vector<float> sc = {0.5f, 0.1f, 0.1f, 0.9f, 0.3f};
  const std::vector<float> st = {10, 11, 12, 13, 14};
  ops.accumulate(*scores, 0, sc.data(), 0, 5, 1, GqaReduce::kMean);  // every head: sc
  ops.accumulate(*state, 0, st.data(), 0, 5, 1, GqaReduce::kMean);
  EvictionPlan plan;
  plan.reset(0, 3);
  const std::vector<KeepTop> tops = {
      // top 2 of {0.5, 0.1, 0.1, 0.9}: slots 3 and 0; slot 4 stays.
      {.head = 0, .score_head = 0, .len = 5, .prefix = 4, .k = 2},
      // all but one of the first 4: the lowest (0.1 at 1 and 2: the older, 1, goes).
      {.head = 1, .score_head = 1, .len = 5, .prefix = 4, .k = 3},
      // none of the first 2.
      {.head = 2, .score_head = 2, .len = 5, .prefix = 2, .k = 0},
  };
  SlotRows* rows[] = {state.get()};
  ops.keep_top(*scores, 0, cache, tops, rows, plan);
  EXPECT_EQ(plan.kind(0), EvictionPlan::Kind::kKeep);
  EXPECT_EQ(plan.kept(0), (std::vector<int32_t>{0, 3, 4}));
  ASSERT_EQ(plan.kind(1), EvictionPlan::Kind::kVictim);
  EXPECT_EQ(plan.victim(1), 1);
  EXPECT_EQ(plan.kept(2), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(ops.read_f32(*state, 0, 0), (std::vector<float>{10, 13, 14}));
  EXPECT_EQ(ops.read_f32(*state, 0, 1), (std::vector<float>{10, 12, 13, 14}));
  EXPECT_EQ(ops.read_f32(*state, 0, 2), (std::vector<float>{12, 13, 14}));
  // Bad decisions name the head.
  plan.reset(0, 3);
  const std::vector<KeepTop> bad = {{.head = 0, .score_head = 0, .len = 5, .prefix = 4, .k = 4}};
  EXPECT_THROW(ops.keep_top(*scores, 0, cache, bad, {}, plan), Error);
  const std::vector<KeepTop> wrong_len = {
      {.head = 0, .score_head = 0, .len = 4, .prefix = 4, .k = 1}};
  EXPECT_THROW(ops.keep_top(*scores, 0, cache, wrong_len, {}, plan), Error);
}

TEST(PolicyOps, NegatedPopcountCountsTheBits) {
  kvb::kernels::ops::CpuPolicyOps ops;
  // Bits made through the Scissorhands op: one KV head, one query head, a block of 3 tokens
  // with every query recorded; probabilities below 1 / visible set a bit.
  KvCache cache({1, 1, 4}, 4, /*host_rows=*/false);
  for (int s = 0; s < 3; ++s) cache.append(0, 0, nullptr, nullptr, s);
  std::unique_ptr<SlotRows> bits = ops.make_rows(SlotType::kU64, 1, 1);
  // Rows: query 0 sees 1 key (threshold 1), query 1 sees 2 (1/2), query 2 sees 3 (1/3).
  const std::vector<float> probs = {1.0f, 0, 0,  0.4f, 0.6f, 0,  0.2f, 0.5f, 0.3f};
  policies::LayerStats st;
  st.layer = 0;
  st.n_new = 3;
  st.num_heads = 1;
  st.stride = 3;
  st.last_w = 3;
  st.last_probs = probs.data();
  ops.history_bits(*bits, st, cache, 8, false);
  // Slot 0: q0 1.0 !< 1 -> 0; q1 0.4 < 0.5 -> 1; q2 0.2 < 1/3 -> 1: 0b011.
  // Slot 1: q0 cannot see it -> 0; q1 0.6 -> 0; q2 0.5 -> 0: 0.
  // Slot 2: q2 0.3 < 1/3 -> 1: 0b001.
  EXPECT_EQ(ops.read_u64(*bits, 0, 0), (std::vector<uint64_t>{3, 0, 1}));
  std::unique_ptr<SlotRows> counters = ops.make_rows(SlotType::kF32, 1, 1);
  negated_popcount(ops, *bits, 0, *counters, 0);
  EXPECT_EQ(ops.read_f32(*counters, 0, 0), (std::vector<float>{-2, 0, -1}));
}

// The vocabulary ops knorm, Scissorhands and Ada-KV are composed of (hand-computed).
TEST(PolicyOps, AppendNormsAppendsEachRowsNormsFromItsSourceHead) {
  kvb::kernels::ops::CpuPolicyOps ops;
  // 2 vectors x 2 source heads x dim 2: norms 5, 1 (t = 0) and 0, 13 (t = 1).
  const std::vector<float> v = {3, 4, 0, -1, 0, 0, 5, 12};
  std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 1, 4);
  ops.append_norms(*rows, 0, std::vector<int32_t>{0, 0, 0, 0}, v.data(), 2, 2, 2, /*expand=*/2);
  EXPECT_EQ(ops.read_f32(*rows, 0, 0), (std::vector<float>{5, 0}));  // rows 0, 1: source 0
  EXPECT_EQ(ops.read_f32(*rows, 0, 1), (std::vector<float>{5, 0}));
  EXPECT_EQ(ops.read_f32(*rows, 0, 3), (std::vector<float>{1, 13}));
  // Grows rows that hold `before` entries; `before` 0 restarts a row; any other count is refused.
  ops.append_norms(*rows, 0, std::vector<int32_t>{2, 0, 2, 2}, v.data(), 1, 2, 2, 2);
  EXPECT_EQ(ops.read_f32(*rows, 0, 0), (std::vector<float>{5, 0, 5}));
  EXPECT_EQ(ops.read_f32(*rows, 0, 1), (std::vector<float>{5}));
  EXPECT_THROW(ops.append_norms(*rows, 0, std::vector<int32_t>{1, 1, 3, 3}, v.data(), 1, 2, 2, 2),
               Error);
  // Scale the new entries only: -1 negates exactly (knorm's -norm).
  ops.scale(*rows, 0, std::vector<int32_t>{2, 0}, -1.0f);
  EXPECT_EQ(ops.read_f32(*rows, 0, 0), (std::vector<float>{5, 0, -5}));
  EXPECT_EQ(ops.read_f32(*rows, 0, 1), (std::vector<float>{-5}));
  EXPECT_EQ(ops.read_f32(*rows, 0, 3), (std::vector<float>{1, 13, 1}));  // past first.size()
  EXPECT_THROW(ops.scale(*rows, 0, std::vector<int32_t>{4}, 2.0f), Error);  // past the row
}

TEST(PolicyOps, PopcountCountsBitsAndCountTopSpansTheLayersHeads) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const KvCache cache = index_with_positions({{0, 1, 2}, {0, 5}});
  std::unique_ptr<SlotRows> bits = ops.make_rows(SlotType::kU64, 1, 2);
  ops.resize(*bits, 0, std::vector<int32_t>{3, 2});
  std::unique_ptr<SlotRows> counts = ops.make_rows(SlotType::kF32, 1, 2);
  ops.popcount(*bits, 0, *counts, 0);
  EXPECT_EQ(ops.read_f32(*counts, 0, 0), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(counts->length(0, 1), 2);
  // Scores: head 0 {1, 3, 2}, head 1 {3, 0} (rows filled by window_sum from w = 1 statistics).
  const std::vector<float> sc = {1, 3, 2,  3, 0, 0};
  const policies::LayerStats s1 = window_stats(sc, 2, 1, 3);
  std::unique_ptr<SlotRows> scores = ops.make_rows(SlotType::kF32, 1, 2);
  ops.window_sum(*scores, 0, s1, std::vector<int32_t>{3, 2}, WindowReduce::kSum);
  // The top 2: two 3s. The top 1: the 3 at the more recent position (head 0's slot 1 is position
  // 1, head 1's slot 0 position 0). The top 3 adds the 2; k past the total counts everything.
  EXPECT_EQ(ops.count_top_across_heads(*scores, 0, cache, 0, 2), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(ops.count_top_across_heads(*scores, 0, cache, 0, 1), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(ops.count_top_across_heads(*scores, 0, cache, 0, 3), (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(ops.count_top_across_heads(*scores, 0, cache, 0, int64_t{1} << 40),
            (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(ops.count_top_across_heads(*scores, 0, cache, 0, 0), (std::vector<int32_t>{0, 0}));
  EXPECT_THROW(ops.count_top_across_heads(*scores, 0, cache, 0, -1), Error);
}

// The vocabulary ops window_scores is composed of, one at a time (hand-computed).
TEST(PolicyOps, WindowSumSumsEachQueryHeadsWindowOverItsOwnLength) {
  kvb::kernels::ops::CpuPolicyOps ops;
  constexpr float x = 100;  // past a row's length: never read
  const std::vector<float> probs = {
      1, 2, x,  3, 0, x,  0.5f, 4, x,  // q0: w = 3 queries of stride 3, length 2: sums 4.5 6
      7, x, x,  1, x, x,  1, x, x,     // q1: length 1: sum 9
  };
  const policies::LayerStats st = window_stats(probs, 2, 3, 3);
  std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 2, 2);
  ops.window_sum(*rows, 1, st, std::vector<int32_t>{2, 1}, WindowReduce::kSum);
  EXPECT_EQ(ops.read_f32(*rows, 1, 0), (std::vector<float>{4.5f, 6}));
  EXPECT_EQ(ops.read_f32(*rows, 1, 1), (std::vector<float>{9}));
  EXPECT_EQ(rows->length(0, 0), 0);
  ops.window_sum(*rows, 1, st, std::vector<int32_t>{2, 0}, WindowReduce::kMean);
  EXPECT_EQ(ops.read_f32(*rows, 1, 0), (std::vector<float>{1.5f, 2}));
  EXPECT_EQ(rows->length(1, 1), 0);
  // Finch's weighted mean: query a of a window after n summed slots weighs n + a. q0 (n = 2,
  // weights 2, 3, 4): (1*2 + 3*3 + 0.5*4) / 3 = 13/3 and (2*2 + 0*3 + 4*4) / 3 = 20/3; q1 (n = 1,
  // weights 1, 2, 3): (7 + 2 + 3) / 3 = 4. Rounded once from f64.
  ops.window_sum(*rows, 1, st, std::vector<int32_t>{2, 1}, WindowReduce::kWeightedMean);
  EXPECT_EQ(ops.read_f32(*rows, 1, 0),
            (std::vector<float>{static_cast<float>(13.0 / 3), static_cast<float>(20.0 / 3)}));
  EXPECT_EQ(ops.read_f32(*rows, 1, 1), (std::vector<float>{4}));
  // The window's first 2 rows alone (Finch's question before the template's tail): sums 4 and 2
  // (q0), 8 (q1); the weighted mean (1*2 + 3*3) / 2, (2*2 + 0*3) / 2 and (7*1 + 1*2) / 2.
  ops.window_sum(*rows, 1, st, std::vector<int32_t>{2, 1}, WindowReduce::kSum, 2);
  EXPECT_EQ(ops.read_f32(*rows, 1, 0), (std::vector<float>{4, 2}));
  EXPECT_EQ(ops.read_f32(*rows, 1, 1), (std::vector<float>{8}));
  ops.window_sum(*rows, 1, st, std::vector<int32_t>{2, 1}, WindowReduce::kWeightedMean, 2);
  EXPECT_EQ(ops.read_f32(*rows, 1, 0), (std::vector<float>{5.5f, 2}));
  EXPECT_EQ(ops.read_f32(*rows, 1, 1), (std::vector<float>{4.5f}));
  EXPECT_THROW(ops.window_sum(*rows, 1, st, std::vector<int32_t>{2, 1}, WindowReduce::kSum, 4),
               Error);
  // A length past the stride, a count of lengths other than the rows' heads: refused.
  EXPECT_THROW(ops.window_sum(*rows, 1, st, std::vector<int32_t>{4, 0}, WindowReduce::kSum),
               Error);
  EXPECT_THROW(ops.window_sum(*rows, 1, st, std::vector<int32_t>{1}, WindowReduce::kSum), Error);
}

TEST(PolicyOps, ReduceHeadsFoldsEachGroupOfRows) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const std::vector<float> probs = {1, 5, -2,  3, 1, -4,  0, 0, 0,  8, 2, 6};  // 4 rows, w = 1
  const policies::LayerStats st = window_stats(probs, 4, 1, 3);
  std::unique_ptr<SlotRows> in = ops.make_rows(SlotType::kF32, 1, 4);
  ops.window_sum(*in, 0, st, std::vector<int32_t>{3, 3, 2, 2}, WindowReduce::kSum);
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 1, 2);
  ops.reduce_heads(*in, 0, 2, GqaReduce::kMean, *out, 0);
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{2, 3, -3}));
  EXPECT_EQ(ops.read_f32(*out, 0, 1), (std::vector<float>{4, 1}));
  ops.reduce_heads(*in, 0, 2, GqaReduce::kMax, *out, 0);
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{3, 5, -2}));
  EXPECT_EQ(ops.read_f32(*out, 0, 1), (std::vector<float>{8, 2}));
  // Group 1 copies; rows of one group with different lengths, or counts that do not group: refused.
  std::unique_ptr<SlotRows> same = ops.make_rows(SlotType::kF32, 1, 4);
  ops.reduce_heads(*in, 0, 1, GqaReduce::kMean, *same, 0);
  EXPECT_EQ(ops.read_f32(*same, 0, 3), (std::vector<float>{8, 2}));
  ops.window_sum(*in, 0, st, std::vector<int32_t>{3, 2, 2, 2}, WindowReduce::kSum);
  EXPECT_THROW(ops.reduce_heads(*in, 0, 2, GqaReduce::kMean, *out, 0), Error);
  std::unique_ptr<SlotRows> three = ops.make_rows(SlotType::kF32, 1, 3);
  EXPECT_THROW(ops.reduce_heads(*in, 0, 2, GqaReduce::kMean, *three, 0), Error);
}

TEST(PolicyOps, PoolPoolsEachRowOverItsOwnLength) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const std::vector<float> probs = {1, 3, 2, 0, 5,  4, 1, 0, 0, 0};  // 2 rows, w = 1, stride 5
  const policies::LayerStats st = window_stats(probs, 2, 1, 5);
  std::unique_ptr<SlotRows> in = ops.make_rows(SlotType::kF32, 1, 2);
  ops.window_sum(*in, 0, st, std::vector<int32_t>{5, 2}, WindowReduce::kSum);
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 1, 2);
  ops.pool(*in, 0, *out, 0, 3, PoolKind::kMax);
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{3, 3, 3, 5, 5}));
  EXPECT_EQ(ops.read_f32(*out, 0, 1), (std::vector<float>{4, 4}));  // row 1's zeros unseen
  // Average pooling counts the zero padding (F.avg_pool1d's count_include_pad).
  ops.pool(*in, 0, *out, 0, 3, PoolKind::kAvg);
  EXPECT_EQ(ops.read_f32(*out, 0, 1), (std::vector<float>{5.0f / 3, 5.0f / 3}));
  ops.pool(*in, 0, *out, 0, 1, PoolKind::kMax);
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{1, 3, 2, 0, 5}));
  EXPECT_THROW(ops.pool(*in, 0, *out, 0, 2, PoolKind::kMax), Error);  // even kernel
  EXPECT_THROW(ops.pool(*in, 0, *in, 0, 3, PoolKind::kMax), Error);   // in place
}

// Two KV heads of 2 query heads each, w = 2, stride 5; head 0 holds 5 slots (prefix 3), head 1
// holds 4 (prefix 2). Pool kernel 1 isolates the window and GQA reductions.
TEST(PolicyOps, WindowScoresReduceTheWindowThenTheGroup) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const KvCache cache = index_with_positions({{0, 1, 2, 3, 4}, {0, 1, 2, 3}});
  constexpr float x = 100;  // window columns: never read as prefix scores
  const std::vector<float> probs = {
      1, 2, 3, x, x,  3, 0, 1, x, x,           // q0 (KV head 0): sums 4 2 4, means 2 1 2
      0, 4, 1, x, x,  2, 2, 1, x, x,           // q1 (KV head 0): sums 2 6 2, means 1 3 1
      1, 1, x, x, x,  1, 3, x, x, x,           // q2 (KV head 1): sums 2 4, means 1 2
      0.5f, 0, x, x, x,  0.5f, 2, x, x, x,     // q3 (KV head 1): sums 1 2, means 0.5 1
  };
  const policies::LayerStats st = window_stats(probs, 4, 2, 5);
  struct Case {
    WindowReduce window;
    GqaReduce gqa;
    std::vector<float> head0, head1;
  };
  const std::vector<Case> cases = {
      {WindowReduce::kSum, GqaReduce::kMean, {3, 4, 3}, {1.5f, 3}},
      {WindowReduce::kSum, GqaReduce::kMax, {4, 6, 4}, {2, 4}},
      {WindowReduce::kMean, GqaReduce::kMean, {1.5f, 2, 1.5f}, {0.75f, 1.5f}},
      {WindowReduce::kMean, GqaReduce::kMax, {2, 3, 2}, {1, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "sum " << (c.window == WindowReduce::kSum) << " max "
                                    << (c.gqa == GqaReduce::kMax));
    std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 2, 2);
    window_scores(ops, *rows, 1, st, cache, score_options(c.window, c.gqa, 1, PoolKind::kMax));
    EXPECT_EQ(ops.read_f32(*rows, 1, 0), c.head0);
    EXPECT_EQ(ops.read_f32(*rows, 1, 1), c.head1);
    EXPECT_EQ(rows->length(0, 0), 0);  // other layers untouched
  }
  // The mean divides the f32 sum by w: three ones over a window of 3 give 1 exactly.
  const std::vector<float> ones(3 * 4, 1.0f);
  const KvCache four = index_with_positions({{0, 1, 2, 3}});
  std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 1, 1);
  window_scores(ops, *rows, 0, window_stats(ones, 1, 3, 4), four,
                    score_options(WindowReduce::kMean, GqaReduce::kMean, 1, PoolKind::kMax));
  EXPECT_EQ(ops.read_f32(*rows, 0, 0), (std::vector<float>{1}));
}

// One KV head, w = 1: prefix scores {1, 5, 2, 0, 3} pooled with kernel 3 and 7 (wider than
// the prefix): max never takes the padding; avg divides by the kernel (padding counts).
TEST(PolicyOps, WindowScoresPoolOverTheHeadsOwnPrefix) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const KvCache cache = index_with_positions({{0, 1, 2, 3, 4, 5}});
  const std::vector<float> probs = {1, 5, 2, 0, 3, 9};
  const policies::LayerStats st = window_stats(probs, 1, 1, 6);
  std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 1, 1);
  const auto run = [&](int kernel, PoolKind kind) {
    window_scores(ops, *rows, 0, st, cache,
                      score_options(WindowReduce::kSum, GqaReduce::kMean, kernel, kind));
    return ops.read_f32(*rows, 0, 0);
  };
  const auto div = [](double sum, int kernel) { return static_cast<float>(sum / kernel); };
  EXPECT_EQ(run(1, PoolKind::kMax), (std::vector<float>{1, 5, 2, 0, 3}));
  EXPECT_EQ(run(1, PoolKind::kAvg), (std::vector<float>{1, 5, 2, 0, 3}));
  EXPECT_EQ(run(3, PoolKind::kMax), (std::vector<float>{5, 5, 5, 3, 3}));
  EXPECT_EQ(run(3, PoolKind::kAvg),
            (std::vector<float>{div(6, 3), div(8, 3), div(7, 3), div(5, 3), div(3, 3)}));
  EXPECT_EQ(run(7, PoolKind::kMax), (std::vector<float>{5, 5, 5, 5, 5}));
  EXPECT_EQ(run(7, PoolKind::kAvg),
            (std::vector<float>{div(8, 7), div(11, 7), div(11, 7), div(11, 7), div(10, 7)}));
}

// Ragged heads, w = 3, stride 6: head 0 holds 6 slots (prefix 3), head 1 holds 3 (prefix 0),
// head 2 holds 2 (fewer than w: prefix 0). Pooling stays inside each head's own prefix; a row
// that was longer before becomes its new prefix long.
TEST(PolicyOps, WindowScoresOfRaggedHeadsAndEmptyPrefixes) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const KvCache cache = index_with_positions({{0, 1, 2, 3, 4, 5}, {0, 1, 2}, {0, 1}});
  std::vector<float> probs(3 * 3 * 6, 7.0f);  // 7: columns no prefix may read
  for (int a = 0; a < 3; ++a) {
    for (int j = 0; j < 3; ++j) probs[a * 6 + j] = static_cast<float>(j == a);  // head 0: I
  }
  probs[0 * 6 + 1] = 2;  // head 0 column 1 sums to 3
  const policies::LayerStats st = window_stats(probs, 3, 3, 6);
  std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 1, 3);
  ops.resize(*rows, 0, std::vector<int32_t>{9, 9, 9});
  window_scores(ops, *rows, 0, st, cache,
                    score_options(WindowReduce::kSum, GqaReduce::kMean, 3, PoolKind::kMax));
  EXPECT_EQ(ops.read_f32(*rows, 0, 0), (std::vector<float>{3, 3, 3}));  // sums 1 3 1, pooled
  EXPECT_EQ(rows->length(0, 1), 0);
  EXPECT_EQ(rows->length(0, 2), 0);
  window_scores(ops, *rows, 0, st, cache,
                    score_options(WindowReduce::kSum, GqaReduce::kMean, 1, PoolKind::kMax));
  EXPECT_EQ(ops.read_f32(*rows, 0, 0), (std::vector<float>{1, 3, 1}));
  // A cache of 4 KV heads does not group 3 query heads; rows of another head count are refused.
  const KvCache four = index_with_positions({{0}, {0}, {0}, {0}});
  std::unique_ptr<SlotRows> rows4 = ops.make_rows(SlotType::kF32, 1, 4);
  EXPECT_THROW(window_scores(ops, *rows4, 0, st, four, {}), Error);
  const KvCache one = index_with_positions({{0, 1, 2, 3, 4, 5}});
  EXPECT_THROW(window_scores(ops, *rows, 0, st, one, {}), Error);
}

// Ada-KV's budgets from score rows: the global top-(heads * base), ranked by score, then the
// more recent cache position, then the lower head; B = round_half_even((1-alpha)*count +
// floor(alpha*base)), capped by the row's length.
TEST(PolicyOps, AdaHeadBudgetsRankByScoreThenPositionThenHead) {
  kvb::kernels::ops::CpuPolicyOps ops;
  // Head 0 scores {0.5, 0.5, 0.1, 0.1} at positions 0..3; head 1 {0.5, 0.5} at 10, 20; each
  // head has one more (window) slot the rows do not score.
  const KvCache cache = index_with_positions({{0, 1, 2, 3, 4}, {10, 20, 30}});
  std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 1, 2);
  ops.resize(*rows, 0, std::vector<int32_t>{4, 2});
  const std::vector<float> src = {0.5f, 0.5f, 0.1f, 0.1f, 0.5f, 0.5f};  // heads 4 apart
  ops.accumulate(*rows, 0, src.data(), 4, 4, 1, GqaReduce::kMean);
  // base 1, k = 2: the 0.5s of head 1 (positions 20 and 10 beat 1 and 0).
  EXPECT_EQ(ada_head_budgets(ops, *rows, 0, cache, 0, 1, 0.0), (std::vector<int32_t>{0, 2}));
  // base 2, k = 4: every 0.5; alpha 0.5: round(0.5 * 2 + 1) = 2 each.
  EXPECT_EQ(ada_head_budgets(ops, *rows, 0, cache, 0, 2, 0.5), (std::vector<int32_t>{2, 2}));
  // base 1, k = 2, alpha 0.5: counts {0, 2}: round(0 + 0) = 0, round(1 + 0) = 1.
  EXPECT_EQ(ada_head_budgets(ops, *rows, 0, cache, 0, 1, 0.5), (std::vector<int32_t>{0, 1}));
  // alpha 1: floor(base) for each head, capped by the row: {3, 2}.
  EXPECT_EQ(ada_head_budgets(ops, *rows, 0, cache, 0, 3, 1.0), (std::vector<int32_t>{3, 2}));
  // Equal scores and positions: the lower head first. Three heads, base 1, k = 3: positions
  // 1 of heads 0 and 1, then position 0 of head 0.
  const KvCache tie = index_with_positions({{0, 1, 2}, {0, 1, 2}, {0, 2}});
  std::unique_ptr<SlotRows> tied = ops.make_rows(SlotType::kF32, 1, 3);
  ops.resize(*tied, 0, std::vector<int32_t>{2, 2, 1});
  const std::vector<float> half(6, 0.5f);
  ops.accumulate(*tied, 0, half.data(), 2, 2, 1, GqaReduce::kMean);
  EXPECT_EQ(ada_head_budgets(ops, *tied, 0, tie, 0, 1, 0.0), (std::vector<int32_t>{2, 1, 0}));
  // Empty rows (every prefix 0): nothing to rank, every budget 0.
  std::unique_ptr<SlotRows> empty = ops.make_rows(SlotType::kF32, 1, 2);
  EXPECT_EQ(ada_head_budgets(ops, *empty, 0, cache, 0, 5, 0.5), (std::vector<int32_t>{0, 0}));
}

// Device rows simulated on the host: positions per head, compacted by the lists the test gives,
// read back through read_positions (counted).
struct HostSimRows final : kernels::DeviceRows {
  std::vector<std::vector<int32_t>> pos;  // per head
  int* reads = nullptr;
  std::unique_ptr<DeviceRows> clone() const override {
    return std::make_unique<HostSimRows>(*this);
  }
  void read_positions(int layer, int capacity, int32_t* dst) const override {
    EXPECT_EQ(layer, 0);
    ++*reads;
    for (size_t h = 0; h < pos.size(); ++h) {
      std::copy(pos[h].begin(), pos[h].end(), dst + h * capacity);
    }
  }
};

TEST(PolicyOps, DeviceListsSetTheIndexLengthsAndPositionsAreReadBackOnce) {
  KvCache index({1, 2, 4}, 8, /*host_rows=*/false);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 6; ++s) index.append(0, h, nullptr, nullptr, s);
  }
  int reads = 0;
  auto rows = std::make_unique<HostSimRows>();
  rows->reads = &reads;
  rows->pos = {{0, 2, 3, 5}, {0, 1, 2, 3, 4, 5}};  // what the device kept
  HostSimRows* sim = rows.get();
  index.set_device_rows(std::move(rows));
  const int32_t fake_lists[12] = {};  // never read by the host
  EvictionPlan plan;
  plan.reset(0, 2);
  plan.keep_on_device(fake_lists, 6, {4, 6}, std::vector<int32_t>{6, 6});
  EXPECT_TRUE(plan.on_device());
  EXPECT_EQ(plan.kind(0), EvictionPlan::Kind::kDevice);
  EXPECT_EQ(plan.kind(1), EvictionPlan::Kind::kKeepAll);
  EXPECT_EQ(plan.length_after(0, 6), 4);
  std::vector<int32_t> list;
  EXPECT_THROW(plan.keep_list(0, 6, &list), Error);  // on the device
  EXPECT_THROW(plan.evict(1, 0), Error);             // no host decision beside device lists
  index.apply(plan);
  EXPECT_EQ(index.length(0, 0), 4);
  EXPECT_EQ(index.length(0, 1), 6);
  EXPECT_TRUE(index.positions_stale(0));
  EXPECT_EQ(reads, 0);  // nothing read until host code asks
  KvCache copy = index;  // a fork: its (cloned) device rows hold the same positions
  EXPECT_TRUE(copy.positions_stale(0));
  const int32_t* p = index.layer(0).position(0);
  EXPECT_EQ(std::vector<int32_t>(p, p + 4), (std::vector<int32_t>{0, 2, 3, 5}));
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(index.position_reads(), 1);
  EXPECT_FALSE(index.positions_stale(0));
  (void)index.layer(0);
  EXPECT_EQ(reads, 1);  // read once
  // What a policy sees, the index alone (KvIndex::layer), reads them back the same way.
  const kernels::KvIndex& policy_view = copy;
  const int32_t* q = policy_view.layer(0).position(0);
  EXPECT_EQ(std::vector<int32_t>(q, q + 4), (std::vector<int32_t>{0, 2, 3, 5}));
  EXPECT_EQ(policy_view.layer(0).lengths[0], 4);
  EXPECT_EQ(reads, 2);
  EXPECT_EQ(policy_view.position_reads(), 1);
  (void)policy_view.layer(0);
  EXPECT_EQ(reads, 2);
  (void)sim;
  // Appends after a stale read land after the kept slots.
  index.append(0, 0, nullptr, nullptr, 6);
  EXPECT_EQ(index.layer(0).position(0)[4], 6);
  index.clear();
  EXPECT_FALSE(index.positions_stale(0));
  // A cache whose rows are on the host takes no device lists; counts above the length are
  // refused when the plan is made.
  KvCache host({1, 2, 4}, 8);
  std::vector<float> kv(4, 0.0f);
  for (int h = 0; h < 2; ++h) host.append(0, h, kv.data(), kv.data(), 0);
  EXPECT_THROW(host.apply(plan), Error);
  EvictionPlan too_many;
  too_many.reset(0, 2);
  EXPECT_THROW(too_many.keep_on_device(fake_lists, 6, {7, 6}, std::vector<int32_t>{6, 6}), Error);
}

// window_attention by hand: head_dim 4 (scale 1/2), 2 cache heads of 2 query heads each, layer
// 1 of a 2-layer cache, a window of w = 2 of 3 recorded queries (row 0 is NaN: never read) at
// positions 4 and 5 (block_end 6). Cache head 0 holds positions {0, 2, 5} with keys 0,
// (2 ln 3, 0, 0, 0) and (0, 2 ln 2, 0, 0); cache head 1 holds {5, 6}, which the first window
// query cannot see (an all-zero row).
//   query head 0, q = (1, 0, 0, 0): at 4 sees slots 0, 1: logits 0, ln 3 -> 1/4, 3/4;
//                                    at 5 sees all 3: logits 0, ln 3, 0 -> 1/5, 3/5, 1/5;
//   query head 1, q = (0, 1, 0, 0): at 4: 0, 0 -> 1/2, 1/2; at 5: 0, 0, ln 2 -> 1/4, 1/4, 1/2;
//   query heads 2 and 3 (cache head 1): at 4 nothing; at 5 slot 0 alone -> 1.
// Rows [4 heads][2][stride 3], entries past the visible slots 0; use_window points a
// LayerStats at them, and window_sum over them sums the hand values.
TEST(PolicyOps, WindowAttentionIsTheHandComputedSoftmax) {
  const float nan = std::nanf("");
  KvCache cache({2, 2, 4}, 4);
  const std::vector<float> zero(4, 0.0f), k1{2 * std::log(3.0f), 0, 0, 0},
      k2{0, 2 * std::log(2.0f), 0, 0}, ones(4, 1.0f);
  cache.append(0, 0, ones.data(), ones.data(), 0);  // layer 0: not read
  cache.append(1, 0, zero.data(), zero.data(), 0);
  cache.append(1, 0, k1.data(), zero.data(), 2);
  cache.append(1, 0, k2.data(), zero.data(), 5);
  cache.append(1, 1, ones.data(), zero.data(), 5);
  cache.append(1, 1, zero.data(), zero.data(), 6);
  // [3 queries][4 query heads][4]
  std::vector<float> queries(3 * 4 * 4, nan);
  for (int row = 1; row < 3; ++row) {
    float* r = queries.data() + row * 16;
    const float qs[4][4] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0.5f, -1, 2, 0}, {3, 1, 0, 1}};
    for (int q = 0; q < 4; ++q) std::copy(qs[q], qs[q] + 4, r + q * 4);
  }
  policies::LayerStats st;
  st.layer = 1;
  st.num_heads = 4;
  st.last_queries = queries.data();
  st.n_queries = 3;
  st.block_end = 6;
  kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<kernels::ops::WindowProbs> probs = ops.make_window_probs();
  ops.window_attention(*probs, cache, 1, st, 2);
  ASSERT_EQ(probs->heads(), 4);
  ASSERT_EQ(probs->w(), 2);
  ASSERT_EQ(probs->stride(), 3);
  const std::vector<std::vector<float>> want = {
      {0.25f, 0.75f, 0}, {0.2f, 0.6f, 0.2f},   // query head 0
      {0.5f, 0.5f, 0},   {0.25f, 0.25f, 0.5f}, // query head 1
      {0, 0, 0},         {1, 0, 0},            // query head 2
      {0, 0, 0},         {1, 0, 0}};           // query head 3
  for (int row = 0; row < 8; ++row) {
    for (int s = 0; s < 3; ++s) {
      SCOPED_TRACE(testing::Message() << "row " << row << " slot " << s);
      EXPECT_NEAR(probs->data()[row * 3 + s], want[row][s], 1e-6);
    }
  }
  policies::LayerStats window;
  window.layer = 1;
  window.num_heads = 4;
  kernels::ops::use_window(*probs, &window);
  EXPECT_EQ(window.last_probs, probs->data());
  EXPECT_EQ(window.last_w, 2);
  EXPECT_EQ(window.stride, 3);
  std::unique_ptr<SlotRows> sums = ops.make_rows(SlotType::kF32, 1, 4);
  ops.window_sum(*sums, 0, window, std::vector<int32_t>{3, 3, 2, 2}, WindowReduce::kSum);
  const std::vector<float> head0 = ops.read_f32(*sums, 0, 0), head2 = ops.read_f32(*sums, 0, 2);
  EXPECT_NEAR(head0[0], 0.45f, 1e-6);
  EXPECT_NEAR(head0[1], 1.35f, 1e-6);
  EXPECT_NEAR(head0[2], 0.2f, 1e-6);
  EXPECT_NEAR(head2[0], 1.0f, 1e-6);
  EXPECT_EQ(head2[1], 0.0f);
  // A window longer than the queries recorded, or no queries, is refused.
  EXPECT_THROW(ops.window_attention(*probs, cache, 1, st, 4), Error);
  policies::LayerStats none = st;
  none.last_queries = nullptr;
  EXPECT_THROW(ops.window_attention(*probs, cache, 1, none, 1), Error);
}

// cumsum by hand, in f32 and in index order: {1, 2, 3.5, -1} -> {1, 3, 6.5, 5.5}; {2^24, 1, 1}
// -> {2^24, 2^24, 2^24} (each 1 is lost to f32 rounding, as the running order says: the sum in
// another order, 1 + 1 + 2^24, would be 2^24 + 2); an empty row stays empty. gather by hand:
// rows {10, 20, 30, 40} and {5, 6}, indices {3, 0, 0} and {1} -> {40, 10, 10} and {6}; refused:
// an index past its row, counts that do not sum to the indices, a row into itself.
TEST(PolicyOps, CumsumAndGatherByHand) {
  kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> rows = ops.make_rows(SlotType::kF32, 2, 3);
  const float big = 16777216.0f;  // 2^24
  ops.write_rows(*rows, 1, std::vector<float>{1, 2, 3.5f, -1, big, 1, 1, 0, 7, 8, 9, 10}, 4);
  ops.resize(*rows, 1, std::vector<int32_t>{4, 3, 0});
  ops.cumsum(*rows, 1);
  EXPECT_EQ(ops.read_f32(*rows, 1, 0), (std::vector<float>{1, 3, 6.5f, 5.5f}));
  EXPECT_EQ(ops.read_f32(*rows, 1, 1), (std::vector<float>{big, big, big}));
  EXPECT_TRUE(ops.read_f32(*rows, 1, 2).empty());

  std::unique_ptr<SlotRows> in = ops.make_rows(SlotType::kF32, 1, 2);
  ops.write_rows(*in, 0, std::vector<float>{10, 20, 30, 40, 5, 6, 0, 0}, 4);
  ops.resize(*in, 0, std::vector<int32_t>{4, 2});
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 2, 2);
  ops.gather(*in, 0, std::vector<int32_t>{3, 0, 0, 1}, std::vector<int32_t>{3, 1}, *out, 1);
  EXPECT_EQ(ops.read_f32(*out, 1, 0), (std::vector<float>{40, 10, 10}));
  EXPECT_EQ(ops.read_f32(*out, 1, 1), (std::vector<float>{6}));
  EXPECT_EQ(out->length(1, 0), 3);
  EXPECT_EQ(out->length(1, 1), 1);
  EXPECT_THROW(ops.gather(*in, 0, std::vector<int32_t>{2}, std::vector<int32_t>{0, 1}, *out, 1),
               Error);  // head 1's row holds 2
  EXPECT_THROW(ops.gather(*in, 0, std::vector<int32_t>{0, 1}, std::vector<int32_t>{1}, *out, 1),
               Error);  // 2 indices, counts sum to 1
  EXPECT_THROW(ops.gather(*in, 0, std::vector<int32_t>{0}, std::vector<int32_t>{1}, *in, 0),
               Error);  // in and out the same rows
}

}  // namespace
}  // namespace kvb
