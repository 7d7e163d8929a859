// Greedy farthest-point k-center, CPU reference (POLICIES.md `subgen_kcenter`). O(n * k * dim):
// each new centre updates every point's distance to its nearest centre (in parallel over points,
// four per AVX2 vector, each distance summed on its own, so the result depends on neither the
// thread count nor the vector width); the argmax is serial.
#include "kernels/cpu/kcenter.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/isa.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVB_KCENTER_AVX2 1
#endif

namespace kvb::kernels::cpu {
namespace {

// Squared L2 in double: per coordinate in increasing order d = a - b (exact) and s = fma(d, d,
// s), one rounding per coordinate. The fma is written out, not left to the compiler: GCC
// contracted the vector path's multiply and add into an fma (-ffp-contract=fast) while a scalar
// loop, under tunings that avoid fma chains (-mtune=znver*), stays unfused, so paths and
// machines rounded differently (issue 31). std::fma is exact everywhere (an instruction with
// FMA, the C library's otherwise).
double squared_distance(const float* a, const float* b, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    s = std::fma(d, d, s);
  }
  return s;
}

// Every point's squared distance to `centre`, into out[0, n): squared_distance's operations,
// four points at a time on the AVX2 path (a lane per point over a coordinate-major copy of the
// points in blocks of 4), one at a time on the portable one (isa.h picks).
class PointDistances {
 public:
  PointDistances(const KCenterArgs& a) : a_(a) {
#ifdef KVB_KCENTER_AVX2
    vector_ = active_isa() >= Isa::kAvx2;
    if (!vector_) return;
    const int groups = (a.n + 3) / 4;
    blocks_.assign(static_cast<size_t>(groups) * a.dim * 4, 0.0f);
    for (int j = 0; j < a.n; ++j) {
      const float* p = a.keys + static_cast<size_t>(j) * a.ld;
      float* b = blocks_.data() + static_cast<size_t>(j / 4) * a.dim * 4 + j % 4;
      for (int x = 0; x < a.dim; ++x) b[static_cast<size_t>(x) * 4] = p[x];
    }
#endif
  }
  // Which path each() takes.
  Isa path() const { return vector_ ? Isa::kAvx2 : Isa::kPortable; }
  // f(j, d) for every point j, d its squared distance to centre; points in parallel.
  template <typename F>
  void each(const float* centre, F f) const {
    const int n = a_.n;
#ifdef KVB_KCENTER_AVX2
    if (vector_) {
      const int groups = (n + 3) / 4, dim = a_.dim;
#pragma omp parallel for schedule(static) if (n > 1024)
      for (int g = 0; g < groups; ++g) {
        const float* b = blocks_.data() + static_cast<size_t>(g) * dim * 4;
        __m256d s = _mm256_setzero_pd();
        for (int x = 0; x < dim; ++x) {
          const __m256d p = _mm256_cvtps_pd(_mm_loadu_ps(b + static_cast<size_t>(x) * 4));
          const __m256d d = _mm256_sub_pd(p, _mm256_set1_pd(static_cast<double>(centre[x])));
          s = _mm256_fmadd_pd(d, d, s);
        }
        alignas(32) double out[4];
        _mm256_store_pd(out, s);
        for (int l = 0; l < 4 && g * 4 + l < n; ++l) f(g * 4 + l, out[l]);
      }
      return;
    }
#endif
#pragma omp parallel for schedule(static) if (n > 1024)
    for (int j = 0; j < n; ++j) {
      f(j, squared_distance(a_.keys + static_cast<size_t>(j) * a_.ld, centre, a_.dim));
    }
  }

 private:
  const KCenterArgs& a_;
  bool vector_ = false;
  std::vector<float> blocks_;
};

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
  const PointDistances distances(args);
  count_dispatch(SimdKernel::kKCenter, distances.path());
  distances.each(point(0), [&](int j, double d) {
    dist[j] = d;
    nearest[j] = 0;
  });
  for (int c = 1; c < m; ++c) {
    int far = -1;
    for (int j = 0; j < n; ++j) {  // strict '>' keeps the lower index on ties
      if (!is_centre[j] && (far < 0 || dist[j] > dist[far])) far = j;
    }
    centres[c] = far;
    is_centre[far] = 1;
    distances.each(point(far), [&](int j, double d) {
      if (d < dist[j] || (d == dist[j] && far < nearest[j])) {
        dist[j] = d;
        nearest[j] = far;
      }
    });
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
