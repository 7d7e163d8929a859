// SubGen's sketch (seed 003, Algorithm 1): reservoir update, delta-clustering with per-cluster
// uniform samples, the z / tau estimator with exact tokens, and the `delta: auto` search. CPU
// reference (POLICIES.md `subgen`); plain serial loops in a fixed order, so bits are reproducible.
#include "kernels/cpu/subgen_estimator.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVB_SUBGEN_AVX2 1  // compiled; taken when active_isa() >= Isa::kAvx2 (isa.h)
#endif

namespace kvb::kernels::cpu {
namespace {

// Squared L2 in double: per coordinate in increasing order d = a - b (exact) and s = fma(d, d,
// s). The fma is written out, not left to the compiler: GCC's contraction of `s += d * d` varied
// with the tuning (a scalar loop stays unfused under -mtune=znver*, which avoids fma chains,
// while straight-line code and the vector path fused), so the paths of one build disagreed on
// a distance at a threshold (issue 31). std::fma is exact everywhere (an instruction with FMA,
// the C library's otherwise).
double squared_distance(const float* a, const float* b, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    s = std::fma(d, d, s);
  }
  return s;
}

struct Nearest {
  int index = -1;  // -1: no representative yet
  double dist2 = 0;
};

// reps: [m, ld]. Ties go to the lower index (strict '<').
Nearest nearest_rep(const float* reps, int m, int ld, const float* key, int dim) {
  Nearest best;
  for (int i = 0; i < m; ++i) {
    const double d = squared_distance(reps + static_cast<size_t>(i) * ld, key, dim);
    if (best.index < 0 || d < best.dist2) {
      best.index = i;
      best.dist2 = d;
    }
  }
  return best;
}

}  // namespace

bool subgen_distance_fuses() {
  // squared_distance fuses by construction; this measures the compiled function, so the CUDA
  // twin's rounding switch and its test follow what the CPU really does.
  // Coordinates 0-3 sum exactly to 2^-29 + 2^-53 (float differences, squares exact in double);
  // coordinate 4's d = 1 - 2^-30 has d^2 = 1 - 2^-29 + 2^-60. Unfused, d^2 rounds to
  // 1 - 2^-29 and the sum 1 + 2^-53 is a tie that rounds to even, 1; fused, the 2^-60 breaks
  // the tie upwards to 1 + 2^-52. Volatile inputs keep the compiler from folding the call with
  // constants (a fold need not round as the compiled loop does).
  static volatile float a_in[5] = {0x1.0p-15f, 0x1.0p-15f, 0x1.0p-27f, 0x1.0p-27f, 1.0f};
  static volatile float b_in[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0x1.0p-30f};
  float a[5], b[5];
  for (int i = 0; i < 5; ++i) {
    a[i] = a_in[i];
    b[i] = b_in[i];
  }
  static const bool fused = squared_distance(a, b, 5) != 1.0;
  return fused;
}

double value_sqnorm(const float* v, int head_dim) {
  double s = 0;
  for (int i = 0; i < head_dim; ++i) s += static_cast<double>(v[i]) * v[i];
  return s;
}

void subgen_absorb(const SubgenParams& p, const SubgenCounter& c, const float* key,
                   const float* value, SubgenSketch& sk) {
  KVB_CHECK(p.head_dim > 0 && p.s >= 1 && p.t >= 1 && p.max_clusters >= 1)
      << "subgen_absorb: head_dim " << p.head_dim << ", s " << p.s << ", t " << p.t
      << ", max_clusters " << p.max_clusters;
  const size_t d = p.head_dim;
  // UpdateMatrixProduct (lines 25-27), then mu += |v|^2 (line 6).
  if (sk.m_keys.empty()) {
    sk.m_keys.assign(static_cast<size_t>(p.s) * d, 0.0f);
    sk.m_values.assign(static_cast<size_t>(p.s) * d, 0.0f);
  }
  const double sq = value_sqnorm(value, p.head_dim);
  const double mu_new = sk.mu + sq;
  const double prob = mu_new > 0 ? sq / mu_new : 1.0;
  for (int j = 0; j < p.s; ++j) {
    if (counter_uniform(c.seed, c.layer, c.head, c.step, static_cast<uint64_t>(j)) < prob) {
      std::memcpy(&sk.m_keys[j * d], key, d * sizeof(float));
      std::memcpy(&sk.m_values[j * d], value, d * sizeof(float));
    }
  }
  sk.mu = mu_new;

  // UpdateSoftmaxNormalizer (lines 11-23), with the capacity fallback.
  const Nearest near = nearest_rep(sk.reps.data(), sk.clusters(), p.head_dim, key, p.head_dim);
  const bool within = near.index >= 0 && near.dist2 <= p.delta2;
  if (within || (near.index >= 0 && sk.clusters() >= p.max_clusters)) {
    if (!within) ++sk.forced;
    const int64_t n = ++sk.counts[near.index];
    const double join = 1.0 / static_cast<double>(n);
    float* samples = &sk.samples[static_cast<size_t>(near.index) * p.t * d];
    for (int j = 0; j < p.t; ++j) {
      if (counter_uniform(c.seed, c.layer, c.head, c.step, kClusterSlot + j) < join) {
        std::memcpy(samples + j * d, key, d * sizeof(float));
      }
    }
  } else {
    sk.reps.insert(sk.reps.end(), key, key + d);
    for (int j = 0; j < p.t; ++j) sk.samples.insert(sk.samples.end(), key, key + d);
    sk.counts.push_back(1);
  }
  ++sk.absorbed;
}

SubgenSketchView subgen_view(const SubgenSketch& sk, const SubgenParams& p) {
  SubgenSketchView v;
  if (sk.absorbed == 0) return v;
  v.m_keys = sk.m_keys.data();
  v.m_values = sk.m_values.data();
  v.s = p.s;
  v.mu = sk.mu;
  v.samples = sk.samples.data();
  v.counts = sk.counts.data();
  v.clusters = sk.clusters();
  v.t = p.t;
  return v;
}

void subgen_query(const SubgenQueryArgs& a) {
  const int d = a.head_dim;
  const SubgenSketchView& sk = a.sketch;
  const int n_samples = sk.clusters * sk.t;
  const int total = sk.s + n_samples + a.n_exact;
  // Logits in one row: M's slots, then the cluster samples, then the exact tokens.
  std::vector<float> logit(total);
  float c = -INFINITY;
  for (int j = 0; j < sk.s; ++j) {
    logit[j] = dot(a.q, sk.m_keys + static_cast<size_t>(j) * d, d) * a.scale;
  }
  for (int j = 0; j < n_samples; ++j) {
    logit[sk.s + j] = dot(a.q, sk.samples + static_cast<size_t>(j) * d, d) * a.scale;
  }
  for (int j = 0; j < a.n_exact; ++j) {
    float l = dot(a.q, a.exact_keys + static_cast<size_t>(j) * d, d) * a.scale;
    if (a.exact_bias) l += a.exact_bias[j];
    logit[sk.s + n_samples + j] = l;
  }
  for (int j = 0; j < total; ++j) c = std::max(c, logit[j]);

  std::vector<double> z(d, 0.0);
  double tau = 0;
  // Numerator estimator (line 29).
  for (int j = 0; j < sk.s; ++j) {
    const float* v = sk.m_values + static_cast<size_t>(j) * d;
    const double sq = value_sqnorm(v, d);
    if (!(sq > 0)) continue;  // a zero value adds nothing (and has weight 0/0)
    const double w = sk.mu / (static_cast<double>(sk.s) * sq) * std::exp(double(logit[j]) - c);
    for (int x = 0; x < d; ++x) z[x] += w * v[x];
  }
  // Partition-function estimator (line 30).
  for (int i = 0; i < sk.clusters; ++i) {
    double sum = 0;
    for (int j = 0; j < sk.t; ++j) sum += std::exp(double(logit[sk.s + i * sk.t + j]) - c);
    tau += static_cast<double>(sk.counts[i]) / sk.t * sum;
  }
  // Exact tokens: their own mass in both.
  for (int j = 0; j < a.n_exact; ++j) {
    const double e = std::exp(double(logit[sk.s + n_samples + j]) - c);
    const float* v = a.exact_values + static_cast<size_t>(j) * d;
    for (int x = 0; x < d; ++x) z[x] += e * v[x];
    tau += e;
  }
  if (!(tau > 0) || !std::isfinite(tau)) {
    std::fill(a.out, a.out + d, 0.0f);
    return;
  }
  for (int x = 0; x < d; ++x) a.out[x] = static_cast<float>(z[x] / tau);
}

double subgen_memory_tokens(const SubgenSketch& sk, int s, int t, int exact_tokens) {
  const double m = sk.absorbed > 0 ? s : 0;
  return m + static_cast<double>(sk.clusters()) * (t + 1) / 2.0 + exact_tokens;
}

size_t subgen_sketch_bytes(const SubgenSketch& sk) {
  if (sk.absorbed == 0) return 0;
  return (sk.m_keys.size() + sk.m_values.size() + sk.reps.size() + sk.samples.size()) *
             sizeof(float) +
         sk.counts.size() * sizeof(int64_t) + sizeof(sk.mu) + sizeof(sk.absorbed);
}

int subgen_max_clusters(int kv_budget, int s, int t, int sinks, int recent) {
  const long long room = static_cast<long long>(kv_budget) - s - sinks - recent;
  if (room <= 0 || t < 1) return 0;
  return static_cast<int>(2 * room / (t + 1));
}

namespace {

// The representatives of a count: rows [m, dim] (the nearest rule's layout) and, for the vector
// path (`blocked`), blocks of 4 coordinate-major ([ceil(m / 4), dim, 4], lanes past m zero).
struct RepSet {
  int dim = 0, m = 0;
  bool blocked = false;
  std::vector<float> rows, blocks;
  void clear(int d, bool with_blocks) {
    dim = d;
    m = 0;
    blocked = with_blocks;
    rows.clear();
    blocks.clear();
  }
  void add(const float* k) {
    rows.insert(rows.end(), k, k + dim);
    if (blocked) {
      if (m % 4 == 0) blocks.resize(blocks.size() + static_cast<size_t>(dim) * 4, 0.0f);
      float* b = blocks.data() + static_cast<size_t>(m / 4) * dim * 4 + m % 4;
      for (int x = 0; x < dim; ++x) b[static_cast<size_t>(x) * 4] = k[x];
    }
    ++m;
  }
};

// Whether nearest_rep(reps, m, dim, key, dim).dist2 <= delta2, for finite keys and
// representatives, without finding the nearest: with no NaN anywhere the nearest's distance is
// the least, so some representative within delta2 decides it; and a distance is summed as
// squared_distance sums it (the same fma(d, d, s) per coordinate in order, so the same bits),
// except that it stops once the partial sum exceeds delta2: each fma adds d * d >= 0 and
// rounding to nearest is monotone, so the full sum would exceed it too. Checked every 8
// coordinates.
bool some_rep_within(const float* reps, int m, const float* key, int dim, double delta2) {
  for (int i = 0; i < m; ++i) {
    const float* r = reps + static_cast<size_t>(i) * dim;
    double s = 0;
    int x = 0;
    bool over = false;
    for (; x + 8 <= dim; x += 8) {
      for (int e = x; e < x + 8; ++e) {
        const double d = static_cast<double>(r[e]) - static_cast<double>(key[e]);
        s = std::fma(d, d, s);
      }
      if (s > delta2) {
        over = true;
        break;
      }
    }
    if (over) continue;
    for (; x < dim; ++x) {
      const double d = static_cast<double>(r[x]) - static_cast<double>(key[x]);
      s = std::fma(d, d, s);
    }
    if (s <= delta2) return true;
  }
  return false;
}

#ifdef KVB_SUBGEN_AVX2
// some_rep_within over 4 representatives at a time (AVX2: a lane per representative, each
// summing its own distance in coordinate order with squared_distance's fma). A block stops once
// all its lanes passed delta2.
bool some_rep_within4(const RepSet& reps, const float* key, double delta2) {
  const int dim = reps.dim;
  const __m256d lim = _mm256_set1_pd(delta2);
  for (int g = 0; g * 4 < reps.m; ++g) {
    const int live = std::min(4, reps.m - g * 4);
    const int lanes = (1 << live) - 1;
    const float* b = reps.blocks.data() + static_cast<size_t>(g) * dim * 4;
    __m256d s = _mm256_setzero_pd();
    auto step = [&](int x) {
      const __m256d r = _mm256_cvtps_pd(_mm_loadu_ps(b + static_cast<size_t>(x) * 4));
      const __m256d d = _mm256_sub_pd(r, _mm256_set1_pd(static_cast<double>(key[x])));
      s = _mm256_fmadd_pd(d, d, s);
    };
    int x = 0;
    bool over = false;
    for (; x + 8 <= dim; x += 8) {
      for (int e = x; e < x + 8; ++e) step(e);
      const int past = _mm256_movemask_pd(_mm256_cmp_pd(s, lim, _CMP_GT_OQ));
      if ((past & lanes) == lanes) {
        over = true;
        break;
      }
    }
    if (over) continue;
    for (; x < dim; ++x) step(x);
    if (_mm256_movemask_pd(_mm256_cmp_pd(s, lim, _CMP_LE_OQ)) & lanes) return true;
  }
  return false;
}
#endif

bool all_finite(const float* keys, int n, int ld, int head_dim) {
  for (int j = 0; j < n; ++j) {
    const float* k = keys + static_cast<size_t>(j) * ld;
    for (int i = 0; i < head_dim; ++i) {
      if (!std::isfinite(k[i])) return false;
    }
  }
  return true;
}

// subgen_count_clusters; finite: every key is finite (some_rep_within decides then, 4 lanes at
// a time on the AVX2 path (isa.h) when `vector`).
int count_clusters(const float* keys, int n, int ld, int head_dim, double delta2, int limit,
                   bool finite, RepSet& reps, bool vector = true) {
#ifdef KVB_SUBGEN_AVX2
  vector = vector && active_isa() >= Isa::kAvx2;
#else
  vector = false;
#endif
  reps.clear(head_dim, vector);
  if (finite) count_dispatch(SimdKernel::kSubgenCount, vector ? Isa::kAvx2 : Isa::kPortable);
  for (int j = 0; j < n; ++j) {
    const float* k = keys + static_cast<size_t>(j) * ld;
    if (finite) {
#ifdef KVB_SUBGEN_AVX2
      if (vector ? some_rep_within4(reps, k, delta2)
                 : some_rep_within(reps.rows.data(), reps.m, k, head_dim, delta2)) {
        continue;
      }
#else
      if (some_rep_within(reps.rows.data(), reps.m, k, head_dim, delta2)) continue;
#endif
    } else {
      const Nearest near = nearest_rep(reps.rows.data(), reps.m, head_dim, k, head_dim);
      if (near.index >= 0 && near.dist2 <= delta2) continue;
    }
    if (reps.m + 1 > limit) return reps.m + 1;
    reps.add(k);
  }
  return reps.m;
}

}  // namespace

int subgen_count_clusters(const float* keys, int n, int ld, int head_dim, double delta2,
                          int limit) {
  RepSet reps;
  return count_clusters(keys, n, ld, head_dim, delta2, limit, all_finite(keys, n, ld, head_dim),
                        reps);
}

int subgen_count_clusters_by_nearest(const float* keys, int n, int ld, int head_dim,
                                     double delta2, int limit) {
  RepSet reps;
  return count_clusters(keys, n, ld, head_dim, delta2, limit, /*finite=*/false, reps);
}

int subgen_count_clusters_scalar(const float* keys, int n, int ld, int head_dim, double delta2,
                                 int limit) {
  RepSet reps;
  return count_clusters(keys, n, ld, head_dim, delta2, limit, all_finite(keys, n, ld, head_dim),
                        reps, /*vector=*/false);
}

double subgen_auto_delta2(const float* keys, int n, int ld, int head_dim, int max_clusters,
                          int iterations) {
  KVB_CHECK(max_clusters >= 1 && n >= 0) << "subgen_auto_delta2: max_clusters " << max_clusters;
  if (n == 0) return 0;
  const bool finite = all_finite(keys, n, ld, head_dim);
  RepSet reps;
  auto count = [&](double delta2) {
    return count_clusters(keys, n, ld, head_dim, delta2, max_clusters, finite, reps);
  };
  if (count(0.0) <= max_clusters) return 0;
  double lo = 0, hi = 0;  // count(lo) > max_clusters >= count(hi)
  for (int j = 1; j < n; ++j) {
    hi = std::max(hi, squared_distance(keys + static_cast<size_t>(j) * ld, keys, head_dim));
  }
  for (int it = 0; it < iterations; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (count(mid) <= max_clusters) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

}  // namespace kvb::kernels::cpu
