// results/stats against numpy/scipy (scripts/make_stats_fixture.py) and degenerate cases.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

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

}  // namespace
}  // namespace kvb::results
