// Tests SubGen (POLICIES.md `subgen`, `subgen_kcenter`): the estimator's error trend on
// synthetic clusterable keys (in t and in s) and its memory formula; hand-computed estimator
// values; the reservoir and cluster-sample probabilities; the `subgen` policy through attend()
// (exact below the budget, sketch above it, GQA, budget validation, determinism); and
// `subgen_kcenter`'s keep-set, decode append vs slide, and the cluster-size logit bias.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "kernels/ops/policy_ops.h"

namespace kvb {
namespace {

namespace cpu = kernels::cpu;
using Opts = std::map<std::string, std::string>;

// Seeded, counter-based standard normal (Box-Muller on two counter_uniform draws).
double gauss(uint64_t seed, uint64_t stream, uint64_t i) {
  const double u1 = 1.0 - cpu::counter_uniform(seed, 0, static_cast<uint32_t>(stream), i, 0);
  const double u2 = cpu::counter_uniform(seed, 0, static_cast<uint32_t>(stream), i, 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Exact softmax attention in double: keys, values [n, d].
std::vector<double> exact_attention(const float* q, const std::vector<float>& keys,
                                    const std::vector<float>& values, int n, int d, float scale) {
  std::vector<double> l(n);
  double c = -INFINITY;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int x = 0; x < d; ++x) s += static_cast<double>(q[x]) * keys[j * d + x];
    l[j] = s * scale;
    c = std::max(c, l[j]);
  }
  std::vector<double> out(d, 0.0);
  double sum = 0;
  for (int j = 0; j < n; ++j) {
    const double e = std::exp(l[j] - c);
    sum += e;
    for (int x = 0; x < d; ++x) out[x] += e * values[j * d + x];
  }
  for (double& o : out) o /= sum;
  return out;
}

// ---- (a) error trend on clusterable keys ----------------------------------------------------

// 8 well-separated Gaussian clusters in 16-D (centre c = 4 e_c, sigma 0.3 per coordinate:
// members lie within ~2.5 of their first key, other clusters' keys ~5.7 away), values
// N(1, 1) per coordinate, 2000 tokens in random cluster order, 20 queries N(0, 1).
struct Synthetic {
  static constexpr int kDim = 16, kTokens = 2000, kQueries = 20, kClusters = 8;
  std::vector<float> keys, values, queries;
  explicit Synthetic(uint64_t seed) {
    keys.resize(kTokens * kDim);
    values.resize(kTokens * kDim);
    for (int j = 0; j < kTokens; ++j) {
      const int c = static_cast<int>(cpu::counter_uniform(seed, 1, 0, j, 0) * kClusters);
      for (int x = 0; x < kDim; ++x) {
        keys[j * kDim + x] = (x == c ? 4.0f : 0.0f) + 0.3f * gauss(seed, 2, j * kDim + x);
        values[j * kDim + x] = 1.0f + gauss(seed, 3, j * kDim + x);
      }
    }
    queries.resize(kQueries * kDim);
    for (size_t i = 0; i < queries.size(); ++i) queries[i] = gauss(seed, 4, i);
  }
};

struct TrendPoint {
  double mean_error = 0;
  double memory = 0;
  int clusters = 0;
};

// Mean over seeds and queries of |estimate - exact| / |exact|.
TrendPoint estimator_error(int s, int t, const std::vector<uint64_t>& seeds) {
  const int d = Synthetic::kDim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  TrendPoint tp;
  int count = 0;
  for (uint64_t seed : seeds) {
    const Synthetic syn(seed);
    cpu::SubgenParams p;
    p.head_dim = d;
    p.s = s;
    p.t = t;
    p.max_clusters = 64;
    p.delta2 = 3.2 * 3.2;
    cpu::SubgenSketch sk;
    for (int j = 0; j < Synthetic::kTokens; ++j) {
      cpu::subgen_absorb(p, {seed * 7 + 1, 0, 0, static_cast<uint64_t>(j)}, &syn.keys[j * d],
                         &syn.values[j * d], sk);
    }
    EXPECT_EQ(sk.clusters(), Synthetic::kClusters) << "seed " << seed;
    EXPECT_EQ(sk.forced, 0);
    tp.clusters = sk.clusters();
    tp.memory = cpu::subgen_memory_tokens(sk, s, t, 0);
    for (int i = 0; i < Synthetic::kQueries; ++i) {
      const float* q = &syn.queries[i * d];
      const std::vector<double> ref =
          exact_attention(q, syn.keys, syn.values, Synthetic::kTokens, d, scale);
      std::vector<float> out(d);
      cpu::SubgenQueryArgs a;
      a.q = q;
      a.head_dim = d;
      a.scale = scale;
      a.sketch = cpu::subgen_view(sk, p);
      a.out = out.data();
      cpu::subgen_query(a);
      double err = 0, norm = 0;
      for (int x = 0; x < d; ++x) {
        err += (out[x] - ref[x]) * (out[x] - ref[x]);
        norm += ref[x] * ref[x];
      }
      tp.mean_error += std::sqrt(err / norm);
      ++count;
    }
  }
  tp.mean_error /= count;
  return tp;
}

const std::vector<uint64_t> kSeeds = {1, 2, 3};

TEST(SubgenEstimator, ErrorFallsAsTGrows) {
  // s large (4096) so that the normalizer's sampling error, the one t controls, dominates.
  std::vector<double> err;
  for (int t : {1, 4, 16}) {
    const TrendPoint tp = estimator_error(4096, t, kSeeds);
    std::printf("[ trend ] s = 4096, t = %2d: mean relative error %.4f, memory %.1f tokens\n", t,
                tp.mean_error, tp.memory);
    EXPECT_DOUBLE_EQ(tp.memory, 4096 + tp.clusters * (t + 1) / 2.0);
    err.push_back(tp.mean_error);
  }
  EXPECT_LT(err[1], 0.8 * err[0]);
  EXPECT_LT(err[2], 0.8 * err[1]);
}

TEST(SubgenEstimator, ErrorFallsAsSGrows) {
  // t large (64) so that the numerator's sampling error, the one s controls, dominates.
  std::vector<double> err;
  for (int s : {8, 32, 128}) {
    const TrendPoint tp = estimator_error(s, 64, kSeeds);
    std::printf("[ trend ] t = 64, s = %3d: mean relative error %.4f, memory %.1f tokens\n", s,
                tp.mean_error, tp.memory);
    EXPECT_DOUBLE_EQ(tp.memory, s + tp.clusters * 65 / 2.0);
    err.push_back(tp.mean_error);
  }
  EXPECT_LT(err[1], 0.8 * err[0]);
  EXPECT_LT(err[2], 0.8 * err[1]);
}

TEST(SubgenEstimator, MemoryFormulaAndAutoDelta) {
  const Synthetic syn(5);
  const int d = Synthetic::kDim;
  // Budget 100, s 25, sinks 2, recent 3, t 4: (100 - 30) * 2 / 5 = 28 clusters fit.
  EXPECT_EQ(cpu::subgen_max_clusters(100, 25, 4, 2, 3), 28);
  EXPECT_EQ(cpu::subgen_max_clusters(10, 8, 4, 0, 0), 0);  // 2 tokens < one cluster (2.5)
  for (int max_clusters : {3, 8, 28}) {
    const double delta2 =
        cpu::subgen_auto_delta2(syn.keys.data(), Synthetic::kTokens, d, d, max_clusters);
    cpu::SubgenParams p{d, 25, 4, max_clusters, delta2};
    cpu::SubgenSketch sk;
    for (int j = 0; j < Synthetic::kTokens; ++j) {
      cpu::subgen_absorb(p, {9, 0, 0, static_cast<uint64_t>(j)}, &syn.keys[j * d],
                         &syn.values[j * d], sk);
    }
    SCOPED_TRACE(max_clusters);
    EXPECT_LE(sk.clusters(), max_clusters);
    EXPECT_EQ(sk.forced, 0) << "auto delta fits the keys it was chosen on without the cap";
    EXPECT_EQ(sk.clusters(), cpu::subgen_count_clusters(syn.keys.data(), Synthetic::kTokens, d, d,
                                                        delta2, 1 << 20));
    EXPECT_LE(cpu::subgen_memory_tokens(sk, 25, 4, 5), 100.0);
    EXPECT_EQ(cpu::subgen_sketch_bytes(sk),
              (2 * 25 + sk.clusters() * 5) * d * sizeof(float) + sk.clusters() * 8 + 16);
  }
  // 8 separated clusters: a budget for 8 finds a delta that recovers exactly them.
  const double d8 = cpu::subgen_auto_delta2(syn.keys.data(), Synthetic::kTokens, d, d, 8);
  EXPECT_EQ(cpu::subgen_count_clusters(syn.keys.data(), Synthetic::kTokens, d, d, d8, 100), 8);
  // Room for every distinct key: delta 0.
  EXPECT_EQ(cpu::subgen_auto_delta2(syn.keys.data(), 50, d, d, 50), 0.0);
}

// The count decides a key by "some representative within delta2", summing a distance only until
// it passes delta2; subgen_absorb's rule is "the nearest is within delta2". They must agree
// exactly, at thresholds that are themselves distances of the data (where `<=` bites), in
// dimensions that are and are not multiples of the 8-coordinate check, and with non-finite keys
// (where the count falls back to the nearest). And `delta: auto` must pick the radius the
// nearest-rule bisection (written out here) picks.
TEST(SubgenEstimator, CountByAnyWithinEqualsCountByNearest) {
  for (const int d : {5, 8, 16, 64, 67}) {
    for (const uint64_t seed : {3u, 4u}) {
      SCOPED_TRACE(testing::Message() << "d " << d << " seed " << seed);
      const int n = 600;
      std::vector<float> keys(static_cast<size_t>(n) * d);
      for (int j = 0; j < n; ++j) {
        const int c = static_cast<int>(cpu::counter_uniform(seed, 1, 0, j, 0) * 12);
        for (int x = 0; x < d; ++x) {
          keys[static_cast<size_t>(j) * d + x] =
              (x % 12 == c ? 3.0f : 0.0f) + 0.5f * gauss(seed, 2, j * d + x);
        }
      }
      // Thresholds: exact squared distances between keys (ties at the boundary), and between;
      // summed as the kernel sums them (an fma per coordinate), so they are its distances.
      std::vector<double> deltas = {0.0, 1e300};
      for (int j = 1; j < 40; ++j) {
        double s = 0;
        for (int x = 0; x < d; ++x) {
          const double diff = static_cast<double>(keys[static_cast<size_t>(j) * d + x]) -
                              static_cast<double>(keys[static_cast<size_t>(j - 1) * d + x]);
          s = std::fma(diff, diff, s);
        }
        deltas.push_back(s);
        deltas.push_back(s * 0.5);
        deltas.push_back(std::nextafter(s, 0.0));
      }
      for (const double delta2 : deltas) {
        for (const int limit : {5, 60, 1 << 20}) {
          const int want =
              cpu::subgen_count_clusters_by_nearest(keys.data(), n, d, d, delta2, limit);
          ASSERT_EQ(cpu::subgen_count_clusters(keys.data(), n, d, d, delta2, limit), want)
              << "delta2 " << delta2 << " limit " << limit;
          ASSERT_EQ(cpu::subgen_count_clusters_scalar(keys.data(), n, d, d, delta2, limit), want)
              << "delta2 " << delta2 << " limit " << limit << " (one representative at a time)";
        }
      }
      for (const int max_clusters : {4, 12, 50, 200}) {
        double want = 0;
        if (cpu::subgen_count_clusters_by_nearest(keys.data(), n, d, d, 0.0, max_clusters) >
            max_clusters) {
          double lo = 0, hi = 0;
          for (int j = 1; j < n; ++j) {
            double s = 0;
            for (int x = 0; x < d; ++x) {
              const double diff = static_cast<double>(keys[static_cast<size_t>(j) * d + x]) -
                                  static_cast<double>(keys[x]);
              s = std::fma(diff, diff, s);
            }
            hi = std::max(hi, s);
          }
          for (int it = 0; it < 24; ++it) {
            const double mid = 0.5 * (lo + hi);
            (cpu::subgen_count_clusters_by_nearest(keys.data(), n, d, d, mid, max_clusters) <=
                     max_clusters
                 ? hi
                 : lo) = mid;
          }
          want = hi;
        }
        EXPECT_EQ(cpu::subgen_auto_delta2(keys.data(), n, d, d, max_clusters), want)
            << "max_clusters " << max_clusters;
      }
      // A NaN and an infinity among the keys: the nearest rule, both ways.
      keys[static_cast<size_t>(7) * d] = NAN;
      keys[static_cast<size_t>(20) * d + 1] = INFINITY;
      for (const double delta2 : {0.5, 5.0, 50.0}) {
        EXPECT_EQ(cpu::subgen_count_clusters(keys.data(), n, d, d, delta2, 1 << 20),
                  cpu::subgen_count_clusters_by_nearest(keys.data(), n, d, d, delta2, 1 << 20));
      }
    }
  }
}

TEST(SubgenEstimator, CapForcesJoinsIntoTheNearestCluster) {
  // Keys 0, 10, 20, 30 on a line, delta 1, room for 2 clusters: 20 joins 10's, 30 joins 10's.
  cpu::SubgenParams p{1, 2, 2, 2, 1.0};
  cpu::SubgenSketch sk;
  const float keys[] = {0, 10, 20, 30}, v[] = {1};
  for (int j = 0; j < 4; ++j)
    cpu::subgen_absorb(p, {1, 0, 0, static_cast<uint64_t>(j)}, &keys[j], v, sk);
  EXPECT_EQ(sk.clusters(), 2);
  EXPECT_EQ(sk.forced, 2);
  EXPECT_EQ(sk.counts, (std::vector<int64_t>{1, 3}));
  EXPECT_DOUBLE_EQ(sk.mu, 4.0);
}

// ---- (b) hand-computed cases ---------------------------------------------------------------

TEST(SubgenEstimator, HandComputedView) {
  // d = 2, scale 1, q = (1, 1).
  // M: (k (1,0), v (2,0)), (k (0,1), v (0,1)); mu = 10; s = 2.
  //   z = 10/(2*4) e^1 (2,0) + 10/(2*1) e^1 (0,1) = (2.5 e, 5 e)
  // Clusters (t = 2): n = 3, samples (1,0), (0,0): 3/2 (e + 1); n = 1, samples (0,2) twice:
  //   1/2 * 2 e^2 = e^2.
  // Exact: k (0,0), v (1,1), bias ln 2: weight 2 -> z += (2, 2), tau += 2.
  const float mk[] = {1, 0, 0, 1}, mv[] = {2, 0, 0, 1};
  const float samples[] = {1, 0, 0, 0, 0, 2, 0, 2};
  const int64_t counts[] = {3, 1};
  const float ek[] = {0, 0}, ev[] = {1, 1}, bias[] = {std::log(2.0f)};
  const float q[] = {1, 1};
  float out[2];
  cpu::SubgenQueryArgs a;
  a.q = q;
  a.head_dim = 2;
  a.scale = 1.0f;
  a.sketch = {mk, mv, 2, 10.0, samples, counts, 2, 2};
  a.exact_keys = ek;
  a.exact_values = ev;
  a.exact_bias = bias;
  a.n_exact = 1;
  a.out = out;
  cpu::subgen_query(a);
  const double e = std::exp(1.0);
  const double tau = 1.5 * (e + 1) + e * e + 2;
  EXPECT_NEAR(out[0], (2.5 * e + 2) / tau, 1e-6);
  EXPECT_NEAR(out[1], (5 * e + 2) / tau, 1e-6);
  // Without the bias the exact token weighs 1.
  a.exact_bias = nullptr;
  cpu::subgen_query(a);
  EXPECT_NEAR(out[0], (2.5 * e + 1) / (tau - 1), 1e-6);
}

TEST(SubgenEstimator, OneClusterConstantValueIsExact) {
  // Every key equal (one cluster, all samples equal) and every value equal: z / tau = v for any
  // draw of the reservoir, with and without exact tokens that carry the same value.
  const int d = 4;
  cpu::SubgenParams p{d, 3, 2, 4, 100.0};
  cpu::SubgenSketch sk;
  const float k[] = {0.5f, -1.0f, 2.0f, 0.25f}, v[] = {1.5f, -2.0f, 0.5f, 3.0f};
  for (int j = 0; j < 10; ++j) cpu::subgen_absorb(p, {3, 1, 2, static_cast<uint64_t>(j)}, k, v, sk);
  EXPECT_EQ(sk.clusters(), 1);
  EXPECT_EQ(sk.counts[0], 10);
  const float q[] = {1.0f, 0.3f, -0.7f, 2.0f};
  float out[d];
  cpu::SubgenQueryArgs a;
  a.q = q;
  a.head_dim = d;
  a.scale = 0.5f;
  a.sketch = cpu::subgen_view(sk, p);
  a.out = out;
  cpu::subgen_query(a);
  for (int x = 0; x < d; ++x) EXPECT_NEAR(out[x], v[x], 1e-5 * std::abs(v[x]));
  const float ek[] = {3, 3, 3, 3, -1, 0, 1, 0},
              ev[] = {1.5f, -2.0f, 0.5f, 3.0f, 1.5f, -2.0f, 0.5f, 3.0f};
  a.exact_keys = ek;
  a.exact_values = ev;
  a.n_exact = 2;
  cpu::subgen_query(a);
  for (int x = 0; x < d; ++x) EXPECT_NEAR(out[x], v[x], 1e-5 * std::abs(v[x]));
}

TEST(SubgenEstimator, ZeroValuesDoNotPoisonTheSketch) {
  cpu::SubgenParams p{2, 4, 2, 4, 100.0};
  cpu::SubgenSketch sk;
  const float k[] = {1, 0}, zero[] = {0, 0}, v[] = {0, 2};
  cpu::subgen_absorb(p, {1, 0, 0, 0}, k, zero, sk);  // mu = 0: p taken as 1, weight 0
  cpu::subgen_absorb(p, {1, 0, 0, 1}, k, v, sk);     // p = 4 / 4 = 1: every slot replaced
  float out[2];
  cpu::SubgenQueryArgs a;
  const float q[] = {0.5f, 0.5f};
  a.q = q;
  a.head_dim = 2;
  a.scale = 1.0f;
  a.sketch = cpu::subgen_view(sk, p);
  a.out = out;
  cpu::subgen_query(a);
  // Truth: (0 + e^{.5} (0,2)) / (2 e^{.5}) = (0, 1); z = mu/(s*4) * 4 samples e^.5 (0,2) = 4e^.5.
  EXPECT_NEAR(out[0], 0.0f, 1e-6);
  EXPECT_NEAR(out[1], 1.0f, 1e-6);
}

TEST(SubgenEstimator, ReservoirProbabilities) {
  // Six tokens with |v|^2 = 1..6 streamed into s = 6000 independent slots: each slot holds token
  // i with probability i / 21 (Lemma 1). One cluster (huge delta) with t = 6000 samples: each
  // holds token i with probability 1/6. Binomial sd <= 0.0065; tolerance 0.025.
  for (uint64_t seed : {11u, 12u}) {
    const int s = 6000, t = 6000;
    cpu::SubgenParams p{1, s, t, 4, 1e9};
    cpu::SubgenSketch sk;
    for (int i = 1; i <= 6; ++i) {
      const float k = static_cast<float>(i), v = std::sqrt(static_cast<float>(i));
      cpu::subgen_absorb(p, {seed, 0, 0, static_cast<uint64_t>(i)}, &k, &v, sk);
    }
    EXPECT_NEAR(sk.mu, 21.0, 1e-5);
    ASSERT_EQ(sk.clusters(), 1);
    std::vector<int> in_m(7, 0), in_c(7, 0);
    for (int j = 0; j < s; ++j) ++in_m[static_cast<int>(sk.m_keys[j])];
    for (int j = 0; j < t; ++j) ++in_c[static_cast<int>(sk.samples[j])];
    for (int i = 1; i <= 6; ++i) {
      SCOPED_TRACE(i);
      EXPECT_NEAR(in_m[i] / static_cast<double>(s), i / 21.0, 0.025);
      EXPECT_NEAR(in_c[i] / static_cast<double>(t), 1.0 / 6.0, 0.025);
    }
  }
}

TEST(SubgenEstimator, CounterUniformIsAFunctionOfTheCounter) {
  EXPECT_EQ(cpu::counter_uniform(1, 2, 3, 4, 5), cpu::counter_uniform(1, 2, 3, 4, 5));
  EXPECT_NE(cpu::counter_uniform(1, 2, 3, 4, 5), cpu::counter_uniform(1, 2, 3, 4, 6));
  EXPECT_NE(cpu::counter_uniform(1, 2, 3, 4, 5), cpu::counter_uniform(1, 3, 2, 4, 5));
  double mean = 0;
  for (int i = 0; i < 10000; ++i) mean += cpu::counter_uniform(7, 0, 0, i, 0);
  EXPECT_NEAR(mean / 10000, 0.5, 0.01);
}

// subgen_distance_fuses, the rounding switch of the CUDA absorb (kernels/cuda/subgen_sketch.h),
// says how the squared distances round: keys whose distance is 1 + 2^-52 when each
// `s += d * d` is fused and exactly 1 when it is not make two clusters at delta^2 = 1 in the
// first case and one in the second. The distances fuse on every build and path (an explicit
// fma: the compiler's contraction differed between loops under -mtune=znver*, issue 31), by
// each rule of the count: the active path's, one representative at a time, and the nearest.
TEST(SubgenEstimator, DistanceFusionProbeMatchesTheClustering) {
  const float keys[2][5] = {{0.0f, 0.0f, 0.0f, 0.0f, 0x1.0p-30f},
                            {0x1.0p-15f, 0x1.0p-15f, 0x1.0p-27f, 0x1.0p-27f, 1.0f}};
  EXPECT_TRUE(cpu::subgen_distance_fuses());
  EXPECT_EQ(cpu::subgen_count_clusters(&keys[0][0], 2, 5, 5, 1.0, 4), 2);
  EXPECT_EQ(cpu::subgen_count_clusters_scalar(&keys[0][0], 2, 5, 5, 1.0, 4), 2);
  EXPECT_EQ(cpu::subgen_count_clusters_by_nearest(&keys[0][0], 2, 5, 5, 1.0, 4), 2);
  // The same on the vector path's blocks of 4 (representatives 0-3, then the key at 2^-52 past
  // delta^2 from the last): 5 clusters, not 4.
  std::vector<float> five(5 * 5, 0.0f);
  for (int r = 0; r < 4; ++r) five[r * 5 + 0] = 10.0f * static_cast<float>(r + 1);
  for (int x = 0; x < 5; ++x) {
    five[3 * 5 + x] = keys[0][x] + (x == 0 ? 40.0f : 0.0f);
    five[4 * 5 + x] = keys[1][x] + (x == 0 ? 40.0f : 0.0f);
  }
  EXPECT_EQ(cpu::subgen_count_clusters(five.data(), 5, 5, 5, 1.0, 10), 5);
  EXPECT_EQ(cpu::subgen_count_clusters_by_nearest(five.data(), 5, 5, 5, 1.0, 10), 5);
}

// The CPU instance of the ops table has no SubGen sketches (the CPU policy keeps its own): its
// device ops refuse, naming themselves.
TEST(SubgenPolicy, HostOpsHaveNoDeviceSketches) {
  policies::PolicyOps& ops = policies::cpu_policy_ops();
  cpu::SubgenParams p;
  p.head_dim = 4;
  p.s = p.t = p.max_clusters = 1;
  try {
    ops.make_subgen_state(p, 1, 1);
    FAIL() << "the host ops made SubGen device state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("make_subgen_state is a device op"), std::string::npos)
        << e.what();
  }
}

// ---- the policies through their hooks --------------------------------------------------------

struct Rig {
  int layers = 1, heads = 4, kv_heads = 2, dim = 8;
  std::unique_ptr<policies::Policy> policy;
  kernels::KvCache cache;
  uint64_t seed = 0;

  Rig(const std::string& name, int budget, std::map<std::string, std::string> opts,
      uint64_t data_seed = 21)
      : seed(data_seed) {
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = budget;
    pc.shape = {layers, heads, kv_heads, dim, 4096};
    pc.options = policies::PolicyOptions(std::move(opts));
    pc.seed = 5;
    policy = policies::make_policy(pc);
    cache = kernels::KvCache({layers, kv_heads, dim}, 8);
  }
  // Appends n tokens (keys, values from the data seed) to every head and returns their queries.
  std::vector<float> append(int n) {
    cache.reserve_extra(n);
    for (int i = 0; i < n; ++i) {
      const int32_t pos = cache.next_position() + i;
      for (int l = 0; l < layers; ++l) {
        for (int h = 0; h < kv_heads; ++h) {
          std::vector<float> k(dim), v(dim);
          for (int x = 0; x < dim; ++x) {
            const uint64_t c = ((static_cast<uint64_t>(pos) * 8 + l) * 8 + h) * 64 + x;
            k[x] = gauss(seed, 10, c);
            v[x] = gauss(seed, 11, c);
          }
          cache.append(l, h, k.data(), v.data(), pos);
        }
      }
    }
    std::vector<float> q(static_cast<size_t>(n) * heads * dim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = gauss(seed, 12, cache.next_position() * 4096 + i);
    return q;
  }
  // One forward through layer 0 as the engine drives a policy that replaces attention.
  std::vector<float> attend(const std::vector<float>& q, int n, bool prefill) {
    std::vector<float> out(q.size());
    policies::AttendArgs a{0,        n,          heads,  dim, 1.0f / std::sqrt(float(dim)),
                           q.data(), out.data(), prefill};
    attend_layer(*policy, a, cache);
    cache.advance_position(n);
    return out;
  }
  std::vector<float> exact(const std::vector<float>& q, int n) {
    std::vector<float> out(q.size());
    cpu::attention({out.data(), q.data(), cache.layer(0), n, heads, 1.0f / std::sqrt(float(dim))});
    return out;
  }
};

TEST(SubgenPolicy, RegisteredAndValidated) {
  ASSERT_NE(policies::find_policy("subgen"), nullptr);
  ASSERT_NE(policies::find_policy("subgen_kcenter"), nullptr);
  try {
    Rig r("subgen", 16, {{"s", "8"}, {"sinks", "4"}, {"recent", "4"}});
    FAIL() << "s + sinks + recent = budget accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    const std::string m = e.what();
    EXPECT_NE(m.find("s (8) + sinks (4) + recent (4) = 16 must be < kv_budget (16)"),
              std::string::npos)
        << m;
  }
  EXPECT_THROW(Rig("subgen", 16, {{"s", "14"}}), Error);  // 2 tokens: no room for 1 cluster
  EXPECT_THROW(Rig("subgen", 3, {}), Error);              // s = floor(3/4) = 0
  EXPECT_THROW(Rig("subgen", 16, {{"delta", "-1"}}), Error);
  EXPECT_NO_THROW(Rig("subgen", 16, {{"delta", "2.5"}}));
}

TEST(SubgenPolicy, ExactWhileWithinBudget) {
  // Budget 64 > 40 + 10 tokens: never compressed, so every output equals cpu::attention's bits.
  Rig r("subgen", 64, {});
  std::vector<float> q = r.append(40);
  std::vector<float> ref = r.exact(q, 40);
  EXPECT_EQ(r.attend(q, 40, true), ref);
  for (int step = 0; step < 10; ++step) {
    q = r.append(1);
    ref = r.exact(q, 1);
    EXPECT_EQ(r.attend(q, 1, false), ref) << "step " << step;
  }
  EXPECT_EQ(r.cache.length(0, 0), 50);
  EXPECT_EQ(r.policy->state_bytes(), 0u);
}

std::vector<float> run_compressed(std::map<std::string, std::string> opts, size_t* state_bytes,
                                  std::vector<int>* lengths) {
  // Budget 24: s = 6, sinks 2, recent 3 -> 13 tokens for clusters -> 26 / 5 = 5 clusters.
  Rig r("subgen", 24, std::move(opts));
  std::vector<float> q = r.append(60);
  const std::vector<float> ref = r.exact(q, 60);
  std::vector<float> outs = r.attend(q, 60, true);
  EXPECT_EQ(outs, ref) << "the prompt's outputs are exact causal attention";
  lengths->push_back(r.cache.length(0, 0));
  for (int step = 0; step < 8; ++step) {
    q = r.append(1);
    const std::vector<float> o = r.attend(q, 1, false);
    for (float x : o) EXPECT_TRUE(std::isfinite(x));
    outs.insert(outs.end(), o.begin(), o.end());
    for (int h = 0; h < r.kv_heads; ++h) lengths->push_back(r.cache.length(0, h));
  }
  *state_bytes = r.policy->state_bytes();
  return outs;
}

TEST(SubgenPolicy, CompressesToSinksAndRecentAndIsDeterministic) {
  const std::map<std::string, std::string> opts = {{"sinks", "2"}, {"recent", "3"}};
  size_t bytes = 0, bytes2 = 0;
  std::vector<int> lengths, lengths2;
  const std::vector<float> a = run_compressed(opts, &bytes, &lengths);
  for (int len : lengths) EXPECT_EQ(len, 5);  // sinks + recent after prefill and every step
  // Per head at most s pairs + 5 clusters of t + 1 keys (budget - sinks - recent = 19 token
  // equivalents of 2 * dim floats), plus the counters (5 n_i, mu, absorbed).
  const size_t per_head = 19 * 2 * 8 * sizeof(float) + 5 * 8 + 16;
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, 2 * per_head);
  const std::vector<float> b = run_compressed(opts, &bytes2, &lengths2);
  EXPECT_EQ(a, b);
  EXPECT_EQ(bytes, bytes2);
}

TEST(SubgenPolicy, ConstantKeysAndValuesPerKvHeadAreExactThroughTheSketch) {
  // Every key and value of KV head 0 is one vector and of KV head 1 another: one cluster per
  // head with all samples equal, so whatever the reservoir draws, query heads 0, 1 (KV head 0)
  // must output head 0's value and 2, 3 (KV head 1) head 1's: the GQA mapping on the sketch path.
  Rig r("subgen", 16, {{"recent", "2"}});
  auto fill = [&](int n) {
    std::vector<float> q = r.append(n);
    kernels::LayerKvView v = r.cache.layer(0);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < r.cache.length(0, h); ++s) {
        for (int x = 0; x < r.dim; ++x) {
          v.key(h, s)[x] = 0.1f * (h + 1) * (x - 3);
          v.value(h, s)[x] = (h == 0 ? 1.0f : -1.0f) * (x + 1);
        }
      }
    }
    return q;
  };
  std::vector<float> q = fill(30);
  r.attend(q, 30, true);
  EXPECT_EQ(r.cache.length(0, 0), 2);
  for (int step = 0; step < 3; ++step) {
    q = fill(1);
    const std::vector<float> o = r.attend(q, 1, false);
    for (int h = 0; h < 4; ++h) {
      for (int x = 0; x < r.dim; ++x) {
        EXPECT_NEAR(o[h * r.dim + x], (h < 2 ? 1.0f : -1.0f) * (x + 1), 1e-4) << "head " << h;
      }
    }
  }
}

// subgen_kcenter on a line: keys (x, 0) with x = 0 1 2 10 11 20 | 30 31 32, budget 6, recent 3:
// k-center with k = 3 on the first six picks 0, 20, then 10 (test_kcenter's trace) ->
// slots {0, 3, 5} with cluster sizes {3, 2, 1}, plus the window {6, 7, 8}.
struct LineRig {
  std::unique_ptr<policies::Policy> policy;
  kernels::KvCache cache{{1, 1, 2}, 16};
  explicit LineRig(std::map<std::string, std::string> opts) {
    policies::PolicyConfig pc;
    pc.name = "subgen_kcenter";
    pc.kv_budget = 6;
    pc.shape = {1, 1, 1, 2, 4096};
    opts["recent"] = "3";
    pc.options = policies::PolicyOptions(std::move(opts));
    policy = policies::make_policy(pc);
  }
  int32_t next_pos = 0;  // appends do not advance the cache (attend() reads next_position)
  void add(float x) {
    const float k[] = {x, 0.0f}, v[] = {x / 10, 1.0f};
    cache.append(0, 0, k, v, next_pos++);
  }
  std::vector<int32_t> positions() {
    kernels::LayerKvView v = cache.layer(0);
    return {v.position(0), v.position(0) + cache.length(0, 0)};
  }
  void prefill_hook(int n) {
    policies::LayerStats st;
    st.layer = 0;
    st.n_new = n;
    st.num_heads = 1;
    prefill_layer(*policy, st, cache);
  }
  void decode_hook() {
    policies::LayerStats st;
    st.layer = 0;
    st.n_new = 1;
    st.num_heads = 1;
    decode_layer(*policy, st, cache);
  }
};

using P = std::vector<int32_t>;
const float kLine[] = {0, 1, 2, 10, 11, 20, 30, 31, 32};

TEST(SubgenKCenterPolicy, KeepsTheKCenterPicksAndTheRecentWindow) {
  LineRig r(Opts{});
  EXPECT_FALSE(r.policy->replaces_attention());
  for (float x : kLine) r.add(x);
  r.prefill_hook(9);
  EXPECT_EQ(r.positions(), (P{0, 3, 5, 6, 7, 8}));
}

TEST(SubgenKCenterPolicy, DecodeAppendGrowsAndSlideKeepsTheBudget) {
  LineRig app(Opts{{"decode", "append"}}), sl(Opts{{"decode", "slide"}});
  for (LineRig* r : {&app, &sl}) {
    for (float x : kLine) r->add(x);
    r->prefill_hook(9);
  }
  for (int step = 0; step < 3; ++step) {
    for (LineRig* r : {&app, &sl}) {
      r->add(40.0f + step);
      r->decode_hook();
    }
    EXPECT_EQ(app.cache.length(0, 0), 7 + step);
    EXPECT_EQ(sl.cache.length(0, 0), 6);
  }
  EXPECT_EQ(app.positions(), (P{0, 3, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(sl.positions(), (P{0, 3, 5, 9, 10, 11}));  // centres stay, the window slid
}

TEST(SubgenKCenterPolicy, PromptWithinBudgetIsKeptAndSlideProtectsThePrefix) {
  // 5 tokens <= budget 6: nothing compressed; the 2 tokens before the window act as centres.
  LineRig r(Opts{{"decode", "slide"}});
  for (int i = 0; i < 5; ++i) r.add(kLine[i]);
  r.prefill_hook(5);
  EXPECT_EQ(r.positions(), (P{0, 1, 2, 3, 4}));
  for (int step = 0; step < 3; ++step) {
    r.add(50.0f + step);
    r.decode_hook();
  }
  EXPECT_EQ(r.positions(), (P{0, 1, 4, 5, 6, 7}));
}

TEST(SubgenKCenterPolicy, ClusterSizeWeightsTheCentresLogits) {
  LineRig r(Opts{{"weight_by_cluster_size", "true"}, {"decode", "slide"}});
  ASSERT_TRUE(r.policy->replaces_attention());
  for (float x : kLine) r.add(x);
  // Prefill through attend: exact causal attention over the whole prompt, then compression.
  std::vector<float> q(9 * 2);
  for (int i = 0; i < 9; ++i) q[i * 2] = 0.05f * i, q[i * 2 + 1] = 0.5f;
  std::vector<float> ref(q.size()), out(q.size());
  cpu::attention({ref.data(), q.data(), r.cache.layer(0), 9, 1, 1.0f});
  attend_layer(*r.policy, {0, 9, 1, 2, 1.0f, q.data(), out.data(), true}, r.cache);
  r.cache.advance_position(9);
  EXPECT_EQ(out, ref);
  EXPECT_EQ(r.positions(), (P{0, 3, 5, 6, 7, 8}));
  // Decode: key 40; logits x * 0.1 (+ log size for centres of sizes 3, 2, 1), then the window
  // slides: position 6 leaves.
  r.add(40.0f);
  const float qd[] = {0.1f, 0.0f};
  float o[2];
  attend_layer(*r.policy, {0, 1, 1, 2, 1.0f, qd, o, false}, r.cache);
  r.cache.advance_position(1);
  const double xs[] = {0, 10, 20, 30, 31, 32, 40}, logs[] = {std::log(3.0), std::log(2.0)};
  double num0 = 0, num1 = 0, den = 0;
  for (int j = 0; j < 7; ++j) {
    const double w = std::exp(xs[j] * 0.1 + (j < 2 ? logs[j] : 0.0));
    num0 += w * xs[j] / 10;
    num1 += w;
    den += w;
  }
  EXPECT_NEAR(o[0], num0 / den, 1e-5);
  EXPECT_NEAR(o[1], num1 / den, 1e-6);
  EXPECT_EQ(r.positions(), (P{0, 3, 5, 7, 8, 9}));
}

}  // namespace
}  // namespace kvb
