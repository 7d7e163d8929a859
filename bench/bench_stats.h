// Helpers the interleaved A/B benches share: a fixed-point figure and the median of a sample.
#pragma once

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

namespace kvb::bench {

inline std::string fmt(double v, int p) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(p) << v;
  return s.str();
}

// The median (the mean of the middle two for an even count; 0 for none).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace kvb::bench
