// Cases of the parity table (test_cuda_parity.cc) for the greedy k-center (kernels/cuda/kcenter.h):
// cuda::kcenter_greedy and cuda::kcenter_greedy_batch against cpu::kcenter_greedy, bit for bit
// (centres, assignment, cluster sizes are integers: equal means the same picks), on random keys,
// keys with repeated points (distance-0 ties) and keys on a coarse grid (distance ties). The
// batch is also checked against one kcenter_greedy call per problem (the same entries, the
// untouched ones included) and for writing nothing past a problem's outputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kcenter.h"
#include "kernels/cuda/kcenter.h"
#include "tests/cuda/parity_util.h"

namespace kvb::parity {

inline void run_kcenter(int n, int dim, int k, bool duplicates) {
  std::vector<float> keys = random_vec(static_cast<size_t>(n) * (dim + 3), 101);  // ld = dim + 3
  if (duplicates) {  // every third point repeats an earlier one: distance-0 ties
    for (int j = 3; j < n; j += 3) {
      std::copy_n(&keys[static_cast<size_t>(j / 2) * (dim + 3)], dim,
                  &keys[static_cast<size_t>(j) * (dim + 3)]);
    }
  }
  const int m = std::min(std::max(k, 0), n);
  std::vector<int32_t> wc(std::max(m, 1)), wa(n), ws(std::max(m, 1));
  kernels::cpu::KCenterArgs a{keys.data(), n, dim, dim + 3, k};
  ASSERT_EQ(kernels::cpu::kcenter_greedy(a, wc.data(), wa.data(), ws.data()), m);
  const auto kd = to_device(keys);
  cu::DeviceBuffer<int32_t> gc(std::max(m, 1)), ga(n), gs(std::max(m, 1));
  kernels::cpu::KCenterArgs b{kd.data(), n, dim, dim + 3, k};
  ASSERT_EQ(cu::kcenter_greedy(b, gc.data(), ga.data(), gs.data()), m);
  if (m == 0) return;
  wc.resize(m);
  ws.resize(m);
  EXPECT_EQ(to_host(gc.data(), m), wc) << "centres";
  EXPECT_EQ(to_host(ga), wa) << "assignment";
  EXPECT_EQ(to_host(gs.data(), m), ws) << "cluster sizes";
}

// One problem of a batch: n points of dim coordinates at row stride ld, k centres wanted.
enum class KCenterKeys { kRandom, kDuplicates, kGrid };
struct KCenterSpec {
  int n, dim, ld, k;
  KCenterKeys keys = KCenterKeys::kRandom;
};

inline std::vector<float> kcenter_keys(const KCenterSpec& s, uint64_t seed) {
  const size_t ld = static_cast<size_t>(s.ld);
  std::vector<float> keys = random_vec(static_cast<size_t>(s.n) * ld, seed);
  if (s.keys == KCenterKeys::kGrid) {  // 4 levels a coordinate: many equal distances
    for (float& x : keys) x = std::floor((x + 1.0f) * 2.0f) * 0.75f;
  } else if (s.keys == KCenterKeys::kDuplicates) {  // every third point repeats an earlier one
    for (int j = 3; j < s.n; j += 3) {
      std::copy_n(&keys[static_cast<size_t>(j / 2) * ld], s.dim,
                  &keys[static_cast<size_t>(j) * ld]);
    }
  }
  return keys;
}

// Every problem's keys back to back in one device buffer (different rows, strides and
// alignments); outputs in shared buffers pre-filled with kUnwritten, each problem's regions one
// entry longer than it may write. Problem i has an assignment unless i % 4 == 3 and cluster
// sizes unless i % 4 == 1 (both kinds of null, and both outputs on most problems).
inline void run_kcenter_batch(const std::vector<KCenterSpec>& specs) {
  constexpr int32_t kUnwritten = -7;
  const size_t count = specs.size();
  std::vector<float> keys;
  std::vector<size_t> key_at(count), centre_at(count), point_at(count);
  size_t centre_entries = 0, point_entries = 0;
  int active = 0;
  for (size_t i = 0; i < count; ++i) {
    const KCenterSpec& s = specs[i];
    const std::vector<float> k = kcenter_keys(s, 300 + i);
    key_at[i] = keys.size();
    keys.insert(keys.end(), k.begin(), k.end());
    const int m = std::min(std::max(s.k, 0), s.n);
    active += m > 0;
    centre_at[i] = centre_entries;
    centre_entries += static_cast<size_t>(m) + 1;
    point_at[i] = point_entries;
    point_entries += static_cast<size_t>(s.n) + 1;
  }
  keys.push_back(0.0f);  // never read; keeps the buffer non-empty
  const auto kd = to_device(keys);
  const std::vector<int32_t> fresh_c(centre_entries, kUnwritten);
  const std::vector<int32_t> fresh_p(point_entries, kUnwritten);
  // [0]: the batch; [1]: one kcenter_greedy call per problem.
  cu::DeviceBuffer<int32_t> centres[2] = {to_device(fresh_c), to_device(fresh_c)};
  cu::DeviceBuffer<int32_t> sizes[2] = {to_device(fresh_c), to_device(fresh_c)};
  cu::DeviceBuffer<int32_t> assignment[2] = {to_device(fresh_p), to_device(fresh_p)};
  std::vector<cu::KCenterProblem> problems(count);
  for (int run = 0; run < 2; ++run) {
    for (size_t i = 0; i < count; ++i) {
      const KCenterSpec& s = specs[i];
      cu::KCenterProblem& p = problems[i];
      p.args = {kd.data() + key_at[i], s.n, s.dim, s.ld, s.k};
      p.centres = centres[run].data() + centre_at[i];
      p.assignment = i % 4 == 3 ? nullptr : assignment[run].data() + point_at[i];
      p.cluster_sizes = i % 4 == 1 ? nullptr : sizes[run].data() + centre_at[i];
      if (run == 1) {
        ASSERT_EQ(cu::kcenter_greedy(p.args, p.centres, p.assignment, p.cluster_sizes),
                  cu::kcenter_count(p.args));
      }
    }
    if (run == 0) {
      const int launches = (active + cu::kMaxKCenterBatch - 1) / cu::kMaxKCenterBatch;
      ASSERT_EQ(cu::kcenter_greedy_batch(problems), launches);
    }
  }
  const std::vector<int32_t> bc = to_host(centres[0]), bs = to_host(sizes[0]),
                             ba = to_host(assignment[0]);
  EXPECT_EQ(bc, to_host(centres[1])) << "batch vs per-problem centres";
  EXPECT_EQ(bs, to_host(sizes[1])) << "batch vs per-problem cluster sizes";
  EXPECT_EQ(ba, to_host(assignment[1])) << "batch vs per-problem assignment";
  for (size_t i = 0; i < count; ++i) {
    const KCenterSpec& s = specs[i];
    SCOPED_TRACE(testing::Message() << "problem " << i << ": n " << s.n << " dim " << s.dim
                                    << " ld " << s.ld << " k " << s.k);
    const int m = std::min(std::max(s.k, 0), s.n);
    std::vector<int32_t> wc(std::max(m, 1), kUnwritten), ws(std::max(m, 1), kUnwritten);
    std::vector<int32_t> wa(s.n, kUnwritten);
    const kernels::cpu::KCenterArgs a{keys.data() + key_at[i], s.n, s.dim, s.ld, s.k};
    ASSERT_EQ(kernels::cpu::kcenter_greedy(a, wc.data(), wa.data(), ws.data()), m);
    // The expected region: the CPU's m entries, then kUnwritten (the guard; all of it for m = 0).
    wc.resize(m + 1, kUnwritten);
    ws.resize(m + 1, kUnwritten);
    wa.resize(s.n + 1, kUnwritten);
    if (i % 4 == 3) std::fill(wa.begin(), wa.end(), kUnwritten);
    if (i % 4 == 1) std::fill(ws.begin(), ws.end(), kUnwritten);
    auto region = [](const std::vector<int32_t>& v, size_t at, size_t n) {
      return std::vector<int32_t>(v.begin() + at, v.begin() + at + n);
    };
    EXPECT_EQ(region(bc, centre_at[i], m + 1), wc) << "centres";
    EXPECT_EQ(region(bs, centre_at[i], m + 1), ws) << "cluster sizes";
    EXPECT_EQ(region(ba, point_at[i], s.n + 1), wa) << "assignment";
  }
}

// Named batches: awkward sizes together (no centre: n = 0, k = 0, k < 0; n = 1; k > n; k = n;
// duplicates; 4097 points; a head-like 600 x 128), each at its own ld; a batch of more problems
// than one launch takes; a batch of one.
inline std::vector<std::pair<std::string, std::vector<KCenterSpec>>> kcenter_batch_cases() {
  using K = KCenterKeys;
  std::vector<std::pair<std::string, std::vector<KCenterSpec>>> cases;
  cases.push_back({"mixed",
                   {{0, 8, 8, 3},
                    {5, 8, 11, 0},
                    {1, 8, 8, 3},
                    {7, 4, 4, 20},
                    {17, 5, 9, 7, K::kDuplicates},
                    {4097, 16, 19, 64, K::kDuplicates},
                    {600, 128, 128, 300, K::kGrid},
                    {33, 1, 3, 33, K::kGrid},
                    {9, 3, 3, -2},
                    {4097, 7, 7, 5, K::kGrid},
                    {3, 2, 5, 1, K::kDuplicates},
                    {64, 64, 70, 63}}});
  std::vector<KCenterSpec> many;
  for (int i = 0; i < 2 * cu::kMaxKCenterBatch + 22; ++i) {  // k = 0 for every ninth: skipped
    const int dim = 1 + i % 6;
    many.push_back({1 + (i * 7) % 23, dim, dim + i % 3, i % 9, static_cast<K>(i % 3)});
  }
  cases.push_back({"chunked", many});
  cases.push_back({"one", {{4097, 16, 16, 64, K::kDuplicates}}});
  cases.push_back({"none_chosen", {{0, 4, 4, 2}, {6, 4, 4, 0}}});
  return cases;
}

}  // namespace kvb::parity
