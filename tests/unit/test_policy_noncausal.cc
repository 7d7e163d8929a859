// Compactor's two halves as kvpress has them (POLICIES.md "kvpress's presses"): `noncausal_attn`
// (NonCausalAttnPress) and `leverage` (LeverageScorePress). Their vocabulary ops
// (chunk_attention_sums, standardize, leverage_scores) on hand-computed cases, the sketch, and
// each policy's keep-sets against a plain float64 computation written independently from
// kvpress's code (NonCausalAttn: RoPE in float64 on the queries, chunks padded as kvpress pads
// them, the GQA mean, value norms, avg_pool1d(3, padding 1), the layer's z-score, top-k per head;
// leverage: centred keys times the sketch, the Gram matrix plus 1e-2 I inverted by Gauss-Jordan
// elimination, the quadratic forms, top-k per head).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sketch.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"
#include "policy_test_util.h"

namespace kvb::policies {
namespace {

using kernels::KvCache;
using kernels::cpu::RopeParams;
using kernels::cpu::RopeStyle;
using V = std::vector<int32_t>;

using testing_policy::config;
using testing_policy::positions;

// One query head over one KV head, d 2, three tokens, chunks of 2. RoPE's positions are divided
// by 1e30, so every rotation is the identity in f32. Chunk 0 (slots 0, 1; queries 0, 1): q0 = 0
// attends 1/2, 1/2; q1 = (ln 3, 0) attends 3/4, 1/4 (logits ln 3 and 0): 1.25 and 0.75. Chunk 1
// is slot 2 alone, padded as kvpress pads it: one padded key of logit -1e-9 and one padded query
// (logit 0 on slot 2). q2 = (1, 1) has logit 2 on k2 = (1, 1): 1 / (1 + e^-2); the padded query
// 1 / (1 + e^-1e-9) ~ 1/2. Without the padding slot 2 would score 1.
TEST(NonCausalAttnOps, ChunkAttentionSumsOfHandPickedQueriesAndKeys) {
  kernels::ops::CpuPolicyOps ops;
  const float ln3 = std::log(3.0f);
  const std::vector<float> q = {0, 0, ln3, 0, 1, 1};
  const std::vector<std::vector<float>> k = {{1, 0}, {0, 1}, {1, 1}};
  KvCache cache({1, 1, 2}, 3);
  for (int j = 0; j < 3; ++j) cache.append(0, 0, k[j].data(), k[j].data(), j);
  RopeParams rope;
  rope.style = RopeStyle::kNeox;
  rope.rot_dim = 2;
  rope.linear_scale = 1e30f;
  LayerStats st;
  st.n_new = 3;
  st.num_heads = 1;
  st.pre_rope_queries = q.data();
  st.rope = &rope;
  st.block_end = 3;
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 1, 1);
  ops.chunk_attention_sums(*out, 0, cache, 0, st, 0, 3, 2);
  const std::vector<float> got = ops.read_f32(*out, 0, 0);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_NEAR(got[0], 1.25f, 1e-6);
  EXPECT_NEAR(got[1], 0.75f, 1e-6);
  EXPECT_NEAR(got[2], 1.0 / (1.0 + std::exp(-2.0)) + 0.5, 1e-6);
  // One chunk of all three: no padding, each query's row sums to 1, so the sums total 3.
  ops.chunk_attention_sums(*out, 0, cache, 0, st, 0, 3, 3);
  const std::vector<float> whole = ops.read_f32(*out, 0, 0);
  EXPECT_NEAR(whole[0] + whole[1] + whole[2], 3.0, 1e-6);
  // Tokens [1, 3) alone, one chunk of 2 over k1 = (0, 1) and k2 = (1, 1): q1 = (ln 3, 0) has
  // logits 0 and ln 3 (1/4, 3/4); q2 = (1, 1) logits 1 and 2 (e^-1 / (1 + e^-1), 1 / (1 + e^-1)).
  ops.chunk_attention_sums(*out, 0, cache, 0, st, 1, 2, 2);
  const std::vector<float> part = ops.read_f32(*out, 0, 0);
  ASSERT_EQ(part.size(), 2u);
  const double e1 = std::exp(-1.0);
  EXPECT_NEAR(part[0], 0.25 + e1 / (1 + e1), 1e-6);
  EXPECT_NEAR(part[1], 0.75 + 1 / (1 + e1), 1e-6);
  // A block that is not the whole cache, queries missing, a chunk of 0: refused.
  EXPECT_THROW(ops.chunk_attention_sums(*out, 0, cache, 0, st, 2, 2, 2), Error);  // past the end
  st.n_new = 2;
  EXPECT_THROW(ops.chunk_attention_sums(*out, 0, cache, 0, st, 0, 2, 2), Error);
  st.n_new = 3;
  EXPECT_THROW(ops.chunk_attention_sums(*out, 0, cache, 0, st, 0, 3, 0), Error);
  st.pre_rope_queries = nullptr;
  EXPECT_THROW(ops.chunk_attention_sums(*out, 0, cache, 0, st, 0, 3, 2), Error);
}

// Rows {1, 2} and {3}: mean 2, unbiased variance (1 + 0 + 1) / 2 = 1: -1, 0, 1. One entry (N < 2)
// and equal entries divide by the floor 1e-6. Rows of 600 and 3 entries (three runs of the sums)
// against a plain two-pass float64 computation.
TEST(NonCausalAttnOps, StandardizeTakesTheLayersHeadsTogether) {
  kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 2);
  // Head h's row becomes rows[h] (accumulate of one source row per head into zeros).
  auto set = [&](const std::vector<std::vector<float>>& rows) {
    size_t cap = 1;
    for (const auto& row : rows) cap = std::max(cap, row.size());
    std::vector<float> src(rows.size() * cap, 0.0f);
    V len;
    for (size_t h = 0; h < rows.size(); ++h) {
      std::copy(rows[h].begin(), rows[h].end(), src.begin() + h * cap);
      len.push_back(static_cast<int32_t>(rows[h].size()));
    }
    ops.resize(*r, 0, V(rows.size(), 0));
    ops.resize(*r, 0, len);
    ops.accumulate(*r, 0, src.data(), cap, cap, 1, kernels::ops::GqaReduce::kMean);
  };
  set({{1, 2}, {3}});
  ops.standardize(*r, 0);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{-1, 0}));
  EXPECT_EQ(ops.read_f32(*r, 0, 1), (std::vector<float>{1}));
  set({{5}, {}});
  ops.standardize(*r, 0);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{0}));
  set({{2, 2}, {2}});
  ops.standardize(*r, 0);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{0, 0}));
  set({{1e-7f, 0}, {}});  // sd 7.07e-8 is floored: (x - mean) / 1e-6
  ops.standardize(*r, 0);
  EXPECT_NEAR(ops.read_f32(*r, 0, 0)[0], 0.05, 1e-6);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(2.0f, 3.0f);
  std::vector<std::vector<float>> rows = {std::vector<float>(600), std::vector<float>(3)};
  for (auto& row : rows) {
    for (float& x : row) x = g(rng);
  }
  set(rows);
  ops.standardize(*r, 0);
  double mean = 0, sq = 0;
  for (const auto& row : rows) {
    for (float x : row) mean += x;
  }
  mean /= 603;
  for (const auto& row : rows) {
    for (float x : row) sq += (x - mean) * (x - mean);
  }
  const double sd = std::sqrt(sq / 602);
  for (size_t h = 0; h < 2; ++h) {
    const std::vector<float> got = ops.read_f32(*r, 0, static_cast<int>(h));
    for (size_t j = 0; j < rows[h].size(); ++j) {
      EXPECT_NEAR(got[j], (rows[h][j] - mean) / sd, 1e-6) << h << " " << j;
    }
  }
}

// kvpress's NonCausalAttnPress in float64, written from its code: queries rotated by RoPE (neox,
// float64 cos and sin) at positions 0..n-1; per query head and chunk of `chunk` (padded to a
// multiple: padded keys of logit -1e-9, padded queries of logit 0 on real keys), the softmax of
// each query's row summed over the chunk's queries (padded ones too); the mean over the KV head's
// query heads; times |v|; the average of 3 neighbours (zeros past the ends, / 3); the z-score over
// the whole layer; each head's top `budget`.
std::vector<std::vector<int>> reference_keep(const std::vector<float>& q,
                                             const std::vector<std::vector<std::vector<float>>>& k,
                                             const std::vector<std::vector<std::vector<float>>>& v,
                                             int num_heads, int d, float theta, int chunk,
                                             int budget, std::vector<std::vector<double>>* z,
                                             int pos0 = 0) {
  const int kv = static_cast<int>(k.size()), n = static_cast<int>(k[0].size());
  const int group = num_heads / kv, half = d / 2;
  const int padded = (n + chunk - 1) / chunk * chunk;
  std::vector<std::vector<double>> a(kv, std::vector<double>(n, 0.0));
  for (int h = 0; h < num_heads; ++h) {
    std::vector<std::vector<double>> y(padded, std::vector<double>(d, 0.0));
    for (int t = 0; t < n; ++t) {
      const float* x = &q[(static_cast<size_t>(t) * num_heads + h) * d];
      for (int i = 0; i < half; ++i) {
        const double f = 1.0 / std::pow(static_cast<double>(theta), 2.0 * i / d);
        const double c = std::cos((pos0 + t) * f), s = std::sin((pos0 + t) * f);
        y[t][i] = x[i] * c - x[i + half] * s;
        y[t][i + half] = x[i] * s + x[i + half] * c;
      }
    }
    const int c = h / group;
    for (int c0 = 0; c0 < padded; c0 += chunk) {
      for (int t = c0; t < c0 + chunk; ++t) {
        std::vector<double> logit(chunk);
        for (int j = 0; j < chunk; ++j) {
          if (c0 + j >= n) {
            logit[j] = -1e-9;
          } else if (t >= n) {
            logit[j] = 0;
          } else {
            double dot = 0;
            for (int i = 0; i < d; ++i) dot += y[t][i] * k[c][c0 + j][i];
            logit[j] = dot;
          }
        }
        const double top = *std::max_element(logit.begin(), logit.end());
        double sum = 0;
        for (double l : logit) sum += std::exp(l - top);
        for (int j = 0; j < chunk && c0 + j < n; ++j) {
          a[c][c0 + j] += std::exp(logit[j] - top) / sum / group;
        }
      }
    }
  }
  std::vector<std::vector<double>> pooled(kv, std::vector<double>(n, 0.0));
  double total = 0;
  for (int c = 0; c < kv; ++c) {
    std::vector<double> s(n);
    for (int j = 0; j < n; ++j) {
      double vn = 0;
      for (float x : v[c][j]) vn += static_cast<double>(x) * x;
      s[j] = a[c][j] * std::sqrt(vn);
    }
    for (int j = 0; j < n; ++j) {
      pooled[c][j] = ((j > 0 ? s[j - 1] : 0.0) + s[j] + (j + 1 < n ? s[j + 1] : 0.0)) / 3;
      total += pooled[c][j];
    }
  }
  const double mean = total / (kv * n);
  double sq = 0;
  for (const auto& row : pooled) {
    for (double x : row) sq += (x - mean) * (x - mean);
  }
  const double sd = std::sqrt(sq / (kv * n - 1));
  std::vector<std::vector<int>> keep(kv);
  z->assign(kv, std::vector<double>(n));
  for (int c = 0; c < kv; ++c) {
    for (int j = 0; j < n; ++j) (*z)[c][j] = (pooled[c][j] - mean) / sd;
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return pooled[c][x] > pooled[c][y]; });
    keep[c].assign(order.begin(), order.begin() + std::min(budget, n));
    std::sort(keep[c].begin(), keep[c].end());
  }
  return keep;
}

// Two KV heads, four query heads, d 8, 26 tokens of random queries, keys and values: the policy
// keeps what the float64 press keeps, per head, at three budgets and chunks of 8 (a short last
// chunk of 2), 26 (one chunk) and 32 (one padded chunk); a budget of the whole prompt keeps
// everything. With a threshold (DMSPress over it) the z-scores decide: the slots before the
// window whose float64 z-score is below it leave.
TEST(NonCausalAttnPolicy, KeepsWhatAFloat64PressKeeps) {
  const int kv = 2, heads = 4, d = 8, n = 26;
  const float theta = 10000.0f;
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n) * heads * d);
  for (float& x : q) x = g(rng);
  std::vector<std::vector<std::vector<float>>> k(kv, std::vector<std::vector<float>>(n)), v = k;
  for (int c = 0; c < kv; ++c) {
    for (int j = 0; j < n; ++j) {
      k[c][j].resize(d);
      v[c][j].resize(d);
      for (float& x : k[c][j]) x = g(rng);
      for (float& x : v[c][j]) x = g(rng);
    }
  }
  RopeParams rope;
  rope.style = RopeStyle::kNeox;
  rope.rot_dim = d;
  rope.theta = theta;
  const ModelShape shape{1, heads, kv, d, 0};
  auto filled = [&] {
    KvCache cache({1, kv, d}, n);
    for (int j = 0; j < n; ++j) {
      for (int c = 0; c < kv; ++c) cache.append(0, c, k[c][j].data(), v[c][j].data(), j);
    }
    return cache;
  };
  LayerStats st;
  st.layer = 0;
  st.n_new = n;
  st.num_heads = heads;
  st.pre_rope_queries = q.data();
  st.rope = &rope;
  st.block_end = n;
  for (int chunk : {8, 26, 32}) {
    for (int budget : {5, 13, 21, n}) {
      SCOPED_TRACE(std::to_string(chunk) + " " + std::to_string(budget));
      KvCache cache = filled();
      auto p = make_policy(
          config("noncausal_attn", budget, shape, {{"chunk_size", std::to_string(chunk)}}));
      EXPECT_TRUE(p->decides_with_ops());
      EXPECT_TRUE(p->prefill_request(n).pre_rope_queries);
      prefill_layer(*p, st, cache);
      std::vector<std::vector<double>> z;
      const auto want = reference_keep(q, k, v, heads, d, theta, chunk, budget, &z);
      for (int c = 0; c < kv; ++c) {
        const V got = positions(cache, 0, c);
        EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want[c]) << "head " << c;
      }
    }
    // threshold 0.3, window 4: every slot before the last 4 whose z-score is below 0.3 leaves.
    KvCache cache = filled();
    auto p = make_policy(config(
        "noncausal_attn", 1, shape,
        {{"chunk_size", std::to_string(chunk)}, {"threshold", "0.3"}, {"threshold_window", "4"}}));
    prefill_layer(*p, st, cache);
    std::vector<std::vector<double>> z;
    reference_keep(q, k, v, heads, d, theta, chunk, n, &z);
    for (int c = 0; c < kv; ++c) {
      std::vector<int> want;
      for (int j = 0; j < n; ++j) {
        if (j >= n - 4 || z[c][j] >= 0.3) want.push_back(j);
      }
      const V got = positions(cache, 0, c);
      EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want)
          << "chunk " << chunk << " head " << c;
    }
  }
  // Without the queries, or after a block that is not the whole cache, the policy says so; its
  // options are checked.
  KvCache cache = filled();
  LayerStats bare = st;
  bare.pre_rope_queries = nullptr;
  auto p = make_policy(config("noncausal_attn", 6, shape));
  EXPECT_THROW(prefill_layer(*p, bare, cache), Error);
  LayerStats part = st;
  part.n_new = n - 1;
  EXPECT_THROW(prefill_layer(*p, part, cache), Error);
  EXPECT_THROW(make_policy(config("noncausal_attn", 6, shape, {{"chunk_size", "0"}})), Error);
  EXPECT_THROW(make_policy(config("noncausal_attn", 6, shape, {{"decode_interval", "2"}})), Error);
}

// The sketch: reproducible, Gaussian-like (over 6,000 draws: mean within 0.05 of 0, variance
// within 0.1 of 1), different per seed, layer and head.
TEST(LeverageOps, GaussianSketchIsDrawnFromItsCounter) {
  const std::vector<float> a = kernels::cpu::gaussian_sketch(0, 1, 2, 60, 100);
  EXPECT_EQ(a, kernels::cpu::gaussian_sketch(0, 1, 2, 60, 100));
  EXPECT_NE(a, kernels::cpu::gaussian_sketch(1, 1, 2, 60, 100));
  EXPECT_NE(a, kernels::cpu::gaussian_sketch(0, 2, 2, 60, 100));
  EXPECT_NE(a, kernels::cpu::gaussian_sketch(0, 1, 3, 60, 100));
  double mean = 0, sq = 0;
  for (float z : a) mean += z;
  mean /= a.size();
  for (float z : a) sq += (z - mean) * (z - mean);
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(sq / a.size(), 1.0, 0.1);
  // A prefix of a larger sketch with as many columns is the smaller sketch (the counter runs over
  // entries in row-major order).
  const std::vector<float> b = kernels::cpu::gaussian_sketch(0, 1, 2, 30, 100);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin()));
}

// Leverage by hand: one head, d 1, a sketch of [1] (k 1), keys 1, 3, 5 (mean 3): x = -2, 0, 2,
// G = 8 + 1e-2; scores 4 / 8.01, 0, 4 / 8.01. Only tokens [1, 3): keys 3, 5 (mean 4), x = -1, 1,
// G = 2.01: 1 / 2.01 each. A NaN key: no factor at any jitter, the host throws.
TEST(LeverageOps, LeverageScoresOfHandPickedKeys) {
  kernels::ops::CpuPolicyOps ops;
  std::vector<float> keys = {1, 3, 5};
  const float sketch[] = {1.0f};
  LayerStats st;
  st.n_new = 3;
  st.pre_rope_keys = keys.data();
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 1, 1);
  ops.leverage_scores(*out, 0, st, 1, 1, 0, 3, sketch, 1);
  EXPECT_EQ(ops.read_f32(*out, 0, 0),
            (std::vector<float>{static_cast<float>(4 / 8.01), 0, static_cast<float>(4 / 8.01)}));
  ops.leverage_scores(*out, 0, st, 1, 1, 1, 2, sketch, 1);
  EXPECT_EQ(ops.read_f32(*out, 0, 0),
            (std::vector<float>{static_cast<float>(1 / 2.01), static_cast<float>(1 / 2.01)}));
  EXPECT_THROW(ops.leverage_scores(*out, 0, st, 1, 1, 2, 2, sketch, 1), Error);  // past the block
  EXPECT_THROW(ops.leverage_scores(*out, 0, st, 1, 1, 0, 3, sketch, 0), Error);
  keys[1] = std::nanf("");
  EXPECT_THROW(ops.leverage_scores(*out, 0, st, 1, 1, 0, 3, sketch, 1), Error);
}

// LeverageScorePress in float64: per KV head, the keys centred over the prompt, times the sketch
// (kvbench's, rows in HF's channel order, times float(1 / sqrt(k))), G = X^T X + 1e-2 I inverted by
// Gauss-Jordan elimination with partial pivoting, score x_t^T G^{-1} x_t; each head's top
// `budget` (no ties in random keys). The z-score changes no head's own order.
std::vector<std::vector<int>> leverage_reference(const std::vector<float>& keys, int kv, int d,
                                                 int n, int k, int layer, int budget,
                                                 bool adjacent) {
  std::vector<std::vector<int>> keep(kv);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k)));
  for (int h = 0; h < kv; ++h) {
    const std::vector<float> z = kernels::cpu::gaussian_sketch(0, layer, h, d, k);
    std::vector<double> phi(static_cast<size_t>(d) * k);
    for (int j = 0; j < d; ++j) {
      const int from = adjacent ? (j % 2 == 0 ? j / 2 : d / 2 + j / 2) : j;
      for (int c = 0; c < k; ++c) phi[j * k + c] = z[from * k + c] * scale;
    }
    std::vector<double> mean(d, 0.0);
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < d; ++i) mean[i] += keys[(static_cast<size_t>(t) * kv + h) * d + i] / n;
    }
    std::vector<std::vector<double>> x(n, std::vector<double>(k, 0.0));
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < k; ++c) {
        for (int i = 0; i < d; ++i) {
          x[t][c] += (keys[(static_cast<size_t>(t) * kv + h) * d + i] - mean[i]) * phi[i * k + c];
        }
      }
    }
    // [G | I] -> [I | G^-1]
    std::vector<std::vector<double>> m(k, std::vector<double>(2 * k, 0.0));
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b < k; ++b) {
        for (int t = 0; t < n; ++t) m[a][b] += x[t][a] * x[t][b];
      }
      m[a][a] += 1e-2;
      m[a][k + a] = 1.0;
    }
    for (int col = 0; col < k; ++col) {
      int piv = col;
      for (int r = col + 1; r < k; ++r) {
        if (std::fabs(m[r][col]) > std::fabs(m[piv][col])) piv = r;
      }
      std::swap(m[col], m[piv]);
      const double p = m[col][col];
      for (double& e : m[col]) e /= p;
      for (int r = 0; r < k; ++r) {
        if (r == col) continue;
        const double f = m[r][col];
        for (int c = 0; c < 2 * k; ++c) m[r][c] -= f * m[col][c];
      }
    }
    std::vector<double> score(n, 0.0);
    for (int t = 0; t < n; ++t) {
      for (int a = 0; a < k; ++a) {
        for (int b = 0; b < k; ++b) score[t] += x[t][a] * m[a][k + b] * x[t][b];
      }
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    keep[h].assign(order.begin(), order.begin() + std::min(budget, n));
    std::sort(keep[h].begin(), keep[h].end());
  }
  return keep;
}

// Three KV heads, d 8, 40 tokens of random pre-RoPE keys, layer 2: the policy keeps what the
// float64 press keeps per head at three budgets, with sketches of 3, 8 and 20 columns (more
// columns than dimensions too), and with adjacent-pair RoPE rows (the sketch's rows permuted to
// HF's order); a budget of the whole prompt keeps everything. Without pre-RoPE keys, or after a
// block that is not the whole cache, it says so.
TEST(LeveragePolicy, KeepsWhatAFloat64PressKeeps) {
  const int kv = 3, d = 8, n = 40, layer = 2;
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.5f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(n) * kv * d);
  for (float& x : keys) x = g(rng);
  const ModelShape shape{3, kv, kv, d, 0};
  auto filled = [&] {
    KvCache cache({3, kv, d}, n);
    std::vector<float> v(d, 1.0f);
    for (int j = 0; j < n; ++j) {
      for (int c = 0; c < kv; ++c) {
        cache.append(layer, c, &keys[(static_cast<size_t>(j) * kv + c) * d], v.data(), j);
      }
    }
    return cache;
  };
  for (const bool adjacent : {false, true}) {
    RopeParams rope;
    rope.style = adjacent ? RopeStyle::kNorm : RopeStyle::kNeox;
    rope.rot_dim = d;
    LayerStats st;
    st.layer = layer;
    st.n_new = n;
    st.num_heads = kv;
    st.pre_rope_keys = keys.data();
    st.rope = &rope;
    for (int k : {3, 8, 20}) {
      for (int budget : {7, 19, 33, n}) {
        SCOPED_TRACE(std::to_string(adjacent) + " " + std::to_string(k) + " " +
                     std::to_string(budget));
        KvCache cache = filled();
        auto p = make_policy(
            config("leverage", budget, shape, {{"sketch_dimension", std::to_string(k)}}));
        EXPECT_TRUE(p->decides_with_ops());
        EXPECT_TRUE(p->prefill_request(n).pre_rope_keys);
        prefill_layer(*p, st, cache);
        const auto want = leverage_reference(keys, kv, d, n, k, layer, budget, adjacent);
        for (int c = 0; c < kv; ++c) {
          const V got = positions(cache, layer, c);
          EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want[c]) << "head " << c;
        }
      }
    }
  }
  KvCache cache = filled();
  LayerStats bare;
  bare.layer = layer;
  bare.n_new = n;
  bare.num_heads = kv;
  auto p = make_policy(config("leverage", 6, shape));
  EXPECT_THROW(prefill_layer(*p, bare, cache), Error);
  bare.pre_rope_keys = keys.data();
  bare.n_new = n - 1;
  EXPECT_THROW(prefill_layer(*p, bare, cache), Error);
  EXPECT_THROW(make_policy(config("leverage", 6, shape, {{"sketch_dimension", "129"}})), Error);
}

// slice and pad_with_max by hand: rows {1, 5, 2, 7} and {3, 9}: entries [1, 2) of each are {5} and
// {9}; padded 2 before and 1 after with the maximum of both rows (9).
TEST(CompactorOps, SliceAndPadWithMax) {
  kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 2);
  const std::vector<float> src = {1, 5, 2, 7, 3, 9, 0, 0};
  ops.resize(*r, 0, V{4, 2});
  ops.accumulate(*r, 0, src.data(), 4, 4, 1, kernels::ops::GqaReduce::kMean);
  std::unique_ptr<SlotRows> a = ops.make_rows(SlotType::kF32, 1, 2);
  ops.slice(*r, 0, 1, 1, *a, 0);
  EXPECT_EQ(ops.read_f32(*a, 0, 0), (std::vector<float>{5}));
  EXPECT_EQ(ops.read_f32(*a, 0, 1), (std::vector<float>{9}));
  EXPECT_THROW(ops.slice(*r, 0, 1, 2, *a, 0), Error);  // head 1 holds 2 entries
  ops.pad_with_max(*r, 0, 2, 1, *a, 0);
  EXPECT_EQ(ops.read_f32(*a, 0, 0), (std::vector<float>{9, 9, 1, 5, 2, 7, 9}));
  EXPECT_EQ(ops.read_f32(*a, 0, 1), (std::vector<float>{9, 9, 3, 9, 9}));
  EXPECT_THROW(ops.pad_with_max(*r, 0, 1, 1, *r, 0), Error);  // in and out the same rows
}

// CompactorPress's keep-sets from its two halves over the middle tokens alone: with blending 0 the
// middle keeps what the float64 NonCausalAttn keeps of the middle's own queries (at their
// positions), keys and values; with a blending of 1e4 what the float64 LeverageScore keeps of the
// middle's keys; the 8 + 4 protected ends always stay. They score the layer's maximum, which the
// best middle token shares, so a budget keeps the ends and the middle's top budget - 12.
TEST(CompactorPolicy, KeepsItsEndsAndItsHalvesChoicesOfTheMiddle) {
  const int kv = 2, heads = 4, d = 8, n = 50, left = 8, right = 4, mid = n - left - right;
  std::mt19937 rng(17);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n) * heads * d), pre(static_cast<size_t>(n) * kv * d);
  for (float& x : q) x = g(rng);
  for (float& x : pre) x = g(rng);
  std::vector<std::vector<std::vector<float>>> k(kv, std::vector<std::vector<float>>(n)), v = k;
  for (int c = 0; c < kv; ++c) {
    for (int j = 0; j < n; ++j) {
      k[c][j].resize(d);
      v[c][j].resize(d);
      for (float& x : k[c][j]) x = g(rng);
      for (float& x : v[c][j]) x = g(rng);
    }
  }
  RopeParams rope;
  rope.style = RopeStyle::kNeox;
  rope.rot_dim = d;
  const ModelShape shape{1, heads, kv, d, 0};
  LayerStats st;
  st.layer = 0;
  st.n_new = n;
  st.num_heads = heads;
  st.pre_rope_queries = q.data();
  st.pre_rope_keys = pre.data();
  st.rope = &rope;
  st.block_end = n;
  // The middle's queries, keys, values and pre-RoPE keys alone.
  const std::vector<float> mq(q.begin() + static_cast<size_t>(left) * heads * d,
                              q.begin() + static_cast<size_t>(n - right) * heads * d);
  const std::vector<float> mpre(pre.begin() + static_cast<size_t>(left) * kv * d,
                                pre.begin() + static_cast<size_t>(n - right) * kv * d);
  auto mk = k, mv = v;
  for (int c = 0; c < kv; ++c) {
    mk[c].assign(k[c].begin() + left, k[c].end() - right);
    mv[c].assign(v[c].begin() + left, v[c].end() - right);
  }
  for (int budget : {20, 30}) {
    for (const char* blending : {"0", "1e4"}) {
      SCOPED_TRACE(std::to_string(budget) + " " + blending);
      KvCache cache({1, kv, d}, n);
      for (int j = 0; j < n; ++j) {
        for (int c = 0; c < kv; ++c) cache.append(0, c, k[c][j].data(), v[c][j].data(), j);
      }
      auto p = make_policy(
          config("compactor", budget, shape,
                 {{"blending", blending}, {"chunk_size", "16"}, {"sketch_dimension", "6"}}));
      EXPECT_TRUE(p->prefill_request(n).pre_rope_keys);
      EXPECT_TRUE(p->prefill_request(n).pre_rope_queries);
      prefill_layer(*p, st, cache);
      std::vector<std::vector<double>> z;
      const auto want_mid =
          std::string(blending) == "0"
              ? reference_keep(mq, mk, mv, heads, d, 10000.0f, 16, budget - 12, &z, left)
              : leverage_reference(mpre, kv, d, mid, 6, 0, budget - 12, false);
      for (int c = 0; c < kv; ++c) {
        std::vector<int> want;
        for (int j = 0; j < left; ++j) want.push_back(j);
        for (int j : want_mid[c]) want.push_back(left + j);
        for (int j = n - right; j < n; ++j) want.push_back(j);
        const V got = positions(cache, 0, c);
        EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want) << "head " << c;
      }
    }
  }
}

}  // namespace
}  // namespace kvb::policies
