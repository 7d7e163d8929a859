// kvpress's scorers as kvbench policies (POLICIES.md "kvpress's presses"): the vocabulary ops
// they are made of (divide_by_query_counts, cosine_to_mean) and each policy's keep-set on
// hand-computed cases, plus cosine_to_mean against a plain float64 computation written
// independently (numpy's order: normalise, mean, then the cosine of unit vectors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"
#include "policy_test_util.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

using kernels::KvCache;
using V = std::vector<int32_t>;

using testing_policy::config;
using testing_policy::positions;

// A one-layer cache whose head h holds rows[h] as keys (values: the keys negated), at positions
// 0, 1, ...
KvCache cache_of(const std::vector<std::vector<std::vector<float>>>& rows, int dim) {
  int cap = 1;
  for (const auto& r : rows) cap = std::max(cap, static_cast<int>(r.size()));
  KvCache cache({1, static_cast<int>(rows.size()), dim}, cap);
  for (size_t h = 0; h < rows.size(); ++h) {
    for (size_t j = 0; j < rows[h].size(); ++j) {
      std::vector<float> v = rows[h][j];
      for (float& x : v) x = -x;
      cache.append(0, static_cast<int>(h), rows[h][j].data(), v.data(), static_cast<int32_t>(j));
    }
  }
  return cache;
}

TEST(KvpressOps, DivideByQueryCountsDividesByHowManyQueriesSawEachSlot) {
  kvb::kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 2);
  ops.resize(*r, 0, V{4, 3});
  const std::vector<float> src = {3, 6, 4, 5, 3, 4, 5, 0};  // heads 4 apart
  ops.accumulate(*r, 0, src.data(), 4, 4, 1, GqaReduce::kMean);
  // Head 0: one slot before a block of 3 queries (counts 3, 3, 2, 1); head 1: none (3, 2, 1).
  ops.divide_by_query_counts(*r, 0, V{1, 0}, 3);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{1, 2, 2, 5}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{1, 2, 5}));
  // A row longer than the earlier slots and the block is refused (a slot no query saw).
  EXPECT_THROW(ops.divide_by_query_counts(*r, 0, V{0, 0}, 3), Error);
  EXPECT_THROW(ops.divide_by_query_counts(*r, 0, V{1, 0}, 0), Error);
}

TEST(KvpressOps, CosineToMeanOfHandPickedKeysAndValues) {
  kvb::kernels::ops::CpuPolicyOps ops;
  // Head 0: unit directions (1,0), (0,1), (0,-1), and a zero key: the anchor is (1/4, 0), so the
  // cosines are 1, 0, 0 and 0 (a zero row has cosine 0, not NaN). Head 1: (1,1), (2,2),
  // (-1,-1): anchor (s/3, s/3) with s = 1/sqrt(2), cosines 1, 1, -1.
  KvCache cache = cache_of({{{2, 0}, {0, 3}, {0, -5}, {0, 0}}, {{1, 1}, {2, 2}, {-1, -1}}}, 2);
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 2, 2);
  ops.cosine_to_mean(*r, 1, cache, 0, CacheRows::kKeys);
  EXPECT_EQ(ops.read_f32(*r, 1, 0), (std::vector<float>{1, 0, 0, 0}));
  const std::vector<float> h1 = ops.read_f32(*r, 1, 1);
  ASSERT_EQ(h1.size(), 3u);
  EXPECT_NEAR(h1[0], 1, 1e-7);
  EXPECT_NEAR(h1[1], 1, 1e-7);
  EXPECT_NEAR(h1[2], -1, 1e-7);
  // The values (the keys negated) have the same cosines to their own mean.
  ops.cosine_to_mean(*r, 0, cache, 0, CacheRows::kValues);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{1, 0, 0, 0}));
  // More rows than the cache has heads are refused.
  std::unique_ptr<SlotRows> wide = ops.make_rows(SlotType::kF32, 1, 3);
  EXPECT_THROW(ops.cosine_to_mean(*wide, 0, cache, 0, CacheRows::kKeys), Error);
}

// Random keys against a float64 computation in another order: unit vectors first, their mean,
// then the cosine of the unit vector with the normalised anchor.
TEST(KvpressOps, CosineToMeanAgreesWithAFloat64Reference) {
  kvb::kernels::ops::CpuPolicyOps ops;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int dim = 16, heads = 3;
  std::vector<std::vector<std::vector<float>>> rows(heads);
  for (int h = 0; h < heads; ++h) {
    rows[h].resize(20 + 7 * h, std::vector<float>(dim));
    for (auto& v : rows[h]) {
      for (float& x : v) x = g(rng) + (h == 1 ? 2.0f : 0.0f);  // head 1: a shared direction
    }
  }
  KvCache cache = cache_of(rows, dim);
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, heads);
  ops.cosine_to_mean(*r, 0, cache, 0, CacheRows::kKeys);
  for (int h = 0; h < heads; ++h) {
    const int n = static_cast<int>(rows[h].size());
    std::vector<std::vector<double>> unit(n, std::vector<double>(dim));
    std::vector<double> anchor(dim, 0.0);
    for (int j = 0; j < n; ++j) {
      double norm = 0;
      for (float x : rows[h][j]) norm += static_cast<double>(x) * x;
      norm = std::sqrt(norm);
      for (int i = 0; i < dim; ++i) {
        unit[j][i] = rows[h][j][i] / norm;
        anchor[i] += unit[j][i] / n;
      }
    }
    double an = 0;
    for (double a : anchor) an += a * a;
    an = std::sqrt(an);
    const std::vector<float> got = ops.read_f32(*r, 0, h);
    ASSERT_EQ(static_cast<int>(got.size()), n);
    for (int j = 0; j < n; ++j) {
      double c = 0;
      for (int i = 0; i < dim; ++i) c += unit[j][i] * anchor[i] / an;
      EXPECT_NEAR(got[j], c, 1e-6) << "head " << h << " slot " << j;
    }
  }
}

// cosine_to_mean with chunk N (kvpress ChunkPress's per-chunk statistics): each run of N slots
// scores exactly, bit for bit, as the op scores a cache holding that run alone (heads of 20, 27
// and 34 slots, runs of 8: the last run of each head shorter); chunk 0 and a chunk as long as
// the head are the whole head.
TEST(KvpressOps, CosineToMeanPerChunkIsTheChunkAlone) {
  kvb::kernels::ops::CpuPolicyOps ops;
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int dim = 8, heads = 3, chunk = 8;
  std::vector<std::vector<std::vector<float>>> rows(heads);
  for (int h = 0; h < heads; ++h) {
    rows[h].resize(20 + 7 * h, std::vector<float>(dim));
    for (auto& v : rows[h]) {
      for (float& x : v) x = g(rng) + 0.5f * h;
    }
  }
  KvCache cache = cache_of(rows, dim);
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 3, heads);
  ops.cosine_to_mean(*r, 0, cache, 0, CacheRows::kKeys, chunk);
  ops.cosine_to_mean(*r, 1, cache, 0, CacheRows::kKeys, 0);
  ops.cosine_to_mean(*r, 2, cache, 0, CacheRows::kKeys, 1000);
  for (int h = 0; h < heads; ++h) {
    const int n = static_cast<int>(rows[h].size());
    const std::vector<float> got = ops.read_f32(*r, 0, h);
    ASSERT_EQ(static_cast<int>(got.size()), n);
    for (int c0 = 0; c0 < n; c0 += chunk) {
      const std::vector<std::vector<float>> run(rows[h].begin() + c0,
                                                rows[h].begin() + std::min(n, c0 + chunk));
      KvCache alone = cache_of({run}, dim);
      std::unique_ptr<SlotRows> one = ops.make_rows(SlotType::kF32, 1, 1);
      ops.cosine_to_mean(*one, 0, alone, 0, CacheRows::kKeys);
      const std::vector<float> want = ops.read_f32(*one, 0, 0);
      for (size_t j = 0; j < want.size(); ++j) {
        EXPECT_EQ(got[c0 + j], want[j]) << "head " << h << " slot " << c0 + j;
      }
    }
    EXPECT_EQ(ops.read_f32(*r, 2, h), ops.read_f32(*r, 1, h)) << "head " << h;
  }
}

// KeyDiff: keys (1,0), (0,1), (0,1), (1,1): anchor ((1+s)/4, (2+s)/4), s = 1/sqrt(2); cosines
// 0.533, 0.846, 0.846, 0.975. Budget 2 keeps the least similar: slot 0, then one of the tied
// slots 1 and 2: the more recent (POLICIES.md "Ties").
TEST(KeyDiffPolicy, KeepsTheKeysLeastSimilarToTheMeanDirection) {
  const ModelShape shape{1, 2, 2, 2, 0};
  auto p = make_policy(config("keydiff", 2, shape));
  EXPECT_TRUE(p->decides_with_ops());
  // Head 1: the same keys reversed: slot 3 least similar, then the tie 1/2 keeps 2.
  KvCache cache = cache_of({{{1, 0}, {0, 1}, {0, 1}, {1, 1}}, {{1, 1}, {0, 1}, {0, 1}, {1, 0}}}, 2);
  LayerStats st;
  st.layer = 0;
  st.n_new = 4;
  st.num_heads = 2;
  prefill_layer(*p, st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 2}));
  EXPECT_EQ(positions(cache, 0, 1), (V{2, 3}));
  // A budget the heads fit in keeps everything.
  auto roomy = make_policy(config("keydiff", 4, shape));
  KvCache whole = cache_of({{{1, 0}, {0, 1}, {0, 1}, {1, 1}}, {{1, 1}}}, 2);
  prefill_layer(*roomy, st, whole);
  EXPECT_EQ(positions(whole, 0, 0), (V{0, 1, 2, 3}));
  // No decode eviction.
  LayerStats dec = st;
  dec.n_new = 1;
  decode_layer(*p, dec, cache);
  EXPECT_EQ(cache.length(0, 0), 2);
}

// ObservedAttention with 2 query heads per KV head and a 3-token prompt. Query head 0's rows:
// [1], [.5 .5], [.3 .3 .4] -> column sums [1.8 .8 .4] / [3 2 1] = [.6 .4 .4]; query head 1:
// [1], [.9 .1], [.3 .3 .4] -> [2.2 .4 .4] / [3 2 1] = [.733 .2 .4]. Means [.667 .3 .4]: budget
// 2 keeps slots 0 and 2 (unnormalised sums [2.0 .6 .4] would keep 0 and 1).
TEST(ObservedAttentionPolicy, KeepsTheHighestAverageAttentionPerQueryThatSawTheSlot) {
  const ModelShape shape{1, 2, 1, 2, 0};
  auto p = make_policy(config("observed_attention", 2, shape));
  EXPECT_TRUE(p->prefill_request(3).col_sums);
  EXPECT_FALSE(p->decode_request().col_sums);
  KvCache cache = cache_of({{{1, 0}, {0, 1}, {1, 1}}}, 2);
  const std::vector<float> col = {1.8f, 0.8f, 0.4f, 2.2f, 0.4f, 0.4f};  // [2 heads, stride 3]
  LayerStats st;
  st.layer = 0;
  st.n_new = 3;
  st.num_heads = 2;
  st.stride = 3;
  st.col_sums = col.data();
  prefill_layer(*p, st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 2}));
}

TEST(KvpressOps, CacheNormsNormalizeChunksCombineAndFillPrefix) {
  kvb::kernels::ops::CpuPolicyOps ops;
  // Head 0 keys: squared norms 25, 9, 1, 4, 0; head 1: 2, 8.
  KvCache cache = cache_of({{{3, 4}, {0, 3}, {1, 0}, {0, -2}, {0, 0}}, {{1, 1}, {2, 2}}}, 2);
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 2, 2);
  ops.cache_norms(*r, 0, cache, 0, CacheRows::kKeys, /*squared=*/true);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{25, 9, 1, 4, 0}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{2, 8}));
  ops.cache_norms(*r, 1, cache, 0, CacheRows::kValues, /*squared=*/false);  // values: -keys
  EXPECT_EQ(ops.read_f32(*r, 1, 0), (std::vector<float>{5, 3, 1, 2, 0}));
  // Chunks of 2: [25 9] / 34, [1 4] / 5, [0] stays (a zero sum); head 1: [2 8] / 10.
  ops.normalize_chunks(*r, 0, 2);
  EXPECT_EQ(ops.read_f32(*r, 0, 0),
            (std::vector<float>{static_cast<float>(25.0 / 34), static_cast<float>(9.0 / 34), 0.2f,
                                0.8f, 0}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{0.2f, 0.8f}));
  // Chunk 0: the whole row. Row 1 of head 0: 5 3 1 2 0 over 11.
  ops.normalize_chunks(*r, 1, 0);
  EXPECT_EQ(ops.read_f32(*r, 1, 0)[0], static_cast<float>(5.0 / 11));
  // Products and sums with another layer's rows of equal lengths.
  std::unique_ptr<SlotRows> a = ops.make_rows(SlotType::kF32, 2, 1);
  ops.resize(*a, 0, V{3});
  ops.resize(*a, 1, V{3});
  const std::vector<float> x = {1, 2, 3}, y = {4, 5, 6};
  ops.accumulate(*a, 0, x.data(), 0, 3, 1, GqaReduce::kMean);
  ops.accumulate(*a, 1, y.data(), 0, 3, 1, GqaReduce::kMean);
  ops.combine(*a, 0, *a, 1, Combine::kMul);
  EXPECT_EQ(ops.read_f32(*a, 0, 0), (std::vector<float>{4, 10, 18}));
  ops.combine(*a, 0, *a, 1, Combine::kAdd);
  EXPECT_EQ(ops.read_f32(*a, 0, 0), (std::vector<float>{8, 15, 24}));
  EXPECT_THROW(ops.combine(*a, 0, *a, 0, Combine::kAdd), Error);  // a row with itself
  ops.resize(*a, 1, V{2});
  EXPECT_THROW(ops.combine(*a, 0, *a, 1, Combine::kMul), Error);  // lengths differ
  // The first entries of every row, at most its length.
  ops.fill_prefix(*r, 0, 3, 1.0f);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{1, 1, 1, 0.8f, 0}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{1, 1}));
}

// CUR with sinks 1 and windows of 2, one head of five slots. Keys' squared norms 4, 1, 9, 16, 1
// and values' (the keys negated) the same. Windows: [4 1] / 5 = .8 .2, [9 16] / 25 = .36 .64,
// [1] / 1 = 1. kv_product: .64 .04 .1296 .4096 1; the sink (slot 0) becomes 1.0 after the
// normalisation over the head (which keeps the order). Budget 3 keeps the sink, slot 4 (1 /
// sum) and slot 3; kv_avg (= k2 here) keeps the sink, 4 and 3 as well, key-only with
// local_window 0 ranks 16 > 9 > 4: the sink, 3 and 2.
TEST(CurPolicy, KeepsTheSinksAndTheHighestLeverage) {
  const ModelShape shape{1, 1, 1, 1, 0};
  const std::vector<std::vector<std::vector<float>>> keys = {{{2}, {1}, {3}, {4}, {1}}};
  LayerStats st;
  st.layer = 0;
  st.n_new = 5;
  st.num_heads = 1;
  for (const char* lev : {"kv_product", "kv_avg"}) {
    SCOPED_TRACE(lev);
    auto p = make_policy(
        config("cur", 3, shape, {{"sinks", "1"}, {"local_window", "2"}, {"leverage", lev}}));
    KvCache cache = cache_of(keys, 1);
    prefill_layer(*p, st, cache);
    EXPECT_EQ(positions(cache, 0, 0), (V{0, 3, 4}));
  }
  auto k = make_policy(
      config("cur", 3, shape, {{"sinks", "1"}, {"local_window", "0"}, {"leverage", "key"}}));
  KvCache cache = cache_of(keys, 1);
  prefill_layer(*k, st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{0, 2, 3}));
  // Defaults: 4 sinks, windows of 16, kv_product.
  EXPECT_THROW(make_policy(config("cur", 3, shape, {{"leverage", "random"}})), Error);
}

// LagKV with 1 sink and partitions of 2 over 7 slots of dim 2 (values: the keys negated, whose
// normalised rows are 1 - z: the same deviations). Partition 0 (slots 1, 2) against slots 3, 4
// (range (2, 4)): z = (.5, .25), sd .177; z = (1, 0), sd .707: ranks 0 and 1 -> 0, .5.
// Partition 1 (slots 3, 4) against 5, 6 (range (4, 4)): z = (0, 0), sd 0; (.5, 1), sd .354:
// 0, .5. The sink and the last partition score 1.
TEST(LagKvPolicy, RanksEachPartitionAgainstTheNext) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const std::vector<std::vector<std::vector<float>>> keys = {
      {{9, 9}, {1, 1}, {2, 0}, {0, 0}, {2, 4}, {0, 0}, {4, 4}}};
  KvCache cache = cache_of(keys, 2);
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 1);
  ops.lag_scores(*r, 0, cache, 0, 1, 2);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{1, 0, 0.5f, 0, 0.5f, 1, 1}));
  // Shorter than sinks + 2 lag: the sinks score 1, the rest rises with recency.
  KvCache short_cache = cache_of({{{1, 0}, {0, 1}, {1, 1}, {2, 2}}}, 2);
  ops.lag_scores(*r, 0, short_cache, 0, 1, 2);
  EXPECT_EQ(ops.read_f32(*r, 0, 0),
            (std::vector<float>{1, 0, static_cast<float>(1.0 / 3), static_cast<float>(2.0 / 3)}));
  // The policy: budget 5 keeps the sink, both rank-1 tokens and the last partition; budget 4
  // breaks the tie between slots 2 and 4 (equal ranks) towards the more recent.
  const ModelShape shape{1, 1, 1, 2, 0};
  LayerStats st;
  st.layer = 0;
  st.n_new = 7;
  st.num_heads = 1;
  for (const auto& [budget, want] : {std::pair{5, V{0, 2, 4, 5, 6}}, std::pair{4, V{0, 4, 5, 6}}}) {
    auto p = make_policy(config("lagkv", budget, shape, {{"sinks", "1"}, {"lag", "2"}}));
    KvCache c = cache_of(keys, 2);
    prefill_layer(*p, st, c);
    EXPECT_EQ(positions(c, 0, 0), want) << "budget " << budget;
  }
}

// fill_top: row (3, 1, 3, 2): the top 2 are both 3s; the top 3 adds the 2; k past the row fills
// it; k 0 changes nothing; per head; by another row's order.
TEST(KvpressOps, FillTopRaisesEachRowsTopEntries) {
  kvb::kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 2, 2);
  const std::vector<float> src = {3, 1, 3, 2, 0, 5, 4, 0};
  ops.resize_and_accumulate(*r, 0, std::vector<int32_t>{4, 4}, src.data(), 4, 4, 1,
                            GqaReduce::kMean);
  auto fill = [&](std::vector<int32_t> k, float value) {
    ops.fill_top(*r, 0, k, value, nullptr, 0);
  };
  fill({0, 0}, 9);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{3, 1, 3, 2}));
  fill({2, 2}, 9);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{9, 1, 9, 2}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{0, 9, 9, 0}));
  fill({3, 0}, 8);  // the 9s stay on top: 8 goes to the two 9s and the 2; head 1 untouched
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{8, 1, 8, 8}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{0, 9, 9, 0}));
  fill({0, 10}, 7);
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{7, 7, 7, 7}));
  // By layer 1's rows (zeros at first: ties keep the higher index).
  ops.resize(*r, 1, std::vector<int32_t>{4, 4});
  ops.fill_top(*r, 1, std::vector<int32_t>{1, 2}, 5, r.get(), 0);
  EXPECT_EQ(ops.read_f32(*r, 1, 0), (std::vector<float>{0, 0, 0, 5}));
  EXPECT_EQ(ops.read_f32(*r, 1, 1), (std::vector<float>{0, 0, 5, 5}));
  ops.fill_top(*r, 0, std::vector<int32_t>{1, 0}, 6, r.get(), 1);  // layer 1's top of head 0: 3
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{8, 1, 8, 6}));
}

// projected_value_norms: one cache head of values (1, 2) and (-1, 1) read by two query heads,
// W = [[1, 0, 2, -1], [0, 1, 1, 1]] (dim 2, 2 heads x d 2). Query head 0 (columns 0, 1): z = (1,
// 2) and (-1, 1): L1 3 and 2. Query head 1 (columns 2, 3): z = (0, 3) and (-3, 0): 3 and 3.
TEST(KvpressOps, ProjectedValueNormsThroughTheOutputProjection) {
  kvb::kernels::ops::CpuPolicyOps ops;
  KvCache cache = cache_of({{{-1, -2}, {1, -1}}}, 2);  // values: the keys negated
  const std::vector<float> w = {1, 0, 2, -1, 0, 1, 1, 1};
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 2);
  ops.projected_value_norms(*r, 0, cache, 0, w.data(), false, 2, 2);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{3, 2}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{3, 3}));
  EXPECT_THROW(ops.projected_value_norms(*r, 0, cache, 0, w.data(), true, 2, 2), Error);
  EXPECT_THROW(ops.projected_value_norms(*r, 0, cache, 0, nullptr, false, 2, 2), Error);
}

// The wrappers (scorer.h ScorerWrappers) over score rows head 0 (5, 6, 7, 8) and head 1 (1, 2, 3,
// 4), budget 2 (the layer keeps 4): without ada each head its top 2; with alpha 0.5 each head's
// top 1 is safeguarded and the other 2 go to the best left, head 0's 7 and 6 (3 and 1 kept);
// alpha 1 safeguards 2 each (as without ada); alpha 0 still safeguards one per head.
TEST(ScorerWrappers, AdaAllocatesTheLayersBudgetAcrossHeadsAboveASafeguard) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const std::vector<float> src = {5, 6, 7, 8, 1, 2, 3, 4};
  auto run = [&](std::map<std::string, std::string> opts) {
    KvCache cache = cache_of({{{1}, {1}, {1}, {1}}, {{1}, {1}, {1}, {1}}}, 1);
    std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 2);
    ops.resize_and_accumulate(*r, 0, std::vector<int32_t>{4, 4}, src.data(), 4, 4, 1,
                              GqaReduce::kMean);
    ScorerWrappers wrap{config("keydiff", 2, {1, 2, 2, 1, 0}, std::move(opts))};
    LayerStats st;
    st.num_heads = 2;
    kernels::EvictionPlan plan;
    plan.reset(0, 2);
    wrap.keep(ops, *r, 0, st, cache, 2, plan);
    cache.apply(plan);
    return std::pair{positions(cache, 0, 0), positions(cache, 0, 1)};
  };
  EXPECT_EQ(run({}), (std::pair{V{2, 3}, V{2, 3}}));
  EXPECT_EQ(run({{"ada", "true"}, {"alpha_safeguard", "0.5"}}), (std::pair{V{1, 2, 3}, V{3}}));
  EXPECT_EQ(run({{"ada", "true"}, {"alpha_safeguard", "1"}}), (std::pair{V{2, 3}, V{2, 3}}));
  EXPECT_EQ(run({{"ada", "true"}, {"alpha_safeguard", "0"}}), (std::pair{V{1, 2, 3}, V{3}}));
  // Default alpha 0.2 of budget 2 rounds to 0 safeguarded; one per head still stays.
  EXPECT_EQ(run({{"ada", "true"}}), (std::pair{V{1, 2, 3}, V{3}}));
}

// CriticalKV over scores (4, 3, 2, 1) with values (-1, -5, -2, -10) and W = [[1]] (projected
// norms 1, 5, 2, 10), budget 3: the product (S + 1e-4) x P = (4.0001, 15.0005, 4.0002, 10.001)
// after the score's top int(3 x .5) = 1 (slot 0) keeps 0, 1, 3; with first_stage_ratio 0 the
// product alone keeps 1, 2 (4.0002 > 4.0001) and 3; without critical the score keeps 0, 1, 2.
TEST(ScorerWrappers, CriticalWeighsTheScoreByTheProjectedValueNorms) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const std::vector<float> src = {4, 3, 2, 1};
  const std::vector<float> w = {1};
  auto run = [&](std::map<std::string, std::string> opts) {
    KvCache cache = cache_of({{{1}, {5}, {2}, {10}}}, 1);
    std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 1);
    ops.resize_and_accumulate(*r, 0, std::vector<int32_t>{4}, src.data(), 4, 4, 1,
                              GqaReduce::kMean);
    const bool critical = opts.count("critical") > 0;
    ScorerWrappers wrap{config("keydiff", 3, {1, 1, 1, 1, 0}, std::move(opts))};
    EXPECT_EQ(wrap.request({}).output_projection, critical);
    LayerStats st;
    st.num_heads = 1;
    st.wo = w.data();
    st.wo_dim = 1;
    kernels::EvictionPlan plan;
    plan.reset(0, 1);
    wrap.keep(ops, *r, 0, st, cache, 3, plan);
    cache.apply(plan);
    return positions(cache, 0, 0);
  };
  EXPECT_EQ(run({}), (V{0, 1, 2}));
  EXPECT_EQ(run({{"critical", "true"}}), (V{0, 1, 3}));
  EXPECT_EQ(run({{"critical", "true"}, {"first_stage_ratio", "0"}}), (V{1, 2, 3}));
}

// SimLayerKV, one KV head read by two query heads, 8 slots, the last query's attention: head 0
// (.5 0 0 0 .1 .1 .1 .2), head 1 (.1 .1 .1 .1 .1 .1 .2 .2), mean (.3 .05 .05 .05 .1 .1 .15 .2).
// n_initial 1, n_recent 3, n_last 1: the first token (.3) and the 3 before the last (.1 .1 .15)
// share .65: lazy at threshold .6 (keeps slot 0 and the last n_recent - n_last = 2), not at .7.
// kv_budget 4 alone sets n_recent 4 (a lazy layer keeps 4): .3 + .4 = .7 > .65 keeps 0, 5, 6, 7.
TEST(SimLayerKvPolicy, LazyLayersKeepTheFirstAndRecentTokens) {
  const ModelShape shape{1, 2, 1, 1, 0};
  const std::vector<float> probs = {.5f, 0,   0,   0,   .1f, .1f, .1f, .2f,
                                    .1f, .1f, .1f, .1f, .1f, .1f, .2f, .2f};
  LayerStats st;
  st.layer = 0;
  st.n_new = 8;
  st.num_heads = 2;
  st.stride = 8;
  st.last_probs = probs.data();
  st.last_w = 1;
  auto run = [&](int budget, std::map<std::string, std::string> opts) {
    KvCache cache = cache_of({{{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}}}, 1);
    auto p = make_policy(config("simlayerkv", budget, shape, std::move(opts)));
    EXPECT_EQ(p->prefill_request(8).last_w, 1);
    prefill_layer(*p, st, cache);
    return positions(cache, 0, 0);
  };
  const std::map<std::string, std::string> base = {{"n_initial", "1"}, {"n_recent", "3"}};
  auto with = [&](const char* t) {
    auto o = base;
    o["lazy_threshold"] = t;
    return o;
  };
  EXPECT_EQ(run(100, with("0.6")), (V{0, 6, 7}));
  EXPECT_EQ(run(100, with("0.7")), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(run(4, {{"n_initial", "1"}, {"lazy_threshold", "0.65"}}), (V{0, 5, 6, 7}));
  // kvpress's default threshold 1 never compresses; a prompt of at most n_initial + n_recent +
  // n_last tokens neither.
  EXPECT_EQ(run(4, {{"n_initial", "1"}}), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(run(100, {{"n_initial", "1"}, {"n_recent", "6"}, {"lazy_threshold", "0"}}),
            (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_THROW(make_policy(config("simlayerkv", 4, shape, {{"n_recent", "1"}})), Error);
}

// layer_ratios (kvpress PerLayerCompressionPress): layer l keeps int(n x (1 - r_l)) of its n slots
// (n: its longest head), r 0 all of them, at least one; one ratio per layer, each in [0, 1).
TEST(ScorerWrappers, LayerRatiosSetEachLayersBudget) {
  const ModelShape shape{3, 2, 2, 1, 0};
  ScorerWrappers wrap{config("keydiff", 5, shape, {{"layer_ratios", "0.25,0,0.999"}})};
  KvCache cache({3, 2, 1}, 10);
  const float x = 1;
  for (int l = 0; l < 3; ++l) {
    for (int j = 0; j < 10; ++j) {
      cache.append(l, 0, &x, &x, j);
      if (j < 7) cache.append(l, 1, &x, &x, j);
    }
  }
  EXPECT_EQ(wrap.budget(0, cache, 5), 7);   // int(10 x .75)
  EXPECT_EQ(wrap.budget(1, cache, 5), 10);  // ratio 0: everything
  EXPECT_EQ(wrap.budget(2, cache, 5), 1);   // int(10 x .001) = 0, at least one
  EXPECT_EQ(ScorerWrappers(config("keydiff", 5, shape)).budget(0, cache, 5), 5);
  for (const char* bad : {"0.1,0.2", "0.1,0.2,0.3,0.4", "0.1,x,0.2", "0.1,1,0.2", "0.1,-0.5,0",
                          "0.1,nan,0", "0.1,,0.2"}) {
    EXPECT_THROW(make_policy(config("keydiff", 5, shape, {{"layer_ratios", bad}})), Error) << bad;
  }
  // A keydiff prefill under it: layer 0 keeps 7 per head, layer 1 all 10.
  auto p = make_policy(config("keydiff", 5, {3, 1, 1, 2, 0}, {{"layer_ratios", "0.25,0,0.5"}}));
  KvCache c({3, 1, 2}, 10);
  for (int l = 0; l < 3; ++l) {
    for (int j = 0; j < 10; ++j) {
      const float k[2] = {static_cast<float>(j), 1.0f};
      c.append(l, 0, k, k, j);
    }
  }
  LayerStats st;
  st.n_new = 10;
  st.num_heads = 1;
  for (int l = 0; l < 3; ++l) {
    st.layer = l;
    prefill_layer(*p, st, c);
  }
  EXPECT_EQ(c.length(0, 0), 7);
  EXPECT_EQ(c.length(1, 0), 10);
  EXPECT_EQ(c.length(2, 0), 5);
}

// decode_interval (kvpress DecodingPress after the prompt's compression): cur scoring keys alone
// (k^2 over the head's sum: the larger |k|, the higher), budget 3, every 2 decode steps. Keys 1 2
// 3 4: the prompt keeps 2 3 4 (positions 1 2 3). Step 1 appends 10: no compression (4 slots).
// Step 2 appends .5: 5 slots back to 3, keys 3 4 10 (positions 2 3 4). Step 3 appends 5: 4 slots.
// Step 4 appends 6: keys 4 10 5 6 .5... back to 3: 10 6 5 (positions 4 6 7).
TEST(ScorerWrappers, DecodeIntervalCompressesBackToTheBudget) {
  const ModelShape shape{1, 1, 1, 1, 0};
  auto p = make_policy(config(
      "cur", 3, shape,
      {{"sinks", "0"}, {"local_window", "0"}, {"leverage", "key"}, {"decode_interval", "2"}}));
  KvCache cache = cache_of({{{1}, {2}, {3}, {4}}}, 1);
  LayerStats st;
  st.layer = 0;
  st.n_new = 4;
  st.num_heads = 1;
  prefill_layer(*p, st, cache);
  EXPECT_EQ(positions(cache, 0, 0), (V{1, 2, 3}));
  st.n_new = 1;
  const float steps[] = {10, 0.5f, 5, 6};
  const std::vector<V> want = {{1, 2, 3, 4}, {2, 3, 4}, {2, 3, 4, 6}, {4, 6, 7}};
  for (int s = 0; s < 4; ++s) {
    const float v = -steps[s];
    cache.reserve_extra(1);
    cache.append(0, 0, &steps[s], &v, 4 + s);
    decode_layer(*p, st, cache);
    EXPECT_EQ(positions(cache, 0, 0), want[s]) << "step " << s + 1;
  }
  // Off by default; refused where the score needs the prompt's statistics.
  EXPECT_THROW(make_policy(config("expected_attention", 3, shape, {{"decode_interval", "2"}})),
               Error);
  EXPECT_THROW(make_policy(config("observed_attention", 3, shape, {{"decode_interval", "2"}})),
               Error);
  EXPECT_FALSE(make_policy(config("keydiff", 3, shape))->decode_request().output_projection);
  EXPECT_TRUE(
      make_policy(config("keydiff", 3, shape, {{"decode_interval", "2"}, {"critical", "true"}}))
          ->decode_request()
          .output_projection);
}

// The wrappers' keep-sets over two heads of 10 slots with score rows head 0 (1 1 1 5 5 5 2 2 2 9)
// and head 1 (0 0 0 1 1 1 4 4 4 0), or `src` ([2, 10]): ScorerWrappers::keep at `budget`.
std::pair<V, V> keep_two_heads(int budget, std::map<std::string, std::string> opts,
                               std::vector<float> src = {1, 1, 1, 5, 5, 5, 2, 2, 2, 9,
                                                         0, 0, 0, 1, 1, 1, 4, 4, 4, 0},
                               double fraction = 0) {
  kvb::kernels::ops::CpuPolicyOps ops;
  std::vector<std::vector<float>> keys(10, std::vector<float>{1});
  KvCache cache = cache_of({keys, keys}, 1);
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 2);
  ops.resize_and_accumulate(*r, 0, std::vector<int32_t>{10, 10}, src.data(), 10, 10, 1,
                            GqaReduce::kMean);
  PolicyConfig pc = config("keydiff", budget, {1, 2, 2, 1, 0}, std::move(opts));
  pc.budget_fraction = fraction;
  ScorerWrappers wrap{pc, /*rescores=*/true, /*chunks=*/true};
  LayerStats st;
  st.num_heads = 2;
  kernels::EvictionPlan plan;
  plan.reset(0, 2);
  if (wrap.acts(cache, 0, budget)) wrap.keep(ops, *r, 0, st, cache, budget, plan);
  cache.apply(plan);
  return {positions(cache, 0, 0), positions(cache, 0, 1)};
}

// chunk (kvpress ChunkPress) over the two heads' score rows, runs of 4 (4, 4 and 2 slots): at
// budget 5 of 10 (fraction 0.5) each run keeps max(1, int(len x 0.5)): 2, 2 and 1. Head 0 (1 1 1
// 5 | 5 5 2 2 | 2 9) keeps 2 and 3 (the tie at 1: the later), 4 and 5, 9; head 1 (0 0 0 1 | 1 1 4
// 4 | 4 0) keeps 2 and 3, 6 and 7, 8. With kvpress's compression ratio 0.75 (fraction 0.25): 1,
// 1 and max(1, 0) = 1 per run.
TEST(ScorerWrappers, ChunkKeepsEachRunsOwnBest) {
  EXPECT_EQ(keep_two_heads(5, {{"chunk", "4"}}), (std::pair{V{2, 3, 4, 5, 9}, V{2, 3, 6, 7, 8}}));
  // The budget's own fraction (PolicyConfig::budget_fraction) decides where it is given.
  EXPECT_EQ(keep_two_heads(2, {{"chunk", "4"}},
                           {1, 1, 1, 5, 5, 5, 2, 2, 2, 9, 0, 0, 0, 1, 1, 1, 4, 4, 4, 0}, 0.25),
            (std::pair{V{3, 5, 9}, V{3, 7, 8}}));
  const ModelShape shape{1, 2, 2, 1, 0};
  // observed_attention refuses it (kvpress's ChunkPress takes no attention weights, which
  // ObservedAttentionPress needs); cur and lagkv score each run as a cache of its rows
  // (ChunkOfACacheScorerKeepsWhatEachRunAloneKeeps), expected_attention as a prompt of its own
  // tokens (issue 33: kvpress's ChunkPress over ExpectedAttentionPress, stop 48).
  EXPECT_THROW(make_policy(config("observed_attention", 4, shape, {{"chunk", "4"}})), Error);
  for (const char* name : {"cur", "lagkv", "expected_attention"}) {
    EXPECT_NO_THROW(make_policy(config(name, 4, shape, {{"chunk", "4"}}))) << name;
  }
  EXPECT_THROW(make_policy(config("keydiff", 4, shape, {{"chunk", "4"}, {"ada", "true"}})), Error);
  EXPECT_THROW(make_policy(config("keydiff", 4, shape, {{"chunk", "4"}, {"chunkkv", "4"}})), Error);
  EXPECT_NO_THROW(make_policy(config("keydiff", 4, shape, {{"chunk", "4"}})));
}

// heads x n rows of d normal floats (mean `mean`, deviation 1) from seed `seed`.
std::vector<std::vector<std::vector<float>>> random_rows(int heads, int n, int d, unsigned seed,
                                                         float mean) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(mean, 1.0f);
  std::vector<std::vector<std::vector<float>>> rows(heads, std::vector<std::vector<float>>(n));
  for (auto& head : rows) {
    for (auto& k : head) {
      k.resize(d);
      for (float& x : k) x = g(rng);
    }
  }
  return rows;
}

// chunkkv (kvpress ChunkKVPress): the heads' sums 1 1 1 6 6 6 6 6 6 9. Chunks of 3: means 1, 6, 6
// and 9 (the remainder, slot 9), ranked 9, then the later 6 (slots 6-8), then slots 3-5, then
// 0-2. At most floor((budget + 1) x 4 chunks / 10 slots) chunks (kvpress's count): budgets 9
// and 7 take 3 chunks (7 tokens), budget 6 two (floor(2.8)), budget 3 one (floor(1.6)).
// Budget 2 is below the chunk: chunks of 2 (means 1, 3.5, 6, 6, 7.5), one of them. Sums 5 5 5 4
// 4 4 3 3 3 0 at budget 8 (kvpress: int(4 x 0.8) = 3 chunks, 9 tokens) keep two: a third would
// pass the budget. A prompt shorter than one chunk falls back to each head's own top (head 1's
// tie at 1 keeps slot 5).
// kvpress's BlockPress over KeyDiff in float64: each head starts from its first `budget` slots;
// each next block of `block` slots joins them (kept slots in their ranking's order, then the
// block), every row of that union is scored minus its cosine with the union's mean unit key, and
// the best `budget` stay (equal scores: the later slot). Two heads of 23 random keys (d 4) at
// budgets 5 and 9 and blocks of 4 and 7: the policy keeps what the reference keeps; a budget of
// the whole prompt keeps everything.
TEST(ScorerWrappers, BlockScoresEachBlockWithTheKeptSlots) {
  const int heads = 2, d = 4, n = 23;
  const auto rows = random_rows(heads, n, d, 13, 0.3f);
  const ModelShape shape{1, heads, heads, d, 0};
  for (int budget : {5, 9, n}) {
    for (int block : {4, 7}) {
      SCOPED_TRACE(std::to_string(budget) + " " + std::to_string(block));
      KvCache cache = cache_of(rows, d);
      LayerStats st;
      st.n_new = n;
      st.num_heads = heads;
      prefill_layer(*make_policy(config("keydiff", budget, shape,
                                        {{"block", std::to_string(block)}})),
                    st, cache);
      for (int h = 0; h < heads; ++h) {
        std::vector<int> kept(std::min(budget, n));
        std::iota(kept.begin(), kept.end(), 0);
        for (int i = budget; i < n; i += block) {
          std::vector<int> cur = kept;
          for (int s = i; s < std::min(n, i + block); ++s) cur.push_back(s);
          std::vector<double> mean(d, 0.0);
          for (int s : cur) {
            double norm = 0;
            for (float x : rows[h][s]) norm += static_cast<double>(x) * x;
            for (int c = 0; c < d; ++c) mean[c] += rows[h][s][c] / std::sqrt(norm) / cur.size();
          }
          double mnorm = 0;
          for (double m : mean) mnorm += m * m;
          std::vector<double> score(cur.size());
          for (size_t r = 0; r < cur.size(); ++r) {
            double dot = 0, norm = 0;
            for (int c = 0; c < d; ++c) {
              dot += rows[h][cur[r]][c] * mean[c];
              norm += static_cast<double>(rows[h][cur[r]][c]) * rows[h][cur[r]][c];
            }
            score[r] = -dot / std::sqrt(norm) / std::sqrt(mnorm);
          }
          std::vector<int> order(cur.size());
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return score[a] != score[b] ? score[a] > score[b] : cur[a] > cur[b];
          });
          kept.resize(budget);
          for (int r = 0; r < budget; ++r) kept[r] = cur[order[r]];
        }
        std::sort(kept.begin(), kept.end());
        const V got = positions(cache, 0, h);
        EXPECT_EQ(std::vector<int>(got.begin(), got.end()), kept) << "head " << h;
      }
    }
  }
  // block reads the cache alone: refused where the score reads the prompt, and beside the
  // wrappers that replace the per-head choice.
  EXPECT_THROW(make_policy(config("expected_attention", 3, shape, {{"block", "4"}})), Error);
  EXPECT_THROW(make_policy(config("keydiff", 3, shape, {{"block", "4"}, {"ada", "true"}})),
               Error);
  EXPECT_THROW(make_policy(config("keydiff", 3, shape, {{"block", "4"}, {"chunkkv", "2"}})),
               Error);
}

// ChunkPress over CUR and LagKV (`chunk: N`, scored on the host, each run as a cache of its rows):
// the keep-set of each run of N slots is what the plain policy keeps of a cache holding only that
// run, at max(1, int(len x f)) slots, f = kv_budget / n. Two heads of 37 random rows (d 4), runs
// of 10 (the last of 7), budgets 12 and 25.
TEST(ScorerWrappers, ChunkOfACacheScorerKeepsWhatEachRunAloneKeeps) {
  const int heads = 2, d = 4, n = 37, run = 10;
  const auto rows = random_rows(heads, n, d, 19, 0.0f);
  const ModelShape shape{1, heads, heads, d, 0};
  for (const char* name : {"cur", "lagkv"}) {
    for (int budget : {12, 25}) {
      SCOPED_TRACE(std::string(name) + " " + std::to_string(budget));
      std::map<std::string, std::string> opts = {{"chunk", std::to_string(run)}};
      std::map<std::string, std::string> plain;
      if (std::string(name) == "lagkv") {
        opts["lag"] = plain["lag"] = "3";
        opts["sinks"] = plain["sinks"] = "1";
      }
      KvCache cache = cache_of(rows, d);
      LayerStats st;
      st.n_new = n;
      st.num_heads = heads;
      prefill_layer(*make_policy(config(name, budget, shape, opts)), st, cache);
      const double f = static_cast<double>(budget) / n;
      std::vector<std::vector<int>> want(heads);
      for (int c0 = 0; c0 < n; c0 += run) {
        const int len = std::min(run, n - c0);
        std::vector<std::vector<std::vector<float>>> part(heads);
        for (int h = 0; h < heads; ++h) {
          part[h].assign(rows[h].begin() + c0, rows[h].begin() + c0 + len);
        }
        KvCache alone = cache_of(part, d);
        LayerStats sa;
        sa.n_new = len;
        sa.num_heads = heads;
        const int k = std::max(1, static_cast<int>(len * f));
        prefill_layer(*make_policy(config(name, k, shape, plain)), sa, alone);
        for (int h = 0; h < heads; ++h) {
          for (int32_t p : positions(alone, 0, h)) want[h].push_back(c0 + p);
        }
      }
      for (int h = 0; h < heads; ++h) {
        const V got = positions(cache, 0, h);
        EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want[h]) << "head " << h;
      }
    }
  }
}

TEST(ScorerWrappers, ChunkKvKeepsTheBestChunksWholeInEveryHead) {
  const V all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(keep_two_heads(9, {{"chunkkv", "3"}}),
            (std::pair{V{3, 4, 5, 6, 7, 8, 9}, V{3, 4, 5, 6, 7, 8, 9}}));
  EXPECT_EQ(keep_two_heads(7, {{"chunkkv", "3"}}),
            (std::pair{V{3, 4, 5, 6, 7, 8, 9}, V{3, 4, 5, 6, 7, 8, 9}}));
  EXPECT_EQ(keep_two_heads(6, {{"chunkkv", "3"}}), (std::pair{V{6, 7, 8, 9}, V{6, 7, 8, 9}}));
  EXPECT_EQ(keep_two_heads(3, {{"chunkkv", "3"}}), (std::pair{V{9}, V{9}}));
  EXPECT_EQ(keep_two_heads(2, {{"chunkkv", "3"}}), (std::pair{V{8, 9}, V{8, 9}}));
  const std::vector<float> falling = {5, 5, 5, 4, 4, 4, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(keep_two_heads(8, {{"chunkkv", "3"}}, falling),
            (std::pair{V{0, 1, 2, 3, 4, 5}, V{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(keep_two_heads(4, {{"chunkkv", "20"}}), (std::pair{V{3, 4, 5, 9}, V{5, 6, 7, 8}}));
  EXPECT_EQ(keep_two_heads(10, {{"chunkkv", "3"}}), (std::pair{all, all}));
  // Without it, each head its own top 4.
  EXPECT_EQ(keep_two_heads(4, {}), (std::pair{V{3, 4, 5, 9}, V{5, 6, 7, 8}}));
}

// threshold (kvpress DMSPress, dense prefill): with threshold 2 and a window of 3, head 0 drops
// the slots before 7 scored below 2 (0-2; slot 6's 2 is not below) and head 1 all but slot 6;
// the budget does not decide. A window as long as the heads keeps everything.
TEST(ScorerWrappers, ThresholdDropsTheScoresBelowItBeforeTheWindow) {
  const std::map<std::string, std::string> t = {{"threshold", "2"}, {"threshold_window", "3"}};
  EXPECT_EQ(keep_two_heads(1, t), (std::pair{V{3, 4, 5, 6, 7, 8, 9}, V{6, 7, 8, 9}}));
  EXPECT_EQ(keep_two_heads(100, t), (std::pair{V{3, 4, 5, 6, 7, 8, 9}, V{6, 7, 8, 9}}));
  EXPECT_EQ(keep_two_heads(1, {{"threshold", "2"}, {"threshold_window", "10"}}),
            (std::pair{V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}));
  // The default window is 128 (kvpress's sliding_window_size): nothing here is outside it.
  EXPECT_EQ(keep_two_heads(1, {{"threshold", "100"}}).first.size(), 10u);
  EXPECT_EQ(keep_two_heads(1, {{"threshold", "-0.5"}, {"threshold_window", "0"}}),
            (std::pair{V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}));
  EXPECT_EQ(keep_two_heads(1, {{"threshold", "0.5"}, {"threshold_window", "0"}}),
            (std::pair{V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, V{3, 4, 5, 6, 7, 8}}));
}

// chunkkv and threshold replace the per-head selection: refused beside ada, critical,
// decode_interval or each other; threshold also beside layer_ratios, and threshold_window alone.
TEST(ScorerWrappers, ChunkKvAndThresholdStandAlone) {
  const ModelShape shape{2, 2, 2, 1, 0};
  using O = std::map<std::string, std::string>;
  for (const O& bad :
       {O{{"chunkkv", "4"}, {"ada", "true"}}, O{{"chunkkv", "4"}, {"critical", "true"}},
        O{{"chunkkv", "4"}, {"decode_interval", "2"}}, O{{"threshold", "0"}, {"ada", "true"}},
        O{{"threshold", "0"}, {"critical", "true"}}, O{{"threshold", "0"}, {"chunkkv", "4"}},
        O{{"threshold", "0"}, {"layer_ratios", "0.5,0.5"}}, O{{"threshold_window", "4"}},
        O{{"threshold", "nan"}}, O{{"chunkkv", "-1"}}}) {
    std::string label;
    for (const auto& [k, v] : bad) label += k + "=" + v + " ";
    EXPECT_THROW(make_policy(config("keydiff", 4, shape, bad)), Error) << label;
  }
  EXPECT_NO_THROW(
      make_policy(config("cur", 4, shape, {{"chunkkv", "4"}, {"layer_ratios", "0.5,0.5"}})));
  EXPECT_NO_THROW(make_policy(config("lagkv", 4, shape, {{"threshold", "0.5"}})));
}

// threshold_decode (kvpress DMSPress decoding=True): cur scoring keys alone (k^2 over the head's
// sum), threshold 0.5, window 2. The prompt's keys 1 2 3 4 score 1/30, 4/30, 9/30, 16/30: slots 0
// and 1 are before the window and below 0.5 (kept: positions 2 3; buffered 9/30, 16/30). Each
// generated token scores 1 alone (kvpress scores it as a one-token cache). Step 1 (position 4):
// 9/30 leaves the window below 0.5, so position 2 goes. Step 2: 16/30 leaves, stays. Step 3: a
// generated token's 1 leaves, stays; at threshold 1.5 it goes (and so did every earlier one).
TEST(ScorerWrappers, ThresholdDecodeDropsTokensLeavingTheWindowBelowIt) {
  const ModelShape shape{1, 1, 1, 1, 0};
  auto run = [&](const char* t) {
    auto p = make_policy(config("cur", 3, shape,
                                {{"sinks", "0"},
                                 {"local_window", "0"},
                                 {"leverage", "key"},
                                 {"threshold", t},
                                 {"threshold_window", "2"},
                                 {"threshold_decode", "true"}}));
    KvCache cache = cache_of({{{1}, {2}, {3}, {4}}}, 1);
    LayerStats st;
    st.layer = 0;
    st.n_new = 4;
    st.num_heads = 1;
    prefill_layer(*p, st, cache);
    std::vector<V> out = {positions(cache, 0, 0)};
    st.n_new = 1;
    for (int s = 0; s < 3; ++s) {
      const float k = 10, v = -10;
      cache.reserve_extra(1);
      cache.append(0, 0, &k, &v, 4 + s);
      decode_layer(*p, st, cache);
      out.push_back(positions(cache, 0, 0));
    }
    return out;
  };
  EXPECT_EQ(run("0.5"), (std::vector<V>{{2, 3}, {3, 4}, {3, 4, 5}, {3, 4, 5, 6}}));
  EXPECT_EQ(run("1.5"), (std::vector<V>{{2, 3}, {3, 4}, {4, 5}, {5, 6}}));
  // Needs threshold, and a score of the cache alone.
  EXPECT_THROW(make_policy(config("keydiff", 3, shape, {{"threshold_decode", "true"}})), Error);
  EXPECT_THROW(make_policy(config("expected_attention", 3, shape,
                                  {{"threshold", "0"}, {"threshold_decode", "true"}})),
               Error);
}

// A generated token's score under threshold_decode (CacheScorer::lone_score) is what the scorer
// gives a cache of that one slot: kept at a threshold equal to it, dropped at the next float up.
// keydiff -1; cur 1 (with 4 sinks or none); lagkv 1 with sinks, 0 without.
TEST(ScorerWrappers, LoneScoresAreTheScoresOfAOneSlotCache) {
  const ModelShape shape{1, 1, 1, 3, 0};
  struct Case {
    const char* name;
    std::map<std::string, std::string> opts;
    float lone;
  };
  const std::vector<Case> cases = {{"keydiff", {}, -1.0f},
                                   {"cur", {}, 1.0f},
                                   {"cur", {{"sinks", "0"}}, 1.0f},
                                   {"lagkv", {}, 1.0f},
                                   {"lagkv", {{"sinks", "0"}}, 0.0f}};
  for (const Case& c : cases) {
    for (const bool above : {false, true}) {
      const float t = above ? std::nextafter(c.lone, 2.0f) : c.lone;
      char text[64];
      std::snprintf(text, sizeof text, "%.9g", t);
      auto opts = c.opts;
      opts["threshold"] = text;
      opts["threshold_window"] = "0";
      SCOPED_TRACE(std::string(c.name) + " threshold " + text);
      for (const std::vector<float>& key :
           {std::vector<float>{0.3f, -1.7f, 2.9f}, std::vector<float>{-5.0f, 0.25f, 1e-3f}}) {
        KvCache cache = cache_of({{key}}, 3);
        LayerStats st;
        st.layer = 0;
        st.n_new = 1;
        st.num_heads = 1;
        prefill_layer(*make_policy(config(c.name, 1, shape, opts)), st, cache);
        EXPECT_EQ(cache.length(0, 0), above ? 0 : 1);
      }
    }
  }
}

// The kvpress scorers take the wrappers' options; critical asks for the output projection.
TEST(ScorerWrappers, EveryKvpressScorerTakesTheOptions) {
  const ModelShape shape{1, 2, 2, 2, 0};
  for (const char* name : {"keydiff", "observed_attention", "cur", "lagkv", "expected_attention"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(
        make_policy(config(name, 2, shape, {{"ada", "true"}, {"alpha_safeguard", "0.3"}})));
    auto p = make_policy(config(name, 2, shape, {{"critical", "true"}}));
    EXPECT_TRUE(p->prefill_request(8).output_projection);
    EXPECT_FALSE(make_policy(config(name, 2, shape))->prefill_request(8).output_projection);
    EXPECT_THROW(make_policy(config(name, 2, shape, {{"alpha_safeguard", "1.5"}})), Error);
    EXPECT_THROW(make_policy(config(name, 2, shape, {{"first_stage_ratio", "-1"}})), Error);
  }
}

}  // namespace
}  // namespace kvb::policies
