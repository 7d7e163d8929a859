// Tests the decode-evicting baselines and the Knorm/Random floors (POLICIES.md "streaming_llm",
// "scissorhands", "Further baselines") on hand-computed cases: the hooks are driven directly with a
// hand-built KvCache and LayerStats whose probabilities / pre-RoPE keys are chosen so that the
// expected keep-set follows from the definition (and the tie rule) by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"

namespace kvb::policies {
namespace {

using kernels::KvCache;
using V = std::vector<int32_t>;

PolicyConfig config(const std::string& name, int budget, ModelShape shape,
                    std::map<std::string, std::string> opts = {}, uint64_t seed = 0) {
  PolicyConfig c;
  c.name = name;
  c.kv_budget = budget;
  c.shape = shape;
  c.options = PolicyOptions(std::move(opts));
  c.seed = seed;
  return c;
}

// Appends one token at `pos` to every head of `layer` (key/value contents are irrelevant here:
// the policies read only positions, statistics and pre-RoPE keys).
void append(KvCache& cache, int layer, int32_t pos) {
  cache.reserve_extra(1);
  const std::vector<float> zero(cache.shape().head_dim, 0.0f);
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    cache.append(layer, h, zero.data(), zero.data(), pos);
  }
}

V positions(KvCache& cache, int layer, int head) {
  const int32_t* p = cache.layer(layer).position(head);
  return V(p, p + cache.length(layer, head));
}

// Statistics of one hook call; `probs` is [num_heads, last_w, stride] and must outlive the call.
LayerStats stats(int layer, int n_new, int num_heads, int stride, int last_w,
                 const std::vector<float>& probs) {
  LayerStats st;
  st.layer = layer;
  st.n_new = n_new;
  st.num_heads = num_heads;
  st.stride = stride;
  st.last_w = last_w;
  st.last_probs = probs.data();
  st.col_sums = last_w == 1 ? probs.data() : nullptr;  // one query: its column sums are its row
  return st;
}

void expect_usage_error(const PolicyConfig& c, const std::string& needle) {
  try {
    make_policy(c);
    ADD_FAILURE() << c.name << ": no error, expected one mentioning '" << needle << "'";
  } catch (const kvb::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- streaming_llm ------------------------------------------------------------------------------

TEST(StreamingLlm, KeepsSinksAndRecent) {
  const ModelShape shape{1, 2, 1, 2, 0};
  auto p = make_policy(config("streaming_llm", 6, shape, {{"sinks", "2"}}));
  EXPECT_FALSE(p->rolling_positions());
  EXPECT_FALSE(p->evict_before_attention());
  KvCache cache({1, 1, 2}, 16);
  for (int32_t t = 0; t < 10; ++t) append(cache, 0, t);
  LayerStats st;
  st.n_new = 10;
  st.num_heads = 2;
  prefill_layer(*p, st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 1, 6, 7, 8, 9}));  // 2 sinks + the last 4
  st.n_new = 1;
  for (int32_t t = 10; t < 13; ++t) {
    append(cache, 0, t);
    decode_layer(*p, st, cache);
  }
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 1, 9, 10, 11, 12}));
}

TEST(StreamingLlm, OriginalVariantsAndShortPrompt) {
  const ModelShape shape{1, 2, 1, 2, 0};
  auto p = make_policy(
      config("streaming_llm", 5, shape, {{"positions", "rolling"}, {"evict", "before_attention"}}));
  EXPECT_TRUE(p->rolling_positions());
  EXPECT_TRUE(p->evict_before_attention());
  KvCache cache({1, 1, 2}, 16);
  for (int32_t t = 0; t < 5; ++t) append(cache, 0, t);
  LayerStats st;  // evict-before-attention hooks get no statistics
  st.n_new = 5;
  st.num_heads = 2;
  prefill_layer(*p, st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 1, 2, 3, 4}));  // within budget: untouched
  st.n_new = 1;
  append(cache, 0, 5);
  decode_layer(*p, st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 1, 2, 3, 5}));  // 4 sinks + the newest
}

TEST(StreamingLlm, UsageErrors) {
  const ModelShape shape{1, 2, 1, 2, 0};
  expect_usage_error(config("streaming_llm", 4, shape), "must exceed sinks=4");
  expect_usage_error(config("streaming_llm", 3, shape, {{"sinks", "3"}}), "must exceed sinks=3");
  expect_usage_error(config("streaming_llm", 8, shape, {{"positions", "absolute"}}),
                     "choose one of: true, rolling");
  expect_usage_error(config("streaming_llm", 8, shape, {{"evict", "never"}}), "evict=never");
  expect_usage_error(config("streaming_llm", 8, shape, {{"sink", "2"}}), "has no option 'sink'");
  EXPECT_NO_THROW(make_policy(config("streaming_llm", 5, shape)));
}

// ---- scissorhands -------------------------------------------------------------------------------

// Two query heads over one KV head; `below[j]` lists the tokens query j (of the recorded
// queries) puts under its threshold 1/visible: they get probability 0.01 (as the GQA mean of
// 0 and 0.02), the others share the rest equally (each far above the threshold).
std::vector<float> gqa_rows(int stride, const std::vector<int>& visible,
                            const std::vector<std::vector<int>>& below) {
  const int w = static_cast<int>(visible.size());
  std::vector<float> probs(2 * w * stride, 0.0f);
  for (int j = 0; j < w; ++j) {
    const int n_low = static_cast<int>(below[j].size());
    const float high = (1.0f - 0.01f * n_low) / static_cast<float>(visible[j] - n_low);
    for (int s = 0; s < visible[j]; ++s) {
      const bool low = std::find(below[j].begin(), below[j].end(), s) != below[j].end();
      probs[(0 * w + j) * stride + s] = low ? 0.0f : high;
      probs[(1 * w + j) * stride + s] = low ? 0.02f : high;
    }
  }
  return probs;
}

TEST(Scissorhands, OneshotRecentWindowAndTies) {
  // B = 8: recent r = min(32, 2) = 2, drop m = 4. history 2: the last two prompt queries vote.
  const ModelShape shape{1, 2, 1, 2, 0};
  auto p = make_policy(config("scissorhands", 8, shape, {{"history", "2"}}));
  EXPECT_EQ(p->prefill_request(10).last_w, 2);
  KvCache cache({1, 1, 2}, 16);
  for (int32_t t = 0; t < 10; ++t) append(cache, 0, t);
  // Query 8 sees 9 keys (threshold 1/9), query 9 sees 10 (1/10).
  const int stride = 12;  // wider than the head, as when another head is longer
  std::vector<float> probs = gqa_rows(stride, {9, 10}, {{1, 2, 3, 7, 8}, {1, 3, 5, 8, 9}});
  // Token 1 at query 8: head 0 gives 0.2 (above 1/9), head 1 gives 0: the GQA mean 0.1 is below.
  probs[(0 * 2 + 0) * stride + 1] = 0.2f;
  probs[(1 * 2 + 0) * stride + 1] = 0.0f;
  prefill_layer(*p, stats(0, 10, 2, stride, 2, probs), cache);
  // Counters: 0:0 1:2 2:1 3:2 4:0 5:1 6:0 7:1 | recent 8 (counter 2) and 9 (1) are protected.
  // 10 > 8: one round drops m = 4: tokens 1 and 3 (counter 2), then two of 2, 5, 7 (counter 1):
  // the older ones, 2 and 5. Token 8, with the highest counter, survives in the recent window.
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 4, 6, 7, 8, 9}));
  EXPECT_GT(p->state_bytes(), 0u);
}

TEST(Scissorhands, OneshotDropsUntilWithinBudget) {
  // B = 16, m = 8: 40 tokens need three rounds (40 -> 16), 41 tokens four (41 -> 9), so the
  // prompt cache ends anywhere in (B - m, B]. Uniform probabilities are never below 1/(i+1), so
  // every counter is 0 and ties drop the oldest: the newest tokens remain.
  const ModelShape shape{1, 2, 1, 2, 0};
  for (const auto& [n, expect_len] : std::vector<std::pair<int, int>>{{40, 16}, {41, 9}}) {
    auto p = make_policy(config("scissorhands", 16, shape));
    KvCache cache({1, 1, 2}, 64);
    for (int32_t t = 0; t < n; ++t) append(cache, 0, t);
    const int w = 32;
    std::vector<float> probs(2 * w * n, 0.0f);
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < w; ++j) {
        const int visible = n - w + j + 1;
        for (int s = 0; s < visible; ++s) probs[(h * w + j) * n + s] = 1.0f / visible;
      }
    }
    prefill_layer(*p, stats(0, n, 2, n, w, probs), cache);
    V expect;
    for (int t = n - expect_len; t < n; ++t) expect.push_back(t);
    EXPECT_EQ(positions(cache, 0, 0), expect) << "n = " << n;
  }
}

// A cache whose positions have gaps (0, 10, 20, 30: earlier tokens evicted) then one decode
// step at position 40 with history 1: the current query alone decides.
V threshold_case(const std::string& threshold) {
  const ModelShape shape{1, 2, 1, 2, 0};
  // B = 4: r = 1, m = 2.
  auto p =
      make_policy(config("scissorhands", 4, shape, {{"history", "1"}, {"threshold", threshold}}));
  KvCache cache({1, 1, 2}, 16);
  for (int32_t t : {0, 10, 20, 30}) append(cache, 0, t);
  std::vector<float> prompt(2 * 4, 0.25f);  // last query: uniform, never below
  prefill_layer(*p, stats(0, 4, 2, 4, 1, prompt), cache);
  append(cache, 0, 40);
  // inv_cache: 1 / 5 keys = 0.2 -> slots 1 (0.01) and 2 (0.1) are below.
  // inv_position: 1 / 41 ~ 0.024 -> only slot 1 is below.
  std::vector<float> probs = {0.3f, 0.01f, 0.1f, 0.29f, 0.3f, 0.3f, 0.01f, 0.1f, 0.29f, 0.3f};
  decode_layer(*p, stats(0, 1, 2, 5, 1, probs), cache);
  return positions(cache, 0, 0);
}

TEST(Scissorhands, ThresholdVariants) {
  // 5 > 4: drop m = 2 of slots 0..3 (slot 4 is the recent window).
  EXPECT_EQ(threshold_case("inv_cache"), (V{0, 30, 40}));  // drops positions 10 and 20
  // Counters 0:0 1:1 2:0 3:0: drop position 10, then the oldest of the zero counters (0).
  EXPECT_EQ(threshold_case("inv_position"), (V{20, 30, 40}));
}

// Deterministic, uneven attention of one decode query over `len` slots (both query heads alike).
std::vector<float> uneven_row(int len, int step) {
  std::vector<float> w(2 * len);
  float sum = 0;
  for (int s = 0; s < len; ++s) {
    w[s] = static_cast<float>(((s * 7 + step * 13) % 11) * ((s * 5 + step) % 3) + 1);
    sum += w[s];
  }
  for (int s = 0; s < len; ++s) w[len + s] = w[s] = w[s] / sum;
  return w;
}

TEST(Scissorhands, OccupancyBetweenHalfAndFullBudget) {
  // Streamed token by token (decode rule only). B = 16, m = 8: after every step a head holds at
  // most 16, and right after a compression 16 + 1 - 8 = 9.
  const ModelShape shape{2, 2, 1, 2, 0};
  auto p = make_policy(config("scissorhands", 16, shape, {{"prefill", "streaming"}}));
  EXPECT_EQ(p->prefill_mode(), PrefillMode::kStreaming);
  KvCache cache({2, 1, 2}, 8);
  int lo = 1 << 30, hi = 0;
  double sum = 0;
  const int steps = 300;
  for (int32_t t = 0; t < steps; ++t) {
    for (int l = 0; l < 2; ++l) {
      append(cache, l, t);
      const int len = cache.length(l, 0);
      std::vector<float> probs = uneven_row(len, t + l);
      decode_layer(*p, stats(l, 1, 2, len, 1, probs), cache);
      const int after = cache.length(l, 0);
      ASSERT_LE(after, 16) << "step " << t << " layer " << l;
      V pos = positions(cache, l, 0);
      ASSERT_EQ(pos.back(), t);  // the newest token is inside the recent window
      ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
      if (t >= 16) {
        lo = std::min(lo, after);
        hi = std::max(hi, after);
        sum += after;
      }
    }
  }
  EXPECT_EQ(lo, 9);
  EXPECT_EQ(hi, 16);
  const double mean = sum / (2.0 * (steps - 16));
  EXPECT_GT(mean, 11.5);  // the cycle 9..16 averages 12.5
  EXPECT_LT(mean, 13.5);
}

TEST(Scissorhands, LinearIncreaseLayerBudgets) {
  // L = 4, B = 10: 10 * (3 + 2l) / 6 = 5, 8.33, 11.67, 15 -> floor below the middle, ceil above:
  // 5, 8, 12, 15 (sum 40 = 4 * 10). A head reaches exactly its layer's budget before it drops.
  const ModelShape shape{4, 2, 1, 2, 0};
  auto p = make_policy(config("scissorhands", 10, shape, {{"layer_budget", "linear_increase"}}));
  KvCache cache({4, 1, 2}, 8);
  V peak(4, 0);
  for (int32_t t = 0; t < 80; ++t) {
    for (int l = 0; l < 4; ++l) {
      append(cache, l, t);
      const int len = cache.length(l, 0);
      std::vector<float> probs = uneven_row(len, t);
      decode_layer(*p, stats(l, 1, 2, len, 1, probs), cache);
      peak[l] = std::max(peak[l], cache.length(l, 0));
    }
  }
  EXPECT_EQ(peak, (V{5, 8, 12, 15}));
}

TEST(Scissorhands, UsageErrors) {
  const ModelShape shape{2, 2, 1, 2, 0};
  expect_usage_error(config("scissorhands", 8, shape, {{"threshold", "half"}}),
                     "choose one of: inv_cache, inv_position");
  expect_usage_error(config("scissorhands", 8, shape, {{"history", "65"}}), "outside [1, 64]");
  expect_usage_error(config("scissorhands", 8, shape, {{"recent", "5"}, {"drop", "4"}}),
                     "recent=5 + drop=4");
  expect_usage_error(config("scissorhands", 1, shape), "every layer needs >= 2");
  expect_usage_error(config("scissorhands", 3, shape, {{"layer_budget", "linear_increase"}}),
                     "layer 0 gets a budget of 1");
}

// ---- tova ---------------------------------------------------------------------------------------

// One layer, 4 query heads over 2 KV heads, 6 prompt tokens, budget 3; the last query's rows.
std::vector<float> tova_prompt_rows() {
  return {
      0.15f, 0.05f, 0.25f, 0.28f, 0.15f, 0.12f,  // q0 (KV head 0)
      0.15f, 0.05f, 0.15f, 0.00f, 0.15f, 0.58f,  // q1 (KV head 0)
      0.40f, 0.10f, 0.10f, 0.10f, 0.10f, 0.20f,  // q2 (KV head 1)
      0.40f, 0.10f, 0.10f, 0.10f, 0.10f, 0.20f,  // q3 (KV head 1)
  };
}

TEST(Tova, HeadReduceKeepsTopOfLastQueryThenEvictsArgmin) {
  const ModelShape shape{1, 4, 2, 2, 0};
  auto p = make_policy(config("tova", 3, shape));
  EXPECT_EQ(p->prefill_request(6).last_w, 1);
  KvCache cache({1, 2, 2}, 16);
  for (int32_t t = 0; t < 6; ++t) append(cache, 0, t);
  std::vector<float> probs = tova_prompt_rows();
  prefill_layer(*p, stats(0, 6, 4, 6, 1, probs), cache);
  // Head 0: GQA mean 0.15 0.05 0.20 0.14 0.15 0.35 -> 5, 2, then the tie 0/4 keeps 4 (recent).
  // (q0 alone would keep 3; the max over the group would keep 3 as well.)
  EXPECT_EQ(positions(cache, 0, 0), (V{2, 4, 5}));
  // Head 1: 0.4 (0), 0.2 (5), then four tokens tie at 0.1: the most recent, 4.
  EXPECT_EQ(positions(cache, 0, 1), (V{0, 4, 5}));
  append(cache, 0, 6);
  std::vector<float> step = {0.3f,  0.1f,  0.2f,  0.4f,  0.3f,  0.1f,  0.2f,  0.4f,    // head 0
                             0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};  // head 1
  decode_layer(*p, stats(0, 1, 4, 4, 1, step), cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{2, 5, 6}));  // lowest: position 4 (0.1)
  EXPECT_EQ(positions(cache, 0, 1), (V{4, 5, 6}));  // all equal: the oldest goes
}

// keep_last (kvpress 0.5.5's TOVAPress): the last prompt token stays although its own attention
// is the lowest, beside the top kv_budget - 1 of the others; decode is unchanged.
TEST(Tova, KeepLastKeepsTheLastPromptTokenBesideTheTop) {
  const ModelShape shape{1, 1, 1, 2, 0};
  const std::vector<float> row = {0.4f, 0.1f, 0.3f, 0.15f, 0.05f};
  for (const char* reduce : {"head", "layer"}) {
    SCOPED_TRACE(reduce);
    for (const bool keep_last : {false, true}) {
      auto p = make_policy(config("tova", 2, shape,
                                  {{"tova_reduce", reduce},
                                   {"keep_last", keep_last ? "true" : "false"}}));
      KvCache cache({1, 1, 2}, 16);
      for (int32_t t = 0; t < 5; ++t) append(cache, 0, t);
      std::vector<float> probs = row;
      prefill_layer(*p, stats(0, 5, 1, 5, 1, probs), cache);
      EXPECT_EQ(positions(cache, 0, 0), keep_last ? (V{0, 4}) : (V{0, 2}));
      // Decode evicts the argmin, the newest token included.
      append(cache, 0, 5);
      std::vector<float> step = {0.5f, 0.3f, 0.2f};
      decode_layer(*p, stats(0, 1, 1, 3, 1, step), cache);
      EXPECT_EQ(positions(cache, 0, 0), keep_last ? (V{0, 4}) : (V{0, 2}));
    }
  }
}

TEST(Tova, LayerReduceSharesOneKeepSet) {
  const ModelShape shape{1, 4, 2, 2, 0};
  auto p = make_policy(config("tova", 3, shape, {{"tova_reduce", "layer"}}));
  KvCache cache({1, 2, 2}, 16);
  for (int32_t t = 0; t < 6; ++t) append(cache, 0, t);
  std::vector<float> probs = tova_prompt_rows();
  // Layer mean over the 4 heads: .275 .075 .15 .12 .125 .275 -> 0, 5, 2 for both KV heads.
  prefill_layer(*p, stats(0, 6, 4, 6, 1, probs), cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 2, 5}));
  EXPECT_EQ(positions(cache, 0, 1), (V{0, 2, 5}));
  expect_usage_error(config("tova", 3, shape, {{"tova_reduce", "model"}}),
                     "choose one of: head, layer");
}

// ---- knorm --------------------------------------------------------------------------------------

// Pre-RoPE keys of 5 tokens, 2 model KV heads, head_dim 2: [n, kv_head, d].
// KV head 0 norms: 5 1 1 1 10; KV head 1 norms: 1 2 3 4 5.
const std::vector<float> kKnormKeys = {
    3, 4,  /**/ 1, 0,  // token 0
    1, 0,  /**/ 0, 2,  // token 1
    0, 1,  /**/ 3, 0,  // token 2
    0, -1, /**/ 0, 4,  // token 3
    6, 8,  /**/ 5, 0,  // token 4
};

V knorm_keep(int budget, bool expand, int cache_head) {
  const ModelShape shape{1, 4, 2, 2, 0};
  auto p =
      make_policy(config("knorm", budget, shape, {{"gqa", expand ? "expand" : "per_kv_head"}}));
  EXPECT_TRUE(p->prefill_request(5).pre_rope_keys);
  KvCache cache({1, expand ? 4 : 2, 2}, 16);
  for (int32_t t = 0; t < 5; ++t) append(cache, 0, t);
  LayerStats st;
  st.n_new = 5;
  st.num_heads = 4;
  st.pre_rope_keys = kKnormKeys.data();
  prefill_layer(*p, st, cache);
  // No decode eviction: the head grows by one.
  const int before = cache.length(0, cache_head);
  append(cache, 0, 5);
  const std::vector<float> step_keys = {100, 0, 100, 0};
  st.n_new = 1;
  st.pre_rope_keys = step_keys.data();
  decode_layer(*p, st, cache);
  EXPECT_EQ(cache.length(0, cache_head), before + 1);
  V pos = positions(cache, 0, cache_head);
  pos.pop_back();  // the decode token
  return pos;
}

TEST(Knorm, KeepsLowestPreRopeKeyNorms) {
  EXPECT_EQ(knorm_keep(3, false, 0), (V{1, 2, 3}));  // norms 1 1 1
  EXPECT_EQ(knorm_keep(2, false, 0), (V{2, 3}));     // three-way tie at 1: the more recent two
  EXPECT_EQ(knorm_keep(3, false, 1), (V{0, 1, 2}));  // norms 1 2 3
  EXPECT_EQ(knorm_keep(9, false, 1), (V{0, 1, 2, 3, 4}));  // within budget: untouched
}

TEST(Knorm, ExpandedGqaReadsTheModelKvHead) {
  // gqa=expand: 4 cache heads; cache heads 0, 1 copy model KV head 0, heads 2, 3 model head 1.
  EXPECT_EQ(knorm_keep(2, true, 1), (V{2, 3}));
  EXPECT_EQ(knorm_keep(2, true, 2), (V{0, 1}));
  EXPECT_EQ(knorm_keep(2, true, 3), (V{0, 1}));
}

// ---- random -------------------------------------------------------------------------------------

// 20 prompt tokens, 2 KV heads, budget 5; returns the keep-sets of both heads after prefill.
std::vector<V> random_prefill(uint64_t seed) {
  const ModelShape shape{1, 2, 2, 2, 0};
  auto p = make_policy(config("random", 5, shape, {}, seed));
  KvCache cache({1, 2, 2}, 32);
  for (int32_t t = 0; t < 20; ++t) append(cache, 0, t);
  LayerStats st;
  st.n_new = 20;
  st.num_heads = 2;
  prefill_layer(*p, st, cache);
  return {positions(cache, 0, 0), positions(cache, 0, 1)};
}

TEST(Random, SeededReproducibleAndWithinBudget) {
  const std::vector<V> a = random_prefill(7), b = random_prefill(7), c = random_prefill(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]);  // heads draw independently
  for (const V& keep : a) {
    EXPECT_EQ(keep.size(), 5u);
    EXPECT_TRUE(std::is_sorted(keep.begin(), keep.end()));
  }
  // Decode: one eviction per step, never above the budget; the same seed replays the same steps.
  auto run = [](uint64_t seed) {
    const ModelShape shape{1, 2, 1, 2, 0};
    auto p = make_policy(config("random", 5, shape, {}, seed));
    KvCache cache({1, 1, 2}, 16);
    LayerStats st;
    st.n_new = 1;
    st.num_heads = 2;
    std::vector<V> trace;
    for (int32_t t = 0; t < 40; ++t) {
      append(cache, 0, t);
      decode_layer(*p, st, cache);
      EXPECT_EQ(cache.length(0, 0), std::min(t + 1, 5));
      trace.push_back(positions(cache, 0, 0));
    }
    return trace;
  };
  EXPECT_EQ(run(3), run(3));
  EXPECT_NE(run(3), run(4));
}

TEST(Random, KeepSetIsUniform) {
  // Over 2000 seeds each of the 20 positions is kept with probability 5/20: expected 1000 per
  // position over both heads, standard deviation ~19.4 per head; allow 6 sigma of the sum.
  std::vector<int> kept(20, 0);
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    for (const V& keep : random_prefill(seed)) {
      for (int32_t pos : keep) ++kept[pos];
    }
  }
  for (int pos = 0; pos < 20; ++pos) {
    EXPECT_NEAR(kept[pos], 1000, 165) << "position " << pos;
  }
}

}  // namespace
}  // namespace kvb::policies
