// `expected_attention` (kvpress ExpectedAttentionPress; POLICIES.md "kvpress's presses"): the
// vocabulary ops it is made of (query_moments, quadratic_scores, softmax, add_scalar), RoPE's
// averaged rotation, each on hand-computed cases, and the policy's keep-sets against a plain
// float64 computation written independently in the press's own order (moments of the pre-RoPE
// queries, then the averaged rotation matrix applied to them: R mu, R cov R^T).
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
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"
#include "policy_test_util.h"

namespace kvb::policies {
namespace {

using kernels::KvCache;
using kernels::cpu::RopeParams;
using kernels::cpu::RopeStyle;
using kernels::ops::PairRotation;
using V = std::vector<int32_t>;

using testing_policy::config;
using testing_policy::positions;

// Positions 0 and 1 at frequency 1 (pair 0: theta^0): cos (1 + cos 1) / 2, sin (0 + sin 1) / 2;
// pair 1 (theta 100, rot_dim 4: frequency 1 / 10): (1 + cos .1) / 2, sin(.1) / 2. attn_factor
// scales both.
TEST(ExpectedAttentionOps, RopeMeanRotationAveragesTheFloatCosinesAndSines) {
  RopeParams p;
  p.style = RopeStyle::kNeox;
  p.rot_dim = 4;
  p.theta = 100.0f;
  const std::vector<float> r = kernels::cpu::rope_mean_rotation(p, 0, 2);
  ASSERT_EQ(r.size(), 4u);
  const double c1 = static_cast<float>(std::cos(1.0)), s1 = static_cast<float>(std::sin(1.0));
  const float f = 0.1f;  // 1 / 100^(2/4), as rope() computes it in f32
  const double c2 = static_cast<float>(std::cos(static_cast<double>(f)));
  const double s2 = static_cast<float>(std::sin(static_cast<double>(f)));
  EXPECT_EQ(r[0], static_cast<float>((1.0 + c1) / 2));
  EXPECT_EQ(r[1], static_cast<float>((1.0 + c2) / 2));
  EXPECT_EQ(r[2], static_cast<float>(s1 / 2));
  EXPECT_EQ(r[3], static_cast<float>(s2 / 2));
  p.attn_factor = 2.0f;
  EXPECT_EQ(kernels::cpu::rope_mean_rotation(p, 0, 2)[0], static_cast<float>(1.0 + c1));
  // One position is that position's rotation.
  EXPECT_EQ(kernels::cpu::rope_mean_rotation(p, 1, 1)[2], static_cast<float>(s1 * 2));
  EXPECT_THROW(kernels::cpu::rope_mean_rotation(p, 0, 0), Error);
}

// Queries of one head, d 2: x0 = (9, 9) (skipped: first 1), x1 = (1, 2), x2 = (3, 6). Mean (2, 4),
// deviations +-(1, 2), covariance [[1, 2], [2, 4]]. Rotated by a quarter turn (cos 0, sin 1):
// y = (-x_b, x_a) = (-2, 1), (-6, 3): mean (-4, 2), covariance [[4, -2], [-2, 1]].
TEST(ExpectedAttentionOps, QueryMomentsOfRotatedQueries) {
  kernels::ops::CpuPolicyOps ops;
  const std::vector<float> q = {9, 9, 1, 2, 3, 6};
  LayerStats st;
  st.n_new = 3;
  st.num_heads = 1;
  st.pre_rope_queries = q.data();
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 1);
  ops.query_moments(*r, 0, st, 2, 1, PairRotation{}, true);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{2, 4, 1, 2, 2, 4}));
  ops.query_moments(*r, 0, st, 2, 1, PairRotation{}, false);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{2, 4}));
  const PairRotation quarter{.adjacent = false, .rot_dim = 2, .cos = {0}, .sin = {1}};
  ops.query_moments(*r, 0, st, 2, 1, quarter, true);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{-4, 2, 4, -2, -2, 1}));
  // Adjacent pairs are the same pair at d 2; at d 4 the second pair (2, 3) turns too and
  // (non-adjacent) pairs (0, 2) and (1, 3) turn instead.
  const std::vector<float> q4 = {1, 2, 3, 4};
  st.n_new = 1;
  st.pre_rope_queries = q4.data();
  const PairRotation adj{.adjacent = true, .rot_dim = 4, .cos = {0, 0}, .sin = {1, 1}};
  ops.query_moments(*r, 0, st, 4, 0, adj, false);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{-2, 1, -4, 3}));
  const PairRotation neox{.adjacent = false, .rot_dim = 4, .cos = {0, 0}, .sin = {1, 1}};
  ops.query_moments(*r, 0, st, 4, 0, neox, false);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{-3, -4, 1, 2}));
  // Partial rotation (rot_dim 2 of 4) leaves dimensions 2 and 3 as they are.
  const PairRotation part{.adjacent = false, .rot_dim = 2, .cos = {0}, .sin = {1}};
  ops.query_moments(*r, 0, st, 4, 0, part, false);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{-2, 1, 3, 4}));
  // No query left after `first`, or no queries at all: refused.
  EXPECT_THROW(ops.query_moments(*r, 0, st, 4, 1, part, false), Error);
  st.pre_rope_queries = nullptr;
  EXPECT_THROW(ops.query_moments(*r, 0, st, 4, 0, part, false), Error);
}

// Keys (1, 0), (0, 1), (1, 1) of one cache head read by two query heads. Head 0: mean (2, 4),
// covariance [[1, 2], [2, 4]]; head 1: mean (1, 1), covariance 0. With a = .5, b = .25:
// head 0: k0 .5 * 2 + .25 * 1 = 1.25; k1 2 + 1 = 3; k2 3 + .25 * 9 = 5.25; head 1: .5, .5, 1.
// b = 0 drops the covariance: 1, 2, 3 (and reads moments of the mean alone).
TEST(ExpectedAttentionOps, QuadraticScoresOfTheCachedKeys) {
  kernels::ops::CpuPolicyOps ops;
  KvCache cache({1, 1, 2}, 3);
  const std::vector<std::vector<float>> keys = {{1, 0}, {0, 1}, {1, 1}};
  for (int j = 0; j < 3; ++j) cache.append(0, 0, keys[j].data(), keys[j].data(), j);
  std::unique_ptr<SlotRows> m = ops.make_rows(SlotType::kF32, 1, 2);
  std::vector<float> q = {1, 2, 1, 1,
                          3, 6, 1, 1};  // [t, head, d]: head 0 (1,2),(3,6); head 1 (1,1)
  LayerStats st;
  st.n_new = 2;
  st.num_heads = 2;
  st.pre_rope_queries = q.data();
  ops.query_moments(*m, 0, st, 2, 0, PairRotation{}, true);
  ASSERT_EQ(ops.read_f32(*m, 0, 0), (std::vector<float>{2, 4, 1, 2, 2, 4}));
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 1, 2);
  ops.quadratic_scores(*out, 0, cache, 0, *m, 0, 2, 0.5, 0.25);
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{1.25f, 3, 5.25f}));
  EXPECT_EQ(ops.read_f32(*out, 0, 1), (std::vector<float>{0.5f, 0.5f, 1}));
  ops.quadratic_scores(*out, 0, cache, 0, *m, 0, 2, 0.5, 0.0);
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{1, 2, 3}));
  ops.query_moments(*m, 0, st, 2, 0, PairRotation{}, false);
  ops.quadratic_scores(*out, 0, cache, 0, *m, 0, 2, 0.5, 0.0);
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{1, 2, 3}));
  EXPECT_THROW(ops.quadratic_scores(*out, 0, cache, 0, *m, 0, 2, 0.5, 0.25), Error);  // no cov
  EXPECT_THROW(ops.quadratic_scores(*out, 0, cache, 0, *m, 0, 3, 0.5, 0.0), Error);   // group
}

// quadratic_scores' contract, written out one slot at a time (fused multiply-adds in index
// order), against the op on random keys and moments: the same bits for every slot, 19 of them (the
// op works on blocks of slots), with and without the covariance.
TEST(ExpectedAttentionOps, QuadraticScoresAreTheContractsBits) {
  kernels::ops::CpuPolicyOps ops;
  const int d = 6, n = 19, heads = 2;
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  KvCache cache({1, 1, d}, n);
  std::vector<std::vector<float>> keys(n, std::vector<float>(d));
  for (int j = 0; j < n; ++j) {
    for (float& x : keys[j]) x = g(rng);
    cache.append(0, 0, keys[j].data(), keys[j].data(), j);
  }
  std::vector<float> q(static_cast<size_t>(5) * heads * d);
  for (float& x : q) x = g(rng);
  LayerStats st;
  st.n_new = 5;
  st.num_heads = heads;
  st.pre_rope_queries = q.data();
  std::unique_ptr<SlotRows> m = ops.make_rows(SlotType::kF32, 1, heads);
  ops.query_moments(*m, 0, st, d, 0, PairRotation{}, true);
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 1, heads);
  for (const double b : {0.0, 0.125}) {
    const double a = 0.37;
    ops.quadratic_scores(*out, 0, cache, 0, *m, 0, heads, a, b);
    for (int h = 0; h < heads; ++h) {
      const std::vector<float> mo = ops.read_f32(*m, 0, h);
      const std::vector<float> got = ops.read_f32(*out, 0, h);
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) {
        const std::vector<float>& k = keys[j];
        double dot = 0;
        for (int i = 0; i < d; ++i) dot = std::fma(static_cast<double>(k[i]), mo[i], dot);
        double quad = 0;
        for (int i = 0; i < d; ++i) {
          double inner = 0;
          for (int l = 0; l < d; ++l)
            inner = std::fma(static_cast<double>(mo[d + i * d + l]), k[l], inner);
          quad = std::fma(static_cast<double>(k[i]), inner, quad);
        }
        const float want = static_cast<float>(b == 0 ? a * dot : std::fma(b, quad, a * dot));
        EXPECT_EQ(got[j], want) << "head " << h << " slot " << j << " b " << b;
      }
    }
  }
}

// Row (7, 0, ln 3) from entry 1: e^0 and e^ln3 -> 1/4, 3/4; entry 0 stays. add_scalar adds in f32.
TEST(ExpectedAttentionOps, SoftmaxFromAnEntryAndAddScalar) {
  kernels::ops::CpuPolicyOps ops;
  KvCache cache({1, 1, 1}, 3);
  const std::vector<float> k = {7, 0, static_cast<float>(std::log(3.0))};
  std::unique_ptr<SlotRows> r = ops.make_rows(SlotType::kF32, 1, 1);
  for (int j = 0; j < 3; ++j) cache.append(0, 0, &k[j], &k[j], j);
  ops.cache_norms(*r, 0, cache, 0, kernels::ops::CacheRows::kKeys, false);  // |k|: 7, 0, ln 3
  ops.softmax(*r, 0, 1);
  const std::vector<float> got = ops.read_f32(*r, 0, 0);
  EXPECT_EQ(got[0], 7.0f);
  EXPECT_NEAR(got[1], 0.25f, 1e-7);
  EXPECT_NEAR(got[2], 0.75f, 1e-7);
  EXPECT_FLOAT_EQ(got[1] + got[2], 1.0f);
  ops.softmax(*r, 0, 3);  // nothing from entry 3 on
  EXPECT_EQ(ops.read_f32(*r, 0, 0), got);
  ops.add_scalar(*r, 0, 0.5f);
  EXPECT_EQ(ops.read_f32(*r, 0, 0), (std::vector<float>{7.5f, got[1] + 0.5f, got[2] + 0.5f}));
}

// The press in float64, written from kvpress's code: moments of the pre-RoPE queries after the
// sinks; the rotation matrix R = mean_p (cos_p I + sin_p P) over the next `future` positions
// (rotate_half's P); mu' = R mu, cov' = R cov R^T; logits k mu' / sqrt(d) + k cov' k / (2d);
// softmax over the slots after the sinks; mean over the group; times |v|; the sinks first.
std::vector<std::vector<int>> reference_keep(const std::vector<float>& q,
                                             const std::vector<std::vector<std::vector<float>>>& k,
                                             const std::vector<std::vector<std::vector<float>>>& v,
                                             int num_heads, int d, int sinks, int future,
                                             float theta, int budget) {
  const int kv = static_cast<int>(k.size()), n = static_cast<int>(k[0].size());
  const int group = num_heads / kv, half = d / 2, m = n - sinks;
  // R: rotate_half pairs (i, i + half), positions n .. n + future - 1.
  std::vector<double> R(static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < half; ++i) {
    const double f = 1.0 / std::pow(static_cast<double>(theta), 2.0 * i / d);
    double c = 0, s = 0;
    for (int p = n; p < n + future; ++p) {
      c += std::cos(p * f);
      s += std::sin(p * f);
    }
    c /= future;
    s /= future;
    R[i * d + i] = c;
    R[(i + half) * d + i + half] = c;
    R[i * d + i + half] = -s;  // y_i = c x_i - s x_{i+half}
    R[(i + half) * d + i] = s;
  }
  std::vector<std::vector<double>> scores(kv, std::vector<double>(n, 0.0));
  for (int h = 0; h < num_heads; ++h) {
    std::vector<double> mu(d, 0.0), cov(static_cast<size_t>(d) * d, 0.0);
    for (int t = sinks; t < n; ++t) {
      for (int i = 0; i < d; ++i) mu[i] += q[(static_cast<size_t>(t) * num_heads + h) * d + i] / m;
    }
    for (int t = sinks; t < n; ++t) {
      const float* x = &q[(static_cast<size_t>(t) * num_heads + h) * d];
      for (int i = 0; i < d; ++i) {
        for (int j = 0; j < d; ++j) cov[i * d + j] += (x[i] - mu[i]) * (x[j] - mu[j]) / m;
      }
    }
    std::vector<double> mu2(d, 0.0), cr(static_cast<size_t>(d) * d, 0.0),
        cov2(static_cast<size_t>(d) * d, 0.0);
    for (int i = 0; i < d; ++i) {
      for (int j = 0; j < d; ++j) mu2[i] += R[i * d + j] * mu[j];
    }
    for (int i = 0; i < d; ++i) {  // cr = R cov, cov2 = cr R^T
      for (int j = 0; j < d; ++j) {
        for (int l = 0; l < d; ++l) cr[i * d + j] += R[i * d + l] * cov[l * d + j];
      }
    }
    for (int i = 0; i < d; ++i) {
      for (int j = 0; j < d; ++j) {
        for (int l = 0; l < d; ++l) cov2[i * d + j] += cr[i * d + l] * R[j * d + l];
      }
    }
    const int c = h / group;
    std::vector<double> logit(n);
    for (int j = sinks; j < n; ++j) {
      double dot = 0, quad = 0;
      for (int i = 0; i < d; ++i) {
        dot += k[c][j][i] * mu2[i];
        for (int l = 0; l < d; ++l) quad += k[c][j][i] * cov2[i * d + l] * k[c][j][l];
      }
      logit[j] = dot / std::sqrt(static_cast<double>(d)) + quad / d / 2;
    }
    const double top = *std::max_element(logit.begin() + sinks, logit.end());
    double sum = 0;
    for (int j = sinks; j < n; ++j) sum += std::exp(logit[j] - top);
    for (int j = sinks; j < n; ++j) scores[c][j] += std::exp(logit[j] - top) / sum / group;
  }
  std::vector<std::vector<int>> keep(kv);
  for (int c = 0; c < kv; ++c) {
    for (int j = sinks; j < n; ++j) {
      double vn = 0;
      for (float x : v[c][j]) vn += static_cast<double>(x) * x;
      scores[c][j] *= std::sqrt(vn);
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin() + sinks, order.end(),
                     [&](int a, int b) { return scores[c][a] > scores[c][b]; });
    keep[c].assign(order.begin(), order.begin() + budget);
    std::sort(keep[c].begin(), keep[c].end());
  }
  return keep;
}

// Two KV heads, four query heads, d 8, 24 tokens of random queries, keys and values: the policy
// keeps what the float64 press keeps, per head, at three budgets; a budget of the whole prompt
// keeps everything; the sinks always stay.
TEST(ExpectedAttentionPolicy, KeepsWhatAFloat64PressKeeps) {
  const int kv = 2, heads = 4, d = 8, n = 24, sinks = 3, future = 16;
  const float theta = 10000.0f;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n) * heads * d);
  for (float& x : q) x = g(rng) + 0.5f;
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
  for (int budget : {6, 12, 20, n}) {
    SCOPED_TRACE(budget);
    KvCache cache({1, kv, d}, n);
    for (int j = 0; j < n; ++j) {
      for (int c = 0; c < kv; ++c) cache.append(0, c, k[c][j].data(), v[c][j].data(), j);
    }
    LayerStats st;
    st.layer = 0;
    st.n_new = n;
    st.num_heads = heads;
    st.pre_rope_queries = q.data();
    st.rope = &rope;
    st.block_end = n;
    auto p = make_policy(config(
        "expected_attention", budget, shape,
        {{"n_sink", std::to_string(sinks)}, {"n_future_positions", std::to_string(future)}}));
    EXPECT_TRUE(p->decides_with_ops());
    EXPECT_TRUE(p->prefill_request(n).pre_rope_queries);
    prefill_layer(*p, st, cache);
    const auto want = reference_keep(q, k, v, heads, d, sinks, future, theta, std::min(budget, n));
    for (int c = 0; c < kv; ++c) {
      const V got = positions(cache, 0, c);
      EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want[c]) << "head " << c;
      for (int s = 0; s < sinks; ++s) EXPECT_EQ(got[s], s);
    }
  }
  // Without the queries the policy says so.
  KvCache cache({1, kv, d}, n);
  for (int j = 0; j < n; ++j) {
    for (int c = 0; c < kv; ++c) cache.append(0, c, k[c][j].data(), v[c][j].data(), j);
  }
  LayerStats bare;
  bare.n_new = n;
  bare.num_heads = heads;
  auto p = make_policy(config("expected_attention", 6, shape));
  EXPECT_THROW(prefill_layer(*p, bare, cache), Error);
  EXPECT_THROW(make_policy(config("expected_attention", 6, shape, {{"use_vnorm", "maybe"}})),
               Error);
}

}  // namespace
}  // namespace kvb::policies
