// `then:` (kvpress's ComposedPress of two token presses; kernels/policies/composed.cc): the
// first policy keeps max(1, int(n x (1 - first_compression_ratio))) of the prompt per head, then
// the second scores those survivors as a cache of their rows and keeps kv_budget of them.
// Checked against a hand-computed case, and against the independent expectation that the second
// policy, which decides from the cache's rows alone, keeps the same slots when it runs on the
// cache the first policy alone left behind (two hooks in turn, no scratch cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "policy_test_util.h"

namespace kvb::policies {
namespace {

using kernels::KvCache;
using V = std::vector<int32_t>;
using Opts = std::map<std::string, std::string>;

using testing_policy::config;
using testing_policy::positions;

// A cache of `layers` layers whose head h of every layer holds rows[h] as keys (values: the keys
// halved), at positions 0, 1, ...
KvCache cache_of(const std::vector<std::vector<std::vector<float>>>& rows, int dim,
                 int layers = 1) {
  int cap = 1;
  for (const auto& r : rows) cap = std::max(cap, static_cast<int>(r.size()));
  KvCache cache({layers, static_cast<int>(rows.size()), dim}, cap);
  for (int l = 0; l < layers; ++l) {
    for (size_t h = 0; h < rows.size(); ++h) {
      for (size_t j = 0; j < rows[h].size(); ++j) {
        std::vector<float> v = rows[h][j];
        for (float& x : v) x *= 0.5f;
        cache.append(l, static_cast<int>(h), rows[h][j].data(), v.data(), static_cast<int32_t>(j));
      }
    }
  }
  return cache;
}

// The prompt's statistics a hook of layer `layer` reads: pre-RoPE keys (the rows themselves,
// [n, heads, d]) for knorm, nothing else.
struct Stats {
  std::vector<float> pre;
  LayerStats st;
  Stats(const std::vector<std::vector<std::vector<float>>>& rows, int d, int layer) {
    const int heads = static_cast<int>(rows.size()), n = static_cast<int>(rows[0].size());
    pre.resize(static_cast<size_t>(n) * heads * d);
    for (int j = 0; j < n; ++j) {
      for (int h = 0; h < heads; ++h) {
        std::copy(rows[h][j].begin(), rows[h][j].end(),
                  pre.begin() + (static_cast<size_t>(j) * heads + h) * d);
      }
    }
    st.layer = layer;
    st.n_new = n;
    st.num_heads = heads;
    st.pre_rope_keys = pre.data();
  }
};

std::vector<std::vector<std::vector<float>>> random_rows(int heads, int n, int d, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<std::vector<std::vector<float>>> rows(heads);
  for (auto& head : rows) {
    head.resize(n);
    for (auto& row : head) {
      row.resize(d);
      for (float& x : row) x = g(rng) + 0.4f;  // a mean direction for keydiff to differ from
    }
  }
  return rows;
}

// knorm then keydiff, 8 two-dimensional keys, first_compression_ratio 0.5, kv_budget 2. Key
// norms: 4, 1, 2.236, 3, 2, 1.5, 2.5, 3.5; knorm keeps the 4 lowest, slots {1, 2, 4, 5}, whose
// unit keys (0,1), (.447,.894), (1,0), (-1,0) have the mean a = (.1118, .4736). Their cosines
// with a are .973, .973, .230, -.230, so keydiff keeps the two least similar: slots 4 and 5.
// Alone, keydiff at budget 2 keeps {5, 6} and knorm {1, 5}.
TEST(ComposedPolicy, KnormThenKeydiffKeepsTheHandComputedSlots) {
  const std::vector<std::vector<std::vector<float>>> rows = {
      {{4, 0}, {0, 1}, {1, 2}, {0, 3}, {2, 0}, {-1.5f, 0}, {0, -2.5f}, {3.5f, 0}}};
  const ModelShape shape{1, 1, 1, 2, 64};
  auto p = make_policy(
      config("knorm", 2, shape, {{"then", "keydiff"}, {"first_compression_ratio", "0.5"}}));
  p->begin_sequence(8);
  KvCache cache = cache_of(rows, 2);
  Stats s(rows, 2, 0);
  prefill_layer(*p, s.st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{4, 5}));
  // The values moved with their keys.
  EXPECT_EQ(cache.layer(0).value(0, 0)[0], 1.0f);
  EXPECT_EQ(cache.layer(0).value(0, 1)[0], -0.75f);
  for (const auto& [name, kept] :
       std::map<std::string, V>{{"keydiff", {5, 6}}, {"knorm", {1, 5}}}) {
    KvCache alone = cache_of(rows, 2);
    prefill_layer(*make_policy(config(name, 2, shape)), s.st, alone);
    EXPECT_EQ(positions(alone, 0, 0), kept) << name;
  }
  // Decode appends: the composition decides the prompt only.
  EXPECT_FALSE(p->evicts_at_decode());
  const float k[2] = {9, 9};
  cache.append(0, 0, k, k, 8);
  LayerStats dec = s.st;
  dec.n_new = 1;
  decode_layer(*p, dec, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{4, 5, 8}));
}

// Against the two hooks in turn: the second policy (reading the cache alone) on the cache the
// first policy alone left, at the first policy's budget. Random rows, 2 heads, 2 layers (the
// second policy's layer_ratios read the layer), several ratios and budgets, first policies that
// read statistics (knorm) or the cache (cur), second policies keydiff, cur and lagkv (with its
// own options through then.<option>).
TEST(ComposedPolicy, EqualsTheSecondPolicyOnTheFirstPolicysCache) {
  const int heads = 2, d = 4, n = 29, layers = 2;
  const auto rows = random_rows(heads, n, d, 5);
  const ModelShape shape{layers, heads, heads, d, 64};
  struct Case {
    std::string first;
    Opts first_opts;
    std::string second;
    Opts second_opts;
    // The unit's budget as a fraction of the prompt (PolicyConfig::budget_fraction): the second
    // policy still keeps kv_budget tokens of the survivors, its fraction kv_budget / their n.
    double fraction = 0;
  };
  const std::vector<Case> cases = {
      {"knorm", {}, "keydiff", {}},
      {"cur", {{"sinks", "2"}}, "keydiff", {{"layer_ratios", "0.5,0.25"}}},
      {"keydiff", {}, "cur", {}},
      {"knorm", {}, "lagkv", {{"lag", "4"}, {"sinks", "1"}}},
      {"keydiff", {{"ada", "true"}}, "keydiff", {}},
      {"knorm", {}, "keydiff", {{"chunk", "5"}}, 0.9},  // ChunkPress reads the fraction
  };
  for (const Case& k : cases) {
    for (double c : {0.0, 0.25, 0.6}) {
      for (int budget : {3, 9, 40}) {
        SCOPED_TRACE(k.first + " then " + k.second + " c " + std::to_string(c) + " budget " +
                     std::to_string(budget));
        Opts opts = k.first_opts;
        opts["then"] = k.second;
        opts["first_compression_ratio"] = std::to_string(c);
        for (const auto& [key, value] : k.second_opts) opts["then." + key] = value;
        PolicyConfig pc = config(k.first, budget, shape, opts);
        pc.budget_fraction = k.fraction;
        auto composed = make_policy(pc);
        composed->begin_sequence(n);
        const int first_budget = std::max(1, static_cast<int>(n * (1.0 - c)));
        auto first = make_policy(config(k.first, first_budget, shape, k.first_opts));
        auto second = make_policy(config(k.second, budget, shape, k.second_opts));
        first->begin_sequence(n);
        second->begin_sequence(n);
        KvCache got = cache_of(rows, d, layers), want = cache_of(rows, d, layers);
        for (int l = 0; l < layers; ++l) {
          Stats s(rows, d, l);
          prefill_layer(*composed, s.st, got);
          prefill_layer(*first, s.st, want);
          prefill_layer(*second, s.st, want);
        }
        for (int l = 0; l < layers; ++l) {
          for (int h = 0; h < heads; ++h) {
            EXPECT_EQ(positions(got, l, h), positions(want, l, h))
                << "layer " << l << " head " << h;
            // layer_ratios set the second policy's budget per layer instead of kv_budget; chunk
            // keeps at least one slot of every run.
            if (!k.second_opts.count("layer_ratios") && !k.second_opts.count("chunk")) {
              EXPECT_LE(got.length(l, h), budget);
            }
          }
        }
      }
    }
  }
}

// A second policy of the SnapKV family: its window's probabilities are recomputed over the
// first policy's survivors from the block's last queries (q.k / sqrt(d), each query seeing the
// survivors at or before its position). Expected: SnapKV's own hook on the cache the first
// policy left, given those probabilities as written here (f64 softmax per row, rounded to f32).
// 4 query heads over 2 KV heads, 30 slots, 6 recorded queries; ratios 0 (every slot survives) to
// 0.5 (some of the window's tokens are gone); window 4 and pooling 3, and ada_snapkv's
// allocation across heads.
TEST(ComposedPolicy, SnapKvFamilyScoresTheSurvivorsWithTheWindowsQueries) {
  const int kv = 2, qh = 4, d = 4, n = 30, nq = 6;
  const auto rows = random_rows(kv, n, d, 21);
  const auto queries = random_rows(1, nq * qh, d, 22)[0];  // [nq x qh] rows of d
  std::vector<float> last_queries;
  for (const auto& q : queries) last_queries.insert(last_queries.end(), q.begin(), q.end());
  const ModelShape shape{1, qh, kv, d, 64};
  for (const std::string second : {"snapkv", "ada_snapkv"}) {
    for (double c : {0.0, 0.2, 0.5}) {
      SCOPED_TRACE(second + " c " + std::to_string(c));
      const Opts own = {{"window", "4"}, {"pool_kernel", "3"}};
      Opts opts = {{"then", second}, {"first_compression_ratio", std::to_string(c)}};
      for (const auto& [key, value] : own) opts["then." + key] = value;
      auto composed = make_policy(config("keydiff", 9, shape, opts));
      composed->begin_sequence(n);
      EXPECT_EQ(composed->prefill_stats(n).last_queries, 4);
      EXPECT_EQ(composed->prefill_stats(n).last_w, 0);
      Stats s(rows, d, 0);
      s.st.num_heads = qh;
      s.st.last_queries = last_queries.data();
      s.st.n_queries = nq;
      s.st.block_end = n;
      KvCache got = cache_of(rows, d);
      prefill_layer(*composed, s.st, got);

      KvCache want = cache_of(rows, d);
      prefill_layer(
          *make_policy(config("keydiff", std::max(1, static_cast<int>(n * (1 - c))), shape)), s.st,
          want);
      const int w = 4, len = want.length(0, 0);
      std::vector<float> probs(static_cast<size_t>(qh) * w * len, 0.0f);
      for (int q = 0; q < qh; ++q) {
        const int h = q / (qh / kv);
        ASSERT_EQ(want.length(0, h), len);
        for (int i = 0; i < w; ++i) {
          const std::vector<float>& query = queries[(nq - w + i) * qh + q];
          const int32_t* pos = want.layer(0).position(h);
          int visible = 0;  // the survivors at or before the query's position n - w + i
          while (visible < len && pos[visible] <= n - w + i) ++visible;
          std::vector<double> e(visible);
          double top = -1e300, sum = 0;
          for (size_t j = 0; j < e.size(); ++j) {
            double dot = 0;
            for (int x = 0; x < d; ++x) dot += double(query[x]) * want.layer(0).key(h, j)[x];
            e[j] = dot / 2.0;  // sqrt(d) = 2
            top = std::max(top, e[j]);
          }
          for (double& x : e) sum += (x = std::exp(x - top));
          for (size_t j = 0; j < e.size(); ++j) {
            probs[(static_cast<size_t>(q) * w + i) * len + j] = static_cast<float>(e[j] / sum);
          }
        }
      }
      LayerStats window = s.st;
      window.last_probs = probs.data();
      window.last_w = w;
      window.stride = len;
      prefill_layer(*make_policy(config(second, 9, shape, own)), window, want);
      for (int h = 0; h < kv; ++h) {
        EXPECT_EQ(positions(got, 0, h), positions(want, 0, h)) << "head " << h;
        EXPECT_LT(got.length(0, h), len);
      }
    }
  }
}

// The laws of a composition: first_compression_ratio 0 leaves the second policy alone; a
// kv_budget the first policy's survivors fit in leaves the first policy alone; a clone decides
// as its original.
TEST(ComposedPolicy, ReducesToEitherPolicyAlone) {
  const int heads = 2, d = 4, n = 23;
  const auto rows = random_rows(heads, n, d, 9);
  const ModelShape shape{1, heads, heads, d, 64};
  Stats s(rows, d, 0);
  auto keep = [&](Policy& p) {
    p.begin_sequence(n);
    KvCache cache = cache_of(rows, d);
    prefill_layer(p, s.st, cache);
    return std::vector<V>{positions(cache, 0, 0), positions(cache, 0, 1)};
  };
  auto composed = [&](const std::string& ratio, int budget) {
    return make_policy(
        config("knorm", budget, shape, {{"then", "cur"}, {"first_compression_ratio", ratio}}));
  };
  EXPECT_EQ(keep(*composed("0", 7)), keep(*make_policy(config("cur", 7, shape))));
  // int(23 x 0.5) = 11 survivors; a kv_budget of 11 or more keeps them all.
  EXPECT_EQ(keep(*composed("0.5", 11)), keep(*make_policy(config("knorm", 11, shape))));
  EXPECT_EQ(keep(*composed("0.5", 20)), keep(*make_policy(config("knorm", 11, shape))));
  EXPECT_NE(keep(*composed("0.5", 5)), keep(*make_policy(config("knorm", 5, shape))));
  EXPECT_NE(keep(*composed("0.5", 5)), keep(*make_policy(config("cur", 5, shape))));
  // A clone before the prompt decides as its original; so does the same unit twice.
  auto original = composed("0.5", 5);
  auto copy = original->clone();
  EXPECT_EQ(keep(*copy), keep(*original));
  EXPECT_EQ(keep(*composed("0.5", 5)), keep(*original));
  // The first policy's budget follows the prompt: a 23-token prompt at 0.5 keeps 11, then a
  // 12-token one keeps 6 (its first 12 rows), and the second policy keeps 5 of those.
  auto twice = composed("0.5", 5);
  keep(*twice);
  const std::vector<std::vector<std::vector<float>>> short_rows = {
      {rows[0].begin(), rows[0].begin() + 12}, {rows[1].begin(), rows[1].begin() + 12}};
  Stats short_stats(short_rows, d, 0);
  twice->begin_sequence(12);
  KvCache got = cache_of(short_rows, d);
  prefill_layer(*twice, short_stats.st, got);
  auto first = make_policy(config("knorm", 6, shape));
  auto second = make_policy(config("cur", 5, shape));
  KvCache want = cache_of(short_rows, d);
  prefill_layer(*first, short_stats.st, want);
  prefill_layer(*second, short_stats.st, want);
  for (int h = 0; h < heads; ++h) EXPECT_EQ(positions(got, 0, h), positions(want, 0, h));
}

// What a composition refuses, each with an error naming the fix.
TEST(ComposedPolicy, RefusesWhatCannotCompose) {
  const ModelShape shape{2, 4, 2, 8, 64};
  auto fails = [&](const std::string& name, Opts opts, const std::string& says) {
    SCOPED_TRACE(name);
    try {
      make_policy(config(name, 8, shape, opts));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  // The second policy must decide from the cache alone, and not at decode.
  fails("snapkv", {{"then", "expected_attention"}, {"first_compression_ratio", "0.5"}},
        "from the cache's rows alone (keydiff, cur, lagkv, qfilter");
  fails("snapkv", {{"then", "tova"}, {"first_compression_ratio", "0.5"}}, "or from its window");
  fails("snapkv",
        {{"then", "keydiff"}, {"first_compression_ratio", "0.5"}, {"then.decode_interval", "4"}},
        "without decode_interval");
  fails("snapkv", {{"then", "full"}, {"first_compression_ratio", "0.5"}}, "keeps every token");
  // The first policy must decide the prompt only, in one block, with its own attention.
  fails("h2o", {{"then", "keydiff"}, {"first_compression_ratio", "0.5"}}, "evicts during decode");
  fails("tova", {{"then", "keydiff"}, {"first_compression_ratio", "0.5"}}, "evicts during decode");
  fails("full", {{"then", "keydiff"}, {"first_compression_ratio", "0.5"}}, "keeps every token");
  fails("kvzip", {{"then", "keydiff"}, {"first_compression_ratio", "0.5"}},
        "decides after passes of its own");
  // The ratio is required, within [0, 1), and only with then.
  fails("snapkv", {{"then", "keydiff"}}, "needs first_compression_ratio");
  fails("snapkv", {{"then", "keydiff"}, {"first_compression_ratio", "1"}}, "[0, 1)");
  fails("snapkv", {{"first_compression_ratio", "0.5"}}, "give then: POLICY too");
  fails("snapkv", {{"then.lag", "4"}}, "give then: POLICY too");
  // Options are checked where they belong: the second policy's through then.<option>.
  fails("snapkv", {{"then", "lagkv"}, {"first_compression_ratio", "0.5"}, {"then.lagg", "4"}},
        "lagg");
  fails("snapkv", {{"then", "nope"}, {"first_compression_ratio", "0.5"}}, "unknown policy 'nope'");
  fails("snapkv", {{"then", "lagkv"}, {"first_compression_ratio", "0.5"}, {"lag", "4"}}, "lag");
  // Accepted: think and positions apply to the composition's decision.
  EXPECT_NO_THROW(make_policy(config("snapkv", 8, shape,
                                     {{"then", "lagkv"},
                                      {"first_compression_ratio", "0.5"},
                                      {"think", "0.25"},
                                      {"then.lag", "4"}})));
}

}  // namespace
}  // namespace kvb::policies
