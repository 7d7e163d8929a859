// H2O hand-computed cases (POLICIES.md "h2o"): the heavy/recent split, oneshot prefill by column
// sums, score accumulation in decode, the two candidate rules, GQA mean, tie rule, state bytes.
#include <gtest/gtest.h>

#include "common/error.h"
#include "kernels/policies/policy.h"

namespace kvb::policies {
namespace {

std::unique_ptr<Policy> make(int budget, std::map<std::string, std::string> opts, int heads = 1) {
  PolicyConfig c;
  c.name = "h2o";
  c.kv_budget = budget;
  c.shape = {1, heads, 1, 1, 4096};
  c.options = PolicyOptions(std::move(opts));
  return make_policy(c);
}

kernels::KvCache cache_with(int n) {
  kernels::KvCache cache({1, 1, 1}, 16);
  for (int t = 0; t < n; ++t) {
    float kv = static_cast<float>(t);
    cache.append(0, 0, &kv, &kv, t);
  }
  cache.advance_position(n);
  return cache;
}

std::vector<int> positions(kernels::KvCache& cache) {
  kernels::LayerKvView v = cache.layer(0);
  return std::vector<int>(v.position(0), v.position(0) + cache.length(0, 0));
}

LayerStats stats(const std::vector<float>& col_sums, int n_new, int heads = 1) {
  LayerStats s;
  s.layer = 0;
  s.n_new = n_new;
  s.num_heads = heads;
  s.stride = static_cast<int>(col_sums.size()) / heads;
  s.col_sums = col_sums.data();
  return s;
}

// Budget 4 = 2 heavy + 2 recent. Prompt of 6 with column sums (5, 1, 4, 2, 0.5, 9): the last two
// (positions 4, 5) stay as recent, the top-2 of positions 0..3 by score are 0 (5) and 2 (4).
// Scores after prefill: (5, 4, 0.5, 9). Decode appends position 6 with probabilities
// (0.1, 0.1, 0.1, 0.1, 0.6): scores (5.1, 4.1, 0.6, 9.1, 0.6).
//   heavy_and_leaving: candidates = slots outside the recent window = positions 0, 2, 4
//     -> evict position 4 (0.6): keep 0, 2, 5, 6.
//   promote_recent: candidates = heavy set only = positions 0, 2 -> evict 2 (4.1): keep 0, 4, 5, 6.
TEST(H2O, PrefillAndBothCandidateRules) {
  for (const std::string rule : {"heavy_and_leaving", "promote_recent"}) {
    SCOPED_TRACE(rule);
    auto p = make(4, {{"candidates", rule}});
    kernels::KvCache cache = cache_with(6);
    std::vector<float> cs = {5, 1, 4, 2, 0.5f, 9};
    prefill_layer(*p, stats(cs, 6), cache);
    EXPECT_EQ(positions(cache), (std::vector<int>{0, 2, 4, 5}));
    EXPECT_EQ(p->state_bytes(), 4 * sizeof(float));
    float kv = 6;
    cache.append(0, 0, &kv, &kv, 6);
    std::vector<float> probs = {0.1f, 0.1f, 0.1f, 0.1f, 0.6f};
    decode_layer(*p, stats(probs, 1), cache);
    if (rule == "heavy_and_leaving") {
      EXPECT_EQ(positions(cache), (std::vector<int>{0, 2, 5, 6}));
    } else {
      EXPECT_EQ(positions(cache), (std::vector<int>{0, 4, 5, 6}));
    }
  }
}

// Equal scores: the older token is evicted (ties keep the more recent).
TEST(H2O, TiesEvictTheOlder) {
  auto p = make(2, {{"heavy_fraction", "0.5"}});  // heavy 1, recent 1
  kernels::KvCache cache = cache_with(3);
  std::vector<float> cs = {2, 2, 1};  // heavy candidates 0 and 1 tie: keep 1 (more recent)
  prefill_layer(*p, stats(cs, 3), cache);
  EXPECT_EQ(positions(cache), (std::vector<int>{1, 2}));
  float kv = 3;
  cache.append(0, 0, &kv, &kv, 3);
  std::vector<float> probs = {0.5f, 1.5f, 0.0f};  // scores (2.5, 2.5, 0): candidates 1, 2 -> tie
  decode_layer(*p, stats(probs, 1), cache);
  EXPECT_EQ(positions(cache), (std::vector<int>{2, 3}));
}

// GQA: a KV head's score is the mean of its query heads' column sums.
TEST(H2O, GqaMeanOfQueryHeads) {
  auto p = make(2, {{"heavy_fraction", "0.5"}}, /*heads=*/2);
  kernels::KvCache cache = cache_with(4);
  // Query head 0 favours position 0 (4 vs 1), head 1 favours 1 (0 vs 5): means 2 vs 3 -> keep 1.
  std::vector<float> cs = {4, 1, 0, 0, /*head 1*/ 0, 5, 0, 0};
  prefill_layer(*p, stats(cs, 4, 2), cache);
  EXPECT_EQ(positions(cache), (std::vector<int>{1, 3}));
  auto pmax = make(2, {{"heavy_fraction", "0.5"}, {"gqa_reduce", "max"}}, 2);
  kernels::KvCache c2 = cache_with(4);
  std::vector<float> cs2 = {4, 1, 0, 0, 0, 3, 0, 0};  // max: 4 vs 3 -> keep 0
  prefill_layer(*pmax, stats(cs2, 4, 2), c2);
  EXPECT_EQ(positions(c2), (std::vector<int>{0, 3}));
}

// Prompt within the budget: nothing is evicted (compression only above the budget).
TEST(H2O, NoCompressionAtOrBelowBudget) {
  auto p = make(4, {});
  kernels::KvCache cache = cache_with(4);
  std::vector<float> cs = {1, 2, 3, 4};
  prefill_layer(*p, stats(cs, 4), cache);
  EXPECT_EQ(positions(cache), (std::vector<int>{0, 1, 2, 3}));
}

TEST(H2O, BadOptionsListWhatIsAllowed) {
  try {
    make(4, {{"candidates", "oldest"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heavy_and_leaving, promote_recent"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make(4, {{"heavy_fraction", "1.5"}}), Error);
  EXPECT_THROW(make(0, {}), Error);
  EXPECT_THROW(make(5000, {}), Error);  // beyond the model's context of 4096
}

}  // namespace
}  // namespace kvb::policies
