// results/stats against numpy/scipy (scripts/make_stats_fixture.py) and degenerate cases.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <fstream>

#include "results/analysis.h"
#include "results/stats.h"

namespace kvb::results {
namespace {

nlohmann::json fixture() {
  std::ifstream in(std::string(KVB_FIXTURES_DIR) + "/stats/stats.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

TEST(Stats, StudentTQuantilesMatchScipy) {
  for (const auto& c : fixture()["t_quantiles"]) {
    EXPECT_NEAR(student_t_quantile(c["p"], c["dof"]), c["t"].get<double>(), 1e-6) << c.dump();
  }
}

TEST(Stats, MeanCiMatchesScipy) {
  for (const auto& c : fixture()["mean_ci"]) {
    const MeanCI r = mean_ci(c["x"].get<std::vector<double>>());
    EXPECT_NEAR(r.mean, c["mean"].get<double>(), 1e-12);
    EXPECT_NEAR(r.lo, c["lo"].get<double>(), 1e-7);
    EXPECT_NEAR(r.hi, c["hi"].get<double>(), 1e-7);
  }
}

TEST(Stats, PairedBootstrapMatchesNumpyWithinMonteCarloError) {
  for (const auto& c : fixture()["paired"]) {
    const auto a = c["a"].get<std::vector<double>>(), b = c["b"].get<std::vector<double>>();
    const PairedComparison r = paired_bootstrap(a, b, 40000, 7);
    const double tol = c["tolerance"].get<double>();
    EXPECT_NEAR(r.mean_diff, c["mean_diff"].get<double>(), 1e-12);
    EXPECT_NEAR(r.lo, c["lo"].get<double>(), tol) << c["lo"];
    EXPECT_NEAR(r.hi, c["hi"].get<double>(), tol) << c["hi"];
    EXPECT_NEAR(r.p_value, c["p_value"].get<double>(), 0.01);
    // Reproducible from the seed.
    const PairedComparison again = paired_bootstrap(a, b, 40000, 7);
    EXPECT_EQ(r.lo, again.lo);
    EXPECT_EQ(r.p_value, again.p_value);
  }
}

TEST(Stats, DegenerateCases) {
  const MeanCI one = mean_ci({0.7});
  EXPECT_EQ(one.n, 1);
  EXPECT_DOUBLE_EQ(one.lo, 0.7);
  EXPECT_DOUBLE_EQ(one.hi, 0.7);
  const MeanCI equal = mean_ci({2, 2, 2});
  EXPECT_DOUBLE_EQ(equal.lo, 2);
  EXPECT_DOUBLE_EQ(equal.hi, 2);
  EXPECT_TRUE(std::isnan(mean_ci({}).mean));
  const PairedComparison p1 = paired_bootstrap({1.0}, {0.0});
  EXPECT_DOUBLE_EQ(p1.mean_diff, 1.0);
  EXPECT_DOUBLE_EQ(p1.p_value, 1.0);
  const PairedComparison same = paired_bootstrap({1, 0, 1}, {1, 0, 1});
  EXPECT_DOUBLE_EQ(same.mean_diff, 0);
  EXPECT_DOUBLE_EQ(same.lo, 0);
  EXPECT_DOUBLE_EQ(same.hi, 0);
  EXPECT_DOUBLE_EQ(same.p_value, 1);
  const PairedComparison shift = paired_bootstrap({2, 3, 4}, {1, 2, 3});  // all differences 1
  EXPECT_DOUBLE_EQ(shift.lo, 1);
  EXPECT_DOUBLE_EQ(shift.hi, 1);
  EXPECT_DOUBLE_EQ(shift.p_value, 0);
}

// Issue 34: a p-value the bootstrap cannot resolve prints as a bound, never as 0.0000.
TEST(Stats, PValuesBelowTheBootstrapsResolutionPrintAsABound) {
  EXPECT_EQ(p_value_text(0), "< 1e-4");
  EXPECT_EQ(p_value_text(0, 1000), "< 1e-3");
  EXPECT_EQ(p_value_text(0.0002), "0.0002");  // 2 of 10,000 resamples: resolved
  EXPECT_EQ(p_value_text(0.665), "0.6650");
  EXPECT_EQ(p_value_text(1), "1.0000");
  EXPECT_EQ(p_value_text(NAN), "");
  // A constant nonzero shift over 10,000 resamples: no resample reaches 0.
  EXPECT_EQ(p_value_text(paired_bootstrap({2, 3, 4, 5}, {1, 2, 3, 3.5}).p_value), "< 1e-4");
}

// Wilson's interval against values published for it (Newcombe 1998, Table I: 0/10 and 10/10;
// statsmodels' proportion_confint(method="wilson") gives the same to 4 decimals for 3/10, 15/148).
TEST(Stats, WilsonIntervalMatchesPublishedValues) {
  struct Case { double k; int n; double lo, hi; };
  for (const Case& c : std::vector<Case>{{0, 10, 0.0, 0.2775},
                                         {10, 10, 0.7225, 1.0},
                                         {3, 10, 0.1078, 0.6032},
                                         {15, 148, 0.0624, 0.1605}}) {
    const MeanCI w = wilson_ci(c.k, c.n);
    EXPECT_NEAR(w.lo, c.lo, 5e-5) << c.k << "/" << c.n;
    EXPECT_NEAR(w.hi, c.hi, 5e-5) << c.k << "/" << c.n;
    EXPECT_DOUBLE_EQ(w.mean, c.k / c.n);
  }
}

// 0/1 scores take Wilson's interval; others the percentile bootstrap, whose bounds are means of
// resamples: for 3 x 1/7 and 3 x 0 the resampled mean is k/42, k ~ Binomial(6, 1/2), whose
// 2.5% and 97.5% points are k = 1 and k = 5 (P(k = 0) = P(k = 6) = 1/64 < 2.5% < 7/64).
TEST(Stats, ScoreIntervalIsWilsonForZeroOneScoresElseTheBootstrap) {
  const MeanCI binary = score_ci({1, 0, 0, 1, 0, 0, 0, 0, 0, 0});
  const MeanCI w = wilson_ci(2, 10);
  EXPECT_DOUBLE_EQ(binary.lo, w.lo);
  EXPECT_DOUBLE_EQ(binary.hi, w.hi);
  const MeanCI none = score_ci({0, 0, 0});  // 0 of 3: still an interval, not [0, 0]
  EXPECT_EQ(none.lo, 0);
  EXPECT_GT(none.hi, 0.4);
  const double s = 1.0 / 7;
  const MeanCI b = score_ci({s, s, s, 0, 0, 0});
  EXPECT_NEAR(b.mean, 1.0 / 14, 1e-15);
  EXPECT_NEAR(b.lo, 1.0 / 42, 1e-15);
  EXPECT_NEAR(b.hi, 5.0 / 42, 1e-15);
  const MeanCI flat = score_ci({0.5, 0.5});
  EXPECT_EQ(flat.lo, 0.5);
  EXPECT_EQ(flat.hi, 0.5);
  EXPECT_TRUE(std::isnan(score_ci({}).mean));
}

// Property (issue 34): on scores bounded by [0, 1], every interval stays inside [0, 1] and holds
// the mean; on any scores, inside [min, max] unless they are 0/1. Random samples of many shapes.
TEST(Stats, ScoreIntervalsStayInsideTheMetricsRange) {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<int> size(1, 40), shape(0, 3);
  std::uniform_real_distribution<double> unit(0, 1);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<double> x(size(rng));
    const int kind = shape(rng);
    for (double& v : x) {
      const double u = unit(rng);
      v = kind == 0 ? (u < 0.9) : kind == 1 ? u * u * u : kind == 2 ? std::round(u * 7) / 7 : u;
    }
    const MeanCI c = score_ci(x, 2000, trial);
    EXPECT_GE(c.lo, 0) << trial;
    EXPECT_LE(c.hi, 1) << trial;
    EXPECT_LE(c.lo, c.mean + 1e-12) << trial;
    EXPECT_GE(c.hi, c.mean - 1e-12) << trial;
    const bool binary = std::all_of(x.begin(), x.end(), [](double v) { return v == 0 || v == 1; });
    if (!binary) {
      EXPECT_GE(c.lo, *std::min_element(x.begin(), x.end()) - 1e-12) << trial;  // sums round
      EXPECT_LE(c.hi, *std::max_element(x.begin(), x.end()) + 1e-12) << trial;
    }
  }
  // A Student-t interval leaves [0, 1] on the same kind of data (why it is not used).
  const MeanCI t = mean_ci({1.0 / 7, 1.0 / 7, 1.0 / 7, 0, 0, 0});
  EXPECT_LT(t.lo, 0);
}

}  // namespace
}  // namespace kvb::results
