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

// The 95% interval of a mean score as every table, plot and query of kvbench shows it (issue 34:
// one convention, inside the metric's range):
//  - scores that are all 0 or 1 (recall of a needle, exact match, accuracy): the Wilson score
//    interval (Wilson 1927), which lies in [0, 1] and stays informative at 0 or n of n;
//  - any other scores: the percentile bootstrap of the mean (`resamples` resamples, counter-based
//    from `seed`, as paired_bootstrap), which lies within [min, max] of the scores and so within
//    whatever range the metric has (a Student-t interval does not: it left [0, 1]).
// n = 1 of a non-binary score, or scores all equal and non-binary: lo = hi = mean. Empty: NaNs.
// kScoreCiMethod says this in words for reports.
MeanCI score_ci(const std::vector<double>& x, int resamples = 10000, uint64_t seed = 0,
                double level = 0.95);
inline constexpr char kScoreCiMethod[] =
    "95% intervals: Wilson score interval where every score is 0 or 1, otherwise the percentile "
    "bootstrap of the mean (10,000 resamples, seed 0); both stay inside the metric's range";
// The mean of several groups' means (a paper table's average over tasks) with the percentile
// bootstrap that resamples within each group independently (a stratified bootstrap; counter-based
// from `seed`). Every group must be non-empty. Within [min, max] of the group means' ranges.
MeanCI mean_of_means_ci(const std::vector<std::vector<double>>& groups, int resamples = 10000,
                        uint64_t seed = 0, double level = 0.95);
// The Wilson score interval of `successes` of `n` at `level` (n >= 1).
MeanCI wilson_ci(double successes, int n, double level = 0.95);

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
