// Mean CI (Student t via the regularized incomplete beta function) and the paired bootstrap.
#include "results/stats.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace kvb::results {

namespace {
// Continued fraction of the incomplete beta function (Lentz's method).
double beta_cf(double a, double b, double x) {
  const double tiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 300; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + aa * d;
    d = std::fabs(d) < tiny ? tiny : d;
    c = 1 + aa / c;
    c = std::fabs(c) < tiny ? tiny : c;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + aa * d;
    d = std::fabs(d) < tiny ? tiny : d;
    c = 1 + aa / c;
    c = std::fabs(c) < tiny ? tiny : c;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return h;
}

// Regularized incomplete beta I_x(a, b).
double inc_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double lbt = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
                     b * std::log(1 - x);
  if (x < (a + 1) / (a + b + 2)) return std::exp(lbt) * beta_cf(a, b, x) / a;
  return 1 - std::exp(lbt) * beta_cf(b, a, 1 - x) / b;
}

// CDF of Student's t.
double t_cdf(double t, double dof) {
  const double x = dof / (dof + t * t);
  const double tail = 0.5 * inc_beta(dof / 2, 0.5, x);
  return t > 0 ? 1 - tail : tail;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Percentile with linear interpolation (numpy's default), of sorted v.
double percentile_sorted(const std::vector<double>& v, double q) {
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}
}  // namespace

double student_t_quantile(double p, double dof) {
  KVB_CHECK(p > 0 && p < 1 && dof >= 1) << "student_t_quantile(" << p << ", " << dof << ")";
  double lo = -1e6, hi = 1e6;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (t_cdf(mid, dof) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

MeanCI mean_ci(const std::vector<double>& x, double level) {
  MeanCI r;
  r.n = static_cast<int>(x.size());
  if (x.empty()) {
    r.mean = r.lo = r.hi = NAN;
    return r;
  }
  double sum = 0;
  for (double v : x) sum += v;
  r.mean = sum / x.size();
  r.lo = r.hi = r.mean;
  if (x.size() < 2) return r;
  double ss = 0;
  for (double v : x) ss += (v - r.mean) * (v - r.mean);
  const double se = std::sqrt(ss / (x.size() - 1) / x.size());
  if (se == 0) return r;
  const double t = student_t_quantile(0.5 + level / 2, static_cast<double>(x.size() - 1));
  r.lo = r.mean - t * se;
  r.hi = r.mean + t * se;
  return r;
}

PairedComparison paired_bootstrap(const std::vector<double>& a, const std::vector<double>& b,
                                  int resamples, uint64_t seed, double level) {
  KVB_CHECK(a.size() == b.size()) << "paired_bootstrap: " << a.size() << " vs " << b.size()
                                  << " values";
  KVB_CHECK(resamples >= 1) << "paired_bootstrap: resamples " << resamples;
  PairedComparison r;
  r.n = static_cast<int>(a.size());
  if (a.empty()) {
    r.mean_diff = r.lo = r.hi = NAN;
    return r;
  }
  std::vector<double> d(a.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += d[i] = a[i] - b[i];
  r.mean_diff = sum / d.size();
  r.lo = r.hi = r.mean_diff;
  if (d.size() < 2) return r;
  const bool constant = std::all_of(d.begin(), d.end(), [&](double v) { return v == d[0]; });
  if (constant) {
    // Every resample has the same mean: the interval collapses; p is 0 for a nonzero shift.
    r.p_value = d[0] == 0 ? 1.0 : 0.0;
    return r;
  }
  std::vector<double> means(resamples);
  const uint64_t n = d.size();
  for (int k = 0; k < resamples; ++k) {
    double s = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t u = splitmix64(splitmix64(seed ^ (static_cast<uint64_t>(k) << 32)) + i);
      s += d[(u >> 11) % n];
    }
    means[k] = s / n;
  }
  std::sort(means.begin(), means.end());
  r.lo = percentile_sorted(means, (1 - level) / 2);
  r.hi = percentile_sorted(means, 1 - (1 - level) / 2);
  const double below = static_cast<double>(std::count_if(means.begin(), means.end(),
                                                         [](double m) { return m <= 0; })) / resamples;
  const double above = static_cast<double>(std::count_if(means.begin(), means.end(),
                                                         [](double m) { return m >= 0; })) / resamples;
  r.p_value = std::min(1.0, 2 * std::min(below, above));
  return r;
}

MeanCI wilson_ci(double successes, int n, double level) {
  KVB_CHECK(n >= 1 && successes >= 0 && successes <= n) << "wilson_ci: " << successes << " of " << n;
  // z: the standard normal quantile, by bisection on its CDF 0.5 erfc(-x / sqrt 2).
  const double target = 1 - (1 - level) / 2;
  double a = 0, b = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (a + b);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < target ? a : b) = mid;
  }
  const double z = 0.5 * (a + b);
  const double p = successes / n, z2n = z * z / n;
  const double center = (p + z2n / 2) / (1 + z2n);
  const double half = z / (1 + z2n) * std::sqrt(p * (1 - p) / n + z2n / (4.0 * n));
  MeanCI r;
  r.n = n;
  r.mean = p;
  r.lo = std::max(0.0, center - half);
  r.hi = std::min(1.0, center + half);
  return r;
}

MeanCI score_ci(const std::vector<double>& x, int resamples, uint64_t seed, double level) {
  if (x.empty()) return mean_ci(x, level);
  const bool binary = std::all_of(x.begin(), x.end(), [](double v) { return v == 0 || v == 1; });
  if (binary) {
    double ones = 0;
    for (double v : x) ones += v;
    return wilson_ci(ones, static_cast<int>(x.size()), level);
  }
  const PairedComparison b =
      paired_bootstrap(x, std::vector<double>(x.size(), 0.0), resamples, seed, level);
  MeanCI r;
  r.n = b.n;
  r.mean = b.mean_diff;
  r.lo = b.lo;
  r.hi = b.hi;
  return r;
}

MeanCI mean_of_means_ci(const std::vector<std::vector<double>>& groups, int resamples,
                        uint64_t seed, double level) {
  KVB_CHECK(!groups.empty() && resamples >= 1) << "mean_of_means_ci: no groups";
  MeanCI r;
  double sum = 0;
  for (const auto& g : groups) {
    KVB_CHECK(!g.empty()) << "mean_of_means_ci: an empty group";
    double s = 0;
    for (double v : g) s += v;
    sum += s / g.size();
    r.n += static_cast<int>(g.size());
  }
  r.mean = sum / groups.size();
  std::vector<double> means(resamples);
  for (int k = 0; k < resamples; ++k) {
    double total = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const std::vector<double>& g = groups[gi];
      const uint64_t n = g.size();
      double s = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t u = splitmix64(splitmix64(seed ^ (static_cast<uint64_t>(k) << 32) ^
                                                 (static_cast<uint64_t>(gi) << 52)) + i);
        s += g[(u >> 11) % n];
      }
      total += s / n;
    }
    means[k] = total / groups.size();
  }
  std::sort(means.begin(), means.end());
  r.lo = percentile_sorted(means, (1 - level) / 2);
  r.hi = percentile_sorted(means, 1 - (1 - level) / 2);
  return r;
}

}  // namespace kvb::results
