// Greedy farthest-point k-center, CPU reference (POLICIES.md `subgen_kcenter`). O(n * k * dim):
// each new centre updates every point's distance to its nearest centre (in parallel, one point
// per iteration, so the result does not depend on the thread count); the argmax is serial.
#include "kernels/cpu/kcenter.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "common/error.h"

namespace kvb::kernels::cpu {
namespace {

double squared_distance(const float* a, const float* b, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    s += d * d;
  }
  return s;
}

}  // namespace

int kcenter_greedy(const KCenterArgs& args, int32_t* centres, int32_t* assignment,
                   int32_t* cluster_sizes) {
  const int n = args.n;
  KVB_CHECK(n >= 0 && args.dim >= 0 && args.ld >= args.dim)
      << "kcenter_greedy: n = " << n << ", dim = " << args.dim << ", ld = " << args.ld;
  const int m = std::min(std::max(args.k, 0), n);
  if (m == 0) return 0;
  auto point = [&](int j) { return args.keys + static_cast<size_t>(j) * args.ld; };

  std::vector<double> dist(n);      // squared distance to the nearest chosen centre
  std::vector<int32_t> nearest(n);  // that centre (lowest index among equally near ones)
  std::vector<uint8_t> is_centre(n, 0);
  centres[0] = 0;
  is_centre[0] = 1;
#pragma omp parallel for schedule(static) if (n > 1024)
  for (int j = 0; j < n; ++j) {
    dist[j] = squared_distance(point(j), point(0), args.dim);
    nearest[j] = 0;
  }
  for (int c = 1; c < m; ++c) {
    int far = -1;
    for (int j = 0; j < n; ++j) {  // strict '>' keeps the lower index on ties
      if (!is_centre[j] && (far < 0 || dist[j] > dist[far])) far = j;
    }
    centres[c] = far;
    is_centre[far] = 1;
    const float* pf = point(far);
#pragma omp parallel for schedule(static) if (n > 1024)
    for (int j = 0; j < n; ++j) {
      const double d = squared_distance(point(j), pf, args.dim);
      if (d < dist[j] || (d == dist[j] && far < nearest[j])) {
        dist[j] = d;
        nearest[j] = far;
      }
    }
  }
  std::sort(centres, centres + m);
  if (assignment == nullptr && cluster_sizes == nullptr) return m;

  // A centre belongs to itself even when an identical lower-index centre exists.
  for (int c = 0; c < m; ++c) nearest[centres[c]] = centres[c];
  if (assignment != nullptr) std::copy(nearest.begin(), nearest.end(), assignment);
  if (cluster_sizes != nullptr) {
    std::fill(cluster_sizes, cluster_sizes + m, 0);
    for (int j = 0; j < n; ++j) {
      const int32_t* at = std::lower_bound(centres, centres + m, nearest[j]);
      KVB_ASSERT(at != centres + m && *at == nearest[j]) << "point " << j;
      ++cluster_sizes[at - centres];
    }
  }
  return m;
}

int kcenter_keep_list(const float* keys, int prefix, int len, int dim, int k,
                      std::vector<int32_t>* keep, std::vector<float>* log_sizes) {
  KVB_CHECK(0 <= prefix && prefix <= len && k >= 0)
      << "kcenter_keep_list: " << k << " centres of [0, " << prefix << ") of " << len << " slots";
  std::vector<int32_t> centres(k), sizes(k);
  KCenterArgs args;
  args.keys = keys;
  args.n = prefix;
  args.dim = dim;
  args.ld = dim;
  args.k = k;
  const int m = kcenter_greedy(args, centres.data(), nullptr, sizes.data());
  keep->assign(centres.begin(), centres.begin() + m);
  for (int s = prefix; s < len; ++s) keep->push_back(s);
  if (log_sizes != nullptr) {
    log_sizes->assign(keep->size(), 0.0f);
    for (int c = 0; c < m; ++c) (*log_sizes)[c] = std::log(static_cast<float>(sizes[c]));
  }
  return m;
}

}  // namespace kvb::kernels::cpu
