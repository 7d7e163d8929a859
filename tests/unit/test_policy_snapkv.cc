// Tests the SnapKV family (POLICIES.md `snapkv`, `pyramidkv`, `ada_snapkv`/`ada_pyramidkv`) by
// driving on_prefill_layer directly with hand-chosen last-w probabilities and checking the kept
// positions per head against hand-computed keep-sets: pooling, window, ties, the no-compression
// threshold, GQA mean before pooling, pyramid layer budgets and Ada-KV head budgets.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/snapkv_family.h"

namespace kvb::policies {
namespace {

using V = std::vector<int32_t>;
using Opts = std::map<std::string, std::string>;

ModelShape shape(int layers, int num_heads, int num_kv_heads) {
  return {layers, num_heads, num_kv_heads, /*head_dim=*/4, /*max_seq_len=*/0};
}

std::unique_ptr<Policy> make(const std::string& name, int kv_budget, const ModelShape& s,
                             const Opts& opts = {}) {
  PolicyConfig c;
  c.name = name;
  c.kv_budget = kv_budget;
  c.shape = s;
  c.options = PolicyOptions(opts);
  return make_policy(c);
}

SnapKvFamily& family(Policy& p) {
  auto* f = dynamic_cast<SnapKvFamily*>(&p);
  if (f == nullptr) throw std::runtime_error("not a SnapKV-family policy");
  return *f;
}

// A cache whose every (layer, head) holds positions 0..n-1 (keys and values are irrelevant).
kernels::KvCache filled_cache(int layers, int kv_heads, int n) {
  kernels::KvCache cache({layers, kv_heads, 4}, n + 4);
  const std::vector<float> kv(4, 0.0f);
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < kv_heads; ++h) {
      for (int t = 0; t < n; ++t) cache.append(l, h, kv.data(), kv.data(), t);
    }
  }
  cache.advance_position(n);
  return cache;
}

V kept_positions(kernels::KvCache& cache, int layer, int head) {
  const int32_t* p = cache.layer(layer).position(head);
  return V(p, p + cache.length(layer, head));
}

// last_probs: (num_heads, w, stride) as the engine lays them out.
struct Probs {
  int num_heads, w, stride;
  std::vector<float> data;
  Probs(int heads, int window, int n)
      : num_heads(heads), w(window), stride(n), data(static_cast<size_t>(heads) * window * n) {}
  void set(int q, int a, const std::vector<float>& row) {
    std::copy(row.begin(), row.end(), &data[(static_cast<size_t>(q) * w + a) * stride]);
  }
  void set_all(int q, const std::vector<float>& row) {
    for (int a = 0; a < w; ++a) set(q, a, row);
  }
  LayerStats stats(int layer) const {
    LayerStats st;
    st.layer = layer;
    st.n_new = stride;
    st.num_heads = num_heads;
    st.stride = stride;
    st.last_probs = data.data();
    st.last_w = w;
    return st;
  }
};

// One layer, one head, 10 tokens, kv_budget 4, window 2 (w = 2, base 2): the prefix row x over
// slots 0..7 is the mean of the two window queries' rows 2x and 0; both put 5.0 on the window
// slots 8, 9, which must not leak into the prefix's pooling (slot 7 would win if it did).
V snap_single(const Opts& opts, const std::vector<float>& x) {
  auto p = make("snapkv", 4, shape(1, 1, 1), opts);
  EXPECT_EQ(family(*p).window(), 2);
  auto cache = filled_cache(1, 1, 10);
  Probs probs(1, 2, 10);
  std::vector<float> doubled(10, 5.0f), nothing(10, 5.0f);
  for (size_t j = 0; j < x.size(); ++j) {
    doubled[j] = 2.0f * x[j];
    nothing[j] = 0.0f;
  }
  probs.set(0, 0, doubled);
  probs.set(0, 1, nothing);
  prefill_layer(*p, probs.stats(0), cache);
  EXPECT_EQ(family(*p).head_budgets(0), (V{2}));
  return kept_positions(cache, 0, 0);
}

TEST(SnapKv, PrefillRequestAsksForTheWindow) {
  auto w_of = [](int budget, const Opts& o) {
    auto p = make("snapkv", budget, shape(2, 2, 2), o);
    const StatsRequest r = p->prefill_request(1000);
    EXPECT_FALSE(r.col_sums);
    EXPECT_FALSE(p->decode_request().col_sums);
    EXPECT_EQ(p->decode_request().last_w, 0);  // no decode statistics: no decode eviction
    EXPECT_EQ(family(*p).window(), r.last_w);
    return r.last_w;
  };
  EXPECT_EQ(w_of(128, {}), 32);               // min(32, 64)
  EXPECT_EQ(w_of(40, {}), 20);                // min(32, floor(40/2))
  EXPECT_EQ(w_of(64, {{"window", "8"}}), 8);  // KVCache-Factory's window
  EXPECT_EQ(w_of(1, {}), 1);                  // floor(1/2) = 0, raised to 1
  for (const char* name : {"pyramidkv", "ada_snapkv", "ada_pyramidkv"}) {
    EXPECT_EQ(make(name, 128, shape(2, 2, 2))->prefill_request(1000).last_w, 32) << name;
  }
}

TEST(SnapKv, PoolingChangesTheChoice) {
  const std::vector<float> x = {0.1f, 0.0f, 0.6f, 0.0f, 0.4f, 0.45f, 0.4f, 0.0f};
  // No pooling: the two largest scores, slots 2 (0.6) and 5 (0.45); plus the window 8, 9.
  EXPECT_EQ(snap_single({{"window", "2"}, {"pool_kernel", "1"}}, x), (V{2, 5, 8, 9}));
  // Max pool, kernel 3: [.1 .6 .6 .6 .45 .45 .45 .4]; 0.6 ties at 1..3, the recent two stay.
  EXPECT_EQ(snap_single({{"window", "2"}, {"pool_kernel", "3"}}, x), (V{2, 3, 8, 9}));
  // Avg pool, kernel 3 (padding counts): slot 5 (1.25/3) and slot 3 (1.0/3).
  EXPECT_EQ(snap_single({{"window", "2"}, {"pool_kernel", "3"}, {"pooling", "avg"}}, x),
            (V{3, 5, 8, 9}));
  // Default kernel 7 (max): 0.6 reaches slots 0..5; the recent two stay.
  EXPECT_EQ(snap_single({{"window", "2"}}, x), (V{4, 5, 8, 9}));
  // window_reduce: sum scales the row by w and does not change the choice.
  EXPECT_EQ(snap_single({{"window", "2"}, {"pool_kernel", "1"}, {"window_reduce", "sum"}}, x),
            (V{2, 5, 8, 9}));
}

TEST(SnapKv, WindowIsKeptEvenWithoutAttention) {
  // Every query attends only to slots 0 and 1; the window (8, 9) gets nothing and stays.
  auto p = make("snapkv", 4, shape(1, 1, 1), {{"window", "2"}, {"pool_kernel", "1"}});
  auto cache = filled_cache(1, 1, 10);
  Probs probs(1, 2, 10);
  probs.set_all(0, {0.6f, 0.4f, 0, 0, 0, 0, 0, 0, 0, 0});
  prefill_layer(*p, probs.stats(0), cache);
  EXPECT_EQ(kept_positions(cache, 0, 0), (V{0, 1, 8, 9}));
  EXPECT_EQ(family(*p).head_budgets(0), (V{2}));
}

TEST(SnapKv, TiesKeepTheMoreRecent) {
  const std::vector<float> flat(8, 0.1f);
  EXPECT_EQ(snap_single({{"window", "2"}, {"pool_kernel", "1"}}, flat), (V{6, 7, 8, 9}));
  EXPECT_EQ(snap_single({{"window", "2"}, {"pool_kernel", "3"}, {"pooling", "avg"}}, flat),
            (V{5, 6, 8, 9}));  // the edge slot 7 loses a padded zero: 0.2/3 < 0.3/3
}

TEST(SnapKv, PromptWithinBudgetIsNotCompressed) {
  for (const char* name : {"snapkv", "pyramidkv", "ada_snapkv", "ada_pyramidkv"}) {
    // kv_budget 10, w = 2: a 10-token prompt stays whole (budget = prefix 8 per head) ...
    auto p = make(name, 10, shape(2, 3, 3), {{"window", "2"}});
    auto cache = filled_cache(2, 3, 10);
    Probs probs(3, 2, 10);
    for (int q = 0; q < 3; ++q) probs.set_all(q, {0.5f, 0, 0, 0, 0, 0, 0, 0, 0.3f, 0.2f});
    for (int l = 0; l < 2; ++l) prefill_layer(*p, probs.stats(l), cache);
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(family(*p).head_budgets(l), (V{8, 8, 8})) << name;
      for (int h = 0; h < 3; ++h) EXPECT_EQ(cache.length(l, h), 10) << name;
    }
  }
  // ... and one more token compresses (strictly more than the budget).
  auto p = make("snapkv", 10, shape(1, 1, 1), {{"window", "2"}});
  auto cache = filled_cache(1, 1, 11);
  Probs probs(1, 2, 11);
  probs.set_all(0, std::vector<float>(11, 0.1f));
  prefill_layer(*p, probs.stats(0), cache);
  EXPECT_EQ(kept_positions(cache, 0, 0), (V{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(family(*p).head_budgets(0), (V{8}));
}

TEST(SnapKv, GqaMeanIsTakenBeforePooling) {
  // 4 query heads on 2 KV heads; kv_budget 2, window 1: w = 1, base 1, n = 8 (window = slot 7).
  auto run = [](const Opts& extra) {
    Opts o = {{"window", "1"}, {"pool_kernel", "3"}};
    o.insert(extra.begin(), extra.end());
    auto p = make("snapkv", 2, shape(1, 4, 2), o);
    auto cache = filled_cache(1, 2, 8);
    Probs probs(4, 1, 8);
    probs.set_all(0, {0.9f, 0, 0, 0, 0.5f, 0, 0, 0});
    probs.set_all(1, {0, 0, 0.9f, 0, 0.5f, 0, 0, 0});
    probs.set_all(2, {0.7f, 0, 0, 0, 0, 0, 0, 0});
    probs.set_all(3, {0.7f, 0, 0, 0, 0, 0, 0, 0});
    prefill_layer(*p, probs.stats(0), cache);
    return std::vector<V>{kept_positions(cache, 0, 0), kept_positions(cache, 0, 1)};
  };
  // KV head 0, mean then pool: [.45 0 .45 0 .5 0 0] -> [.45 .45 .45 .5 .5 .5 0] -> slot 5.
  // (Pooling each query head first and then averaging would give [.45 .9 .45 .7 .5 .5 .25],
  // i.e. slot 1.) KV head 1 sees only query heads 2 and 3: [.7 .7 0 ...] -> slot 1.
  EXPECT_EQ(run({}), (std::vector<V>{{5, 7}, {1, 7}}));
  // gqa_reduce: max, also before pooling: [.9 0 .9 0 .5 0 0] -> [.9 .9 .9 .9 .5 .5 0] -> slot 3.
  EXPECT_EQ(run({{"gqa_reduce", "max"}}), (std::vector<V>{{3, 7}, {1, 7}}));
}

TEST(SnapKv, GqaExpandDecidesPerQueryHead) {
  // gqa: expand gives the cache one "KV head" per query head, each scored by its own row.
  auto p =
      make("snapkv", 2, shape(1, 2, 1), {{"window", "1"}, {"pool_kernel", "3"}, {"gqa", "expand"}});
  ASSERT_EQ(p->cache_kv_heads(), 2);
  auto cache = filled_cache(1, 2, 8);
  Probs probs(2, 1, 8);
  probs.set_all(0, {0.9f, 0, 0, 0, 0.5f, 0, 0, 0});  // pooled [.9 .9 0 .5 .5 .5 0] -> 1
  probs.set_all(1, {0, 0, 0.9f, 0, 0.5f, 0, 0, 0});  // pooled [0 .9 .9 .9 .5 .5 0] -> 3
  prefill_layer(*p, probs.stats(0), cache);
  EXPECT_EQ(kept_positions(cache, 0, 0), (V{1, 7}));
  EXPECT_EQ(kept_positions(cache, 0, 1), (V{3, 7}));
}

// Four layers, one head; decreasing scores, so layer l keeps prefix slots 0..B_l-1 + the window.
std::vector<V> pyramid_run(const std::string& name, int n, const Opts& extra, Policy** out_policy,
                           std::unique_ptr<Policy>& holder) {
  Opts o = {{"window", "2"}, {"pool_kernel", "1"}};
  o.insert(extra.begin(), extra.end());
  holder = make(name, 8, shape(4, 1, 1), o);
  *out_policy = holder.get();
  auto cache = filled_cache(4, 1, n);
  Probs probs(1, 2, n);
  std::vector<float> row(n);
  for (int j = 0; j < n; ++j) row[j] = 1.0f - 0.01f * j;
  probs.set_all(0, row);
  std::vector<V> kept;
  for (int l = 0; l < 4; ++l) {
    prefill_layer(*holder, probs.stats(l), cache);
    kept.push_back(kept_positions(cache, l, 0));
  }
  return kept;
}

V range_plus_window(int prefix_keep, int n) {
  V v(prefix_keep);
  std::iota(v.begin(), v.end(), 0);
  v.push_back(n - 2);
  v.push_back(n - 1);
  return v;
}

TEST(PyramidKv, IntegerLayerBudgets) {
  Policy* p = nullptr;
  std::unique_ptr<Policy> holder;
  // kv_budget 8, w 2, beta 3, L 4, n 20: base 6, min 6/3 = 2, max 12-2 = 10 (< n-w = 18),
  // step (10-2)/3 = 2: layers select 10, 8, 6, 4 (mean 7 > base 6, integer arithmetic).
  auto kept = pyramid_run("pyramidkv", 20, {{"beta", "3"}}, &p, holder);
  const V b20 = {10, 8, 6, 4};
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(family(*p).head_budgets(l), (V{b20[l]})) << "layer " << l;
    EXPECT_EQ(kept[l], range_plus_window(b20[l], 20)) << "layer " << l;
  }
  // n 11: max 10 >= n-w = 9, so max = 9, min = 12-9 = 3, step (9-3)/3 = 2: 9, 7, 5, 3.
  kept = pyramid_run("pyramidkv", 11, {{"beta", "3"}}, &p, holder);
  const V b11 = {9, 7, 5, 3};
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(family(*p).head_budgets(l), (V{b11[l]})) << "layer " << l;
    EXPECT_EQ(kept[l], range_plus_window(b11[l], 11)) << "layer " << l;
  }
  // Default beta 20, n 20: min 6/20 = 0, max 12, step 12/3 = 4: 12, 8, 4, 0 (window only).
  kept = pyramid_run("pyramidkv", 20, {}, &p, holder);
  const V b_default = {12, 8, 4, 0};
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(family(*p).head_budgets(l), (V{b_default[l]})) << "layer " << l;
    EXPECT_EQ(kept[l], range_plus_window(b_default[l], 20)) << "layer " << l;
  }
}

// Three KV heads, kv_budget 6, window 2 (w 2, base 4), n 12 (prefix 10), no pooling.
// The 12 = h*base highest scores: 8 in head 0 (all >= 0.6), 3 in head 1 (0.88, 0.55, 0.5), 1 in
// head 2 (0.99); the 13th is 0.2.
std::unique_ptr<Policy> ada_three_heads(const Opts& extra, kernels::KvCache& cache) {
  Opts o = {{"window", "2"}, {"pool_kernel", "1"}};
  o.insert(extra.begin(), extra.end());
  auto p = make("ada_snapkv", 6, shape(1, 3, 3), o);
  Probs probs(3, 2, 12);
  probs.set_all(0, {0.9f, 0.8f, 0.85f, 0.7f, 0.75f, 0.65f, 0.6f, 0.95f, 0.1f, 0.05f, 0, 0});
  probs.set_all(1, {0.2f, 0.88f, 0.02f, 0.03f, 0.5f, 0.01f, 0.04f, 0.02f, 0.55f, 0.03f, 0, 0});
  probs.set_all(2, {0.01f, 0.03f, 0.02f, 0.01f, 0.02f, 0.01f, 0.99f, 0.01f, 0.02f, 0.03f, 0, 0});
  prefill_layer(*p, probs.stats(0), cache);
  return p;
}

TEST(AdaSnapKv, HeadBudgetsWithAlphaHalf) {
  auto cache = filled_cache(1, 3, 12);
  auto p = ada_three_heads({}, cache);
  // counts 8, 3, 1; B_i = round_half_even(0.5*count + floor(0.5*4)) = round(6), round(3.5) = 4,
  // round(2.5) = 2.
  const V budgets = family(*p).head_budgets(0);
  EXPECT_EQ(budgets, (V{6, 4, 2}));
  EXPECT_EQ(kept_positions(cache, 0, 0), (V{0, 1, 2, 3, 4, 7, 10, 11}));
  EXPECT_EQ(kept_positions(cache, 0, 1), (V{0, 1, 4, 8, 10, 11}));
  EXPECT_EQ(kept_positions(cache, 0, 2), (V{6, 9, 10, 11}));  // 0.03 ties at 1 and 9: 9 stays
  int total = 0;
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(cache.length(0, h), budgets[h] + 2) << "head " << h;  // exactly B_i + w
    total += cache.length(0, h);
  }
  EXPECT_EQ(std::accumulate(budgets.begin(), budgets.end(), 0), 12);  // = h*base here
  EXPECT_EQ(total, 12 + 3 * 2);  // the layer's total is the sum of the heads' budgets
  EXPECT_EQ(cache.total_slots(), total);
}

TEST(AdaSnapKv, AlphaEndpoints) {
  {  // alpha 0: pure adaptive, B_i = count_i.
    auto cache = filled_cache(1, 3, 12);
    auto p = ada_three_heads({{"alpha", "0"}}, cache);
    EXPECT_EQ(family(*p).head_budgets(0), (V{8, 3, 1}));
    EXPECT_EQ(kept_positions(cache, 0, 1), (V{1, 4, 8, 10, 11}));
  }
  {  // alpha 1: the uniform floor, as snapkv.
    auto cache = filled_cache(1, 3, 12);
    auto p = ada_three_heads({{"alpha", "1"}}, cache);
    EXPECT_EQ(family(*p).head_budgets(0), (V{4, 4, 4}));
  }
}

TEST(AdaPyramidKv, PyramidBaseThenAdaptiveSplit) {
  // Two layers, two heads, kv_budget 6, window 2, beta 2, n 12: base 4, min 2, max 6, step 4:
  // layer 0 base 6, layer 1 base 2. Head 0's scores all beat head 1's.
  auto p = make("ada_pyramidkv", 6, shape(2, 2, 2),
                {{"window", "2"}, {"pool_kernel", "1"}, {"beta", "2"}});
  auto cache = filled_cache(2, 2, 12);
  Probs probs(2, 2, 12);
  std::vector<float> strong(12, 0), weak(12, 0);
  for (int j = 0; j < 10; ++j) {
    strong[j] = 1.0f - 0.05f * j;
    weak[j] = 0.1f - 0.005f * j;
  }
  probs.set_all(0, strong);
  probs.set_all(1, weak);
  for (int l = 0; l < 2; ++l) prefill_layer(*p, probs.stats(l), cache);
  // Layer 0: top 12 = head 0's 10 + head 1's 2: B = round(5 + 3), round(1 + 3) = 8, 4.
  EXPECT_EQ(family(*p).head_budgets(0), (V{8, 4}));
  EXPECT_EQ(kept_positions(cache, 0, 0), (V{0, 1, 2, 3, 4, 5, 6, 7, 10, 11}));
  EXPECT_EQ(kept_positions(cache, 0, 1), (V{0, 1, 2, 3, 10, 11}));
  // Layer 1: top 4 all in head 0: B = round(2 + 1), round(0 + 1) = 3, 1.
  EXPECT_EQ(family(*p).head_budgets(1), (V{3, 1}));
  EXPECT_EQ(kept_positions(cache, 1, 0), (V{0, 1, 2, 10, 11}));
  EXPECT_EQ(kept_positions(cache, 1, 1), (V{0, 10, 11}));
}

TEST(SnapKvFamily, DecodeDoesNotEvict) {
  auto cache = filled_cache(1, 3, 12);
  auto p = ada_three_heads({}, cache);
  const std::vector<float> kv(4, 0.0f);
  for (int step = 0; step < 3; ++step) {
    cache.reserve_extra(1);
    for (int h = 0; h < 3; ++h) cache.append(0, h, kv.data(), kv.data(), 12 + step);
    LayerStats st;
    st.layer = 0;
    st.n_new = 1;
    st.num_heads = 3;
    decode_layer(*p, st, cache);
  }
  EXPECT_EQ(cache.length(0, 0), 8 + 3);
  EXPECT_EQ(cache.length(0, 1), 6 + 3);
  EXPECT_EQ(cache.length(0, 2), 4 + 3);
}

TEST(SnapKvFamily, RegisteredWithDocumentedOptions) {
  for (const char* name : {"snapkv", "pyramidkv", "ada_snapkv", "ada_pyramidkv"}) {
    const PolicyInfo* info = find_policy(name);
    ASSERT_NE(info, nullptr) << name;
    std::vector<std::string> names;
    for (const auto& d : info->params) names.push_back(d.name + "=" + d.default_value);
    for (const char* want :
         {"window=32", "pool_kernel=7", "pooling=max", "window_reduce=mean", "gqa_reduce=mean"}) {
      EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << name << " " << want;
    }
    const std::string n = name;
    const bool ada = n.rfind("ada_", 0) == 0, pyramid = n.find("pyramid") != std::string::npos;
    EXPECT_EQ(std::find(names.begin(), names.end(), "alpha=0.5") != names.end(), ada) << name;
    EXPECT_EQ(std::find(names.begin(), names.end(), "beta=20") != names.end(), pyramid) << name;
  }
}

void expect_usage_error(const std::string& name, const Opts& opts, const std::string& needle) {
  try {
    make(name, 64, shape(2, 2, 2), opts);
    ADD_FAILURE() << name << " accepted a bad option; expected: " << needle;
  } catch (const kvb::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SnapKvFamily, BadOptionsAreUsageErrors) {
  expect_usage_error("snapkv", {{"pooling", "median"}}, "choose one of: max, avg");
  expect_usage_error("snapkv", {{"window_reduce", "max"}}, "choose one of: mean, sum");
  expect_usage_error("ada_snapkv", {{"gqa_reduce", "sum"}}, "choose one of: mean, max");
  expect_usage_error("snapkv", {{"pool_kernel", "4"}}, "must be odd");
  expect_usage_error("pyramidkv", {{"window", "0"}}, "outside [1,");
  expect_usage_error("ada_snapkv", {{"alpha", "1.5"}}, "outside [0, 1]");
  // Unknown names: snapkv has no alpha or beta; the error lists what it has.
  expect_usage_error("snapkv", {{"alpha", "0.5"}}, "window, pool_kernel, pooling");
  expect_usage_error("ada_snapkv", {{"beta", "20"}}, "has no option 'beta'");
}

// chunkkv on snapkv (kvpress ChunkKVPress over SnapKVPress): two KV heads, 12 tokens, kv_budget 6,
// window 2, no pooling. Prefix scores head 0 (1 1 1 0 0 0 2 2 2 0), head 1 (0 0 0 0 0 0 1 1 1 3);
// the window slots 10, 11 get the layer's maximum + 1 = 4 in each head. Sums 1 1 1 0 0 0 3 3 3 3
// 8 8; chunks of 3 have means 1, 0, 3 and 19/3; at most floor(7 x 4 / 12) = 2 chunks: slots 6-11
// in both heads (B_i = 4 prefix slots). Without it each head keeps its own top 4 and the window.
TEST(SnapKv, ChunkKvKeepsWholeChunksWithTheWindowPaddedByTheMaximum) {
  auto run = [](const Opts& extra) {
    Opts o = {{"window", "2"}, {"pool_kernel", "1"}};
    o.insert(extra.begin(), extra.end());
    auto p = make("snapkv", 6, shape(1, 2, 2), o);
    auto cache = filled_cache(1, 2, 12);
    Probs probs(2, 2, 12);
    probs.set_all(0, {1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 0.5f, 0.5f});
    probs.set_all(1, {0, 0, 0, 0, 0, 0, 1, 1, 1, 3, 0.5f, 0.5f});
    prefill_layer(*p, probs.stats(0), cache);
    return std::tuple{kept_positions(cache, 0, 0), kept_positions(cache, 0, 1),
                      family(*p).head_budgets(0)};
  };
  EXPECT_EQ(run({{"chunkkv", "3"}}),
            (std::tuple{V{6, 7, 8, 9, 10, 11}, V{6, 7, 8, 9, 10, 11}, V{4, 4}}));
  EXPECT_EQ(run({}), (std::tuple{V{2, 6, 7, 8, 10, 11}, V{6, 7, 8, 9, 10, 11}, V{4, 4}}));
  // A prompt shorter than one chunk: SnapKV's own selection (kvpress's fallback).
  EXPECT_EQ(run({{"chunkkv", "13"}}),
            (std::tuple{V{2, 6, 7, 8, 10, 11}, V{6, 7, 8, 9, 10, 11}, V{4, 4}}));
  expect_usage_error("pyramidkv", {{"chunkkv", "3"}}, "has no option 'chunkkv'");
}

// pyramidkv's `formula: kvpress` (kvpress PyramidKVPress.get_layer_budget, floats and Python's
// round): 3 layers, n = 100, window 4. Fraction 0.625 (kvpress compression_ratio 0.375) gives X =
// 62.5; beta 2: min 31.25, max 93.75, steps 31.25, so the layers keep round(93.75) = 94,
// round(62.5) = 62 (half to even) and round(31.25) = 31 tokens, window included: prefix budgets
// 90, 58, 27. Beta 20: min 3.125, max 121.875 capped at n - window = 96, so min = 125 - 96 = 29,
// steps 33.5: 96, round(62.5) = 62, 29 (prefix 92, 58, 25). Fraction 0.125 (X = 12.5): min
// 0.625 is below the window, so every layer keeps round(12.5) = 12 (prefix 8). A token budget of
// 62 reads X = 62: 93, 62, 31. Ada-KV's integer formula (the default) at budget 62: base 58, min
// 29, max 87, step 29: 87, 58, 29. kvpress 0.5.5's get_layer_budget gives the same numbers.
TEST(PyramidKv, KvpressFormulaFollowsPyramidKvPress) {
  auto budgets = [](Opts opts, double fraction, int kv_budget = 62) {
    PolicyConfig c;
    c.name = "pyramidkv";
    c.kv_budget = kv_budget;
    c.budget_fraction = fraction;
    c.shape = shape(3, 1, 1);
    opts["window"] = "4";
    c.options = PolicyOptions(opts);
    auto p = make_policy(c);
    auto cache = filled_cache(3, 1, 100);
    Probs probs(1, 4, 100);
    std::vector<float> row(100);
    std::iota(row.begin(), row.end(), 1.0f);
    probs.set_all(0, row);
    V out;
    for (int l = 0; l < 3; ++l) {
      prefill_layer(*p, probs.stats(l), cache);
      out.push_back(family(*p).head_budgets(l)[0]);
      EXPECT_EQ(cache.length(l, 0), out.back() + 4) << "layer " << l;
    }
    return out;
  };
  EXPECT_EQ(budgets({{"formula", "kvpress"}, {"beta", "2"}}, 0.625), (V{90, 58, 27}));
  EXPECT_EQ(budgets({{"formula", "kvpress"}}, 0.625), (V{92, 58, 25}));
  EXPECT_EQ(budgets({{"formula", "kvpress"}}, 0.125, 12), (V{8, 8, 8}));
  EXPECT_EQ(budgets({{"formula", "kvpress"}, {"beta", "2"}}, 0), (V{89, 58, 27}));
  EXPECT_EQ(budgets({{"beta", "2"}}, 0.625), (V{87, 58, 29}));
  expect_usage_error("pyramidkv", {{"formula", "x"}}, "formula");
}

}  // namespace
}  // namespace kvb::policies
