// Statistics for policy comparisons (issue "Query and report"): the mean with a Student-t 95%
// confidence interval, and the paired bootstrap of the difference between two policies on the
// same samples (percentile CI, two-sided p-value). Pure functions; tested against numpy/scipy
// values (scripts/make_stats_fixture.py).
#pragma once

#include <cstdint>
#include <vector>

namespace kvb::results {

struct MeanCI {
  double mean = 0, lo = 0, hi = 0;
  int n = 0;
};
// Student-t interval; n = 1 or zero variance gives lo = hi = mean. Empty input: n = 0, NaNs.
MeanCI mean_ci(const std::vector<double>& x, double level = 0.95);

// Quantile of Student's t with `dof` degrees of freedom (dof >= 1), p in (0, 1).
double student_t_quantile(double p, double dof);

struct PairedComparison {
  double mean_diff = 0;  // mean of (a[i] - b[i])
  double lo = 0, hi = 0;  // percentile bootstrap interval of the mean difference
  double p_value = 1;     // two-sided: 2 x the smaller tail of the bootstrap distribution at 0
  int n = 0;
};
// a, b: scores of two policies on the same samples, in the same order (equal sizes). The
// resampling is counter-based from `seed`, so results are reproducible. n < 2: the interval
// collapses to the difference and p = 1 (no evidence). All differences equal: the interval
// collapses; p = 1 when they are 0, else 0 (every resample lies on one side).
PairedComparison paired_bootstrap(const std::vector<double>& a, const std::vector<double>& b,
                                  int resamples = 10000, uint64_t seed = 0, double level = 0.95);

}  // namespace kvb::results
