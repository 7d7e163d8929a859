// Tests kvb::kernels::cpu::kcenter_greedy: hand-traced farthest-point runs on a line and in the
// plane, ties (lower index), duplicates, k >= n, k = 0, a row stride, assignments and sizes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/kcenter.h"

namespace kvb::kernels::cpu {
namespace {

using V = std::vector<int32_t>;

struct KCenterRun {
  V centres, assignment, sizes;
};

KCenterRun run(const std::vector<float>& keys, int dim, int k, int ld = 0) {
  if (ld == 0) ld = dim;
  const int n = static_cast<int>(keys.size()) / ld;
  KCenterRun r;
  r.centres.assign(n + 1, -7);
  r.assignment.assign(n, -7);
  r.sizes.assign(n + 1, -7);
  KCenterArgs a;
  a.keys = keys.data();
  a.n = n;
  a.dim = dim;
  a.ld = ld;
  a.k = k;
  const int m = kcenter_greedy(a, r.centres.data(), r.assignment.data(), r.sizes.data());
  r.centres.resize(m);
  r.sizes.resize(m);
  return r;
}

TEST(KCenter, PointsOnALine) {
  // Points 0 1 2 10 11 20 (indices 0..5), k = 3.
  //   centre 0 (value 0); distances 0 1 2 10 11 20 -> farthest index 5 (20)
  //   nearest of {0, 20}: 0 1 2 10 9 0 -> farthest index 3 (10)
  //   centres {0, 5, 3} -> increasing order {0, 3, 5} = values 0, 10, 20
  // Assignment: 1 and 2 -> 0 (2 < 8); 11 -> 10 (1 < 9); 20 -> itself.
  const KCenterRun r = run({0, 1, 2, 10, 11, 20}, 1, 3);
  EXPECT_EQ(r.centres, (V{0, 3, 5}));
  EXPECT_EQ(r.assignment, (V{0, 0, 0, 3, 3, 5}));
  EXPECT_EQ(r.sizes, (V{3, 2, 1}));
}

TEST(KCenter, TwoDimensionsAndStride) {
  // (0,0) (3,4) (6,8) (0,1), k = 2: squared distances to (0,0): 0 25 100 1 -> index 2.
  // Nearest of {(0,0), (6,8)}: (3,4) is 25 from both -> the lower centre index 0.
  // ld = 3 with a junk third column that must not enter the distance.
  const KCenterRun r = run({0, 0, 99, 3, 4, -99, 6, 8, 50, 0, 1, 7}, 2, 2, 3);
  EXPECT_EQ(r.centres, (V{0, 2}));
  EXPECT_EQ(r.assignment, (V{0, 0, 2, 0}));
  EXPECT_EQ(r.sizes, (V{3, 1}));
  // k = 3: nearest distances now 0 25 0 1 -> index 1 (3,4).
  const KCenterRun r3 = run({0, 0, 99, 3, 4, -99, 6, 8, 50, 0, 1, 7}, 2, 3, 3);
  EXPECT_EQ(r3.centres, (V{0, 1, 2}));
  EXPECT_EQ(r3.sizes, (V{2, 1, 1}));
}

TEST(KCenter, FarthestTieGoesToLowerIndex) {
  // 0 -5 5, k = 2: indices 1 and 2 are both 5 from the first centre -> index 1.
  EXPECT_EQ(run({0, -5, 5}, 1, 2).centres, (V{0, 1}));
  // 0 5 -5: the same tie, now index 1 is 5 -> index 1 again.
  EXPECT_EQ(run({0, 5, -5}, 1, 2).centres, (V{0, 1}));
  // Assignment tie: 0 10 5 with k = 2 -> centres 0, 1; point 5 is 5 from both -> centre 0.
  const KCenterRun r = run({0, 10, 5}, 1, 2);
  EXPECT_EQ(r.assignment, (V{0, 1, 0}));
}

TEST(KCenter, DuplicatesStillFillTheBudget) {
  // 1 1 1 4, k = 3: centre 0; farthest index 3; then every other point is 0 away -> the lowest
  // non-centre index, 1. Index 1 is its own centre although identical to centre 0; index 2
  // goes to the lower of the two equally near centres (0).
  const KCenterRun r = run({1, 1, 1, 4}, 1, 3);
  EXPECT_EQ(r.centres, (V{0, 1, 3}));
  EXPECT_EQ(r.assignment, (V{0, 1, 0, 3}));
  EXPECT_EQ(r.sizes, (V{2, 1, 1}));
}

TEST(KCenter, SizeEdges) {
  // k >= n: every point is a centre of size 1.
  const KCenterRun all = run({3, 1, 2}, 1, 5);
  EXPECT_EQ(all.centres, (V{0, 1, 2}));
  EXPECT_EQ(all.assignment, (V{0, 1, 2}));
  EXPECT_EQ(all.sizes, (V{1, 1, 1}));
  // k = 1: just the first point, everyone assigned to it.
  const KCenterRun one = run({3, 1, 2}, 1, 1);
  EXPECT_EQ(one.centres, (V{0}));
  EXPECT_EQ(one.sizes, (V{3}));
  // k = 0 and n = 0: nothing.
  EXPECT_EQ(run({3, 1, 2}, 1, 0).centres, V{});
  EXPECT_EQ(run({}, 1, 2).centres, V{});
  // n = 1.
  EXPECT_EQ(run({7}, 1, 2).centres, (V{0}));
  // Outputs other than the centres are optional.
  const std::vector<float> keys = {0, 1, 2, 10, 11, 20};
  KCenterArgs a;
  a.keys = keys.data();
  a.n = 6;
  a.dim = 1;
  a.ld = 1;
  a.k = 3;
  int32_t c[3];
  ASSERT_EQ(kcenter_greedy(a, c), 3);
  EXPECT_EQ(V(c, c + 3), (V{0, 3, 5}));
  a.ld = 0;  // ld < dim
  EXPECT_THROW(kcenter_greedy(a, c), kvb::Error);
}

// The greedy loop written out plainly (one point at a time, squared distances in double in
// coordinate order, an fma per coordinate): the library's (points four to a vector, in parallel)
// must give the same centres, assignments and sizes, on data with many exact ties (coordinates on a
// coarse grid), counts of points that do and do not fill the last vector, and dimensions 1 to 70.
KCenterRun reference(const std::vector<float>& keys, int dim, int k) {
  const int n = static_cast<int>(keys.size()) / dim;
  auto dist2 = [&](int i, int j) {
    double s = 0;
    for (int c = 0; c < dim; ++c) {
      const double t = static_cast<double>(keys[static_cast<size_t>(i) * dim + c]) -
                       static_cast<double>(keys[static_cast<size_t>(j) * dim + c]);
      s = std::fma(t, t, s);
    }
    return s;
  };
  const int m = std::min(std::max(k, 0), n);
  KCenterRun r;
  if (m == 0) return r;
  std::vector<double> best(n);
  std::vector<int32_t> near(n, 0);
  std::vector<bool> chosen(n, false);
  r.centres.push_back(0);
  chosen[0] = true;
  for (int j = 0; j < n; ++j) best[j] = dist2(j, 0);
  while (static_cast<int>(r.centres.size()) < m) {
    int far = -1;
    for (int j = 0; j < n; ++j) {
      if (!chosen[j] && (far < 0 || best[j] > best[far])) far = j;
    }
    r.centres.push_back(far);
    chosen[far] = true;
    for (int j = 0; j < n; ++j) {
      const double d = dist2(j, far);
      if (d < best[j] || (d == best[j] && far < near[j])) {
        best[j] = d;
        near[j] = far;
      }
    }
  }
  std::sort(r.centres.begin(), r.centres.end());
  for (int c : r.centres) near[c] = c;
  r.assignment = near;
  r.sizes.assign(m, 0);
  for (int j = 0; j < n; ++j) {
    ++r.sizes[std::lower_bound(r.centres.begin(), r.centres.end(), near[j]) - r.centres.begin()];
  }
  return r;
}

// The distances fuse each square into the sum (kcenter.h), on every path (this binary runs under
// each KVB_ISA the build has): point 1 is 1 + 2^-52 from point 0 when `s = fma(d, d, s)` and
// exactly 1 when the square is rounded first (the tie 1 + 2^-53 rounds to even); point 2 is
// 1 + 2^-52 away either way (exact squares). Fused, the farthest is a tie that goes to the lower
// index, point 1; unfused it would be point 2.
TEST(KCenter, DistancesFuseEachSquareIntoTheSum) {
  const std::vector<float> keys = {0.0f,       0.0f,       0.0f,       0.0f,       0x1.0p-30f,
                                   0x1.0p-15f, 0x1.0p-15f, 0x1.0p-27f, 0x1.0p-27f, 1.0f,
                                   1.0f,       0x1.0p-26f, 0.0f,       0.0f,       0x1.0p-30f};
  const KCenterRun r = run(keys, 5, 2);
  EXPECT_EQ(r.centres, (V{0, 1}));
}

TEST(KCenter, EqualsThePlainGreedyLoop) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> grid(-3, 3);
  for (const int dim : {1, 3, 8, 64, 70}) {
    for (const int n : {1, 2, 5, 8, 9, 1027, 2050}) {
      for (const int k : {1, 4, 33}) {
        SCOPED_TRACE(testing::Message() << "dim " << dim << " n " << n << " k " << k);
        std::vector<float> keys(static_cast<size_t>(n) * dim);
        for (float& x : keys) x = 0.5f * static_cast<float>(grid(gen));
        const KCenterRun want = reference(keys, dim, k);
        const KCenterRun got = run(keys, dim, k);
        EXPECT_EQ(got.centres, want.centres);
        EXPECT_EQ(got.assignment, want.assignment);
        EXPECT_EQ(got.sizes, want.sizes);
      }
    }
  }
}

TEST(KCenter, ParallelPathMatchesSerialAndIsAGreedyCover) {
  // n above the OpenMP threshold: 1 thread and 4 threads must give identical results, and the
  // result must satisfy the farthest-point invariant checked from scratch: every chosen centre
  // after the first was (one of) the farthest from the centres chosen before it.
  const int n = 3001, dim = 5, k = 40;
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(n) * dim);
  for (float& x : keys) x = d(gen);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const KCenterRun a = run(keys, dim, k);
  omp_set_num_threads(4);
  const KCenterRun b = run(keys, dim, k);
  omp_set_num_threads(saved);
  EXPECT_EQ(a.centres, b.centres);
  EXPECT_EQ(a.assignment, b.assignment);
  EXPECT_EQ(a.sizes, b.sizes);
  ASSERT_EQ(a.centres.size(), static_cast<size_t>(k));
  int total = 0;
  for (int s : a.sizes) total += s;
  EXPECT_EQ(total, n);
  // Covering radius: the farthest point from its assigned centre is no farther than the
  // distance between any two centres (the greedy 2-approximation's certificate).
  auto dist2 = [&](int i, int j) {
    double s = 0;
    for (int c = 0; c < dim; ++c) {
      const double t = static_cast<double>(keys[i * dim + c]) - keys[j * dim + c];
      s = std::fma(t, t, s);
    }
    return s;
  };
  double radius = 0;
  for (int j = 0; j < n; ++j) radius = std::max(radius, dist2(j, a.assignment[j]));
  for (int x = 0; x < k; ++x) {
    EXPECT_EQ(a.assignment[a.centres[x]], a.centres[x]);
    for (int y = x + 1; y < k; ++y) EXPECT_GE(dist2(a.centres[x], a.centres[y]), radius);
  }
}

}  // namespace
}  // namespace kvb::kernels::cpu
