// Helpers of the CPU-vs-CUDA parity test (test_cuda_parity.cc): seeded counter-based inputs,
// host<->device copies, tolerance checks that report the worst element, and the tie-aware
// comparison of keep sets.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/subgen_estimator.h"  // counter_uniform
#include "kernels/cuda/runtime.h"
#include "kernels/eviction_plan.h"

namespace kvb::parity {

namespace cu = kvb::kernels::cuda;

// Uniform in [lo, hi) from (seed, i): any element reproducible on its own.
inline float uniform(uint64_t seed, uint64_t i, float lo = -1.0f, float hi = 1.0f) {
  return lo + (hi - lo) * static_cast<float>(kernels::cpu::counter_uniform(seed, 7, 0, 0, i));
}
inline std::vector<float> random_vec(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uniform(seed, i, lo, hi);
  return v;
}
// Few distinct values, so ties are common (selection cases).
inline std::vector<float> tied_vec(size_t n, uint64_t seed, int levels) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::floor(uniform(seed, i, 0.0f, static_cast<float>(levels))) * 0.25f;
  }
  return v;
}

inline uint16_t bf16_bits(float f) {  // round to nearest even (finite inputs)
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
inline float bf16_round(float f) {
  const uint32_t b = static_cast<uint32_t>(bf16_bits(f)) << 16;
  float r;
  std::memcpy(&r, &b, sizeof r);
  return r;
}

template <typename T>
cu::DeviceBuffer<T> to_device(const std::vector<T>& v) {
  cu::DeviceBuffer<T> d(v.size());
  d.upload(v.data(), v.size());
  return d;
}
template <typename T>
std::vector<T> to_host(const cu::DeviceBuffer<T>& d) {
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> v(d.size());
  d.download(v.data(), v.size());
  return v;
}
template <typename T>
std::vector<T> to_host(const T* device, size_t n) {
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> v(n);
  if (n > 0) KVB_CUDA_CHECK(cudaMemcpy(v.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// |got - want| <= abs_tol + rel_tol |want| everywhere (NaN matches only NaN); on failure one
// message naming the count and the worst index.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         double abs_tol, double rel_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double bound = abs_tol + rel_tol * std::fabs(static_cast<double>(want[i]));
    if (both_nan || err <= bound) continue;  // a NaN on one side fails here (err is NaN)
    ++bad;
    const double excess = std::isnan(err) ? 1e300 : err - bound;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " outside tolerance; worst ["
                     << worst << "] got " << got[worst] << " want " << want[worst];
}

// Bitwise equality for the ops whose contract is the CPU's exact bits; any NaN matches any NaN
// (a double-to-float conversion of NaN gives the canonical NaN on the GPU, the payload on x86).
inline void expect_bits(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ; first [" << first
                     << "] got " << got[first] << " want " << want[first];
}

// Tie-aware keep-set comparison (ggml test-backend-ops style): same size; every index kept by
// one side only must have a score equal to the boundary score (the lowest score the CPU kept),
// so only choices among tied candidates may differ. NaN boundary: NaN indices may differ.
inline void expect_keep_sets_match(std::vector<int32_t> got, std::vector<int32_t> want,
                                   const float* scores, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what << ": kept counts differ";
  ASSERT_TRUE(std::is_sorted(got.begin(), got.end())) << what << ": GPU selection not increasing";
  ASSERT_TRUE(std::adjacent_find(got.begin(), got.end()) == got.end()) << what << ": duplicates";
  if (want.empty()) return;
  auto rank_less = [&](int32_t a, int32_t b) {  // a ranks below b (NaN lowest)
    const float sa = scores[a], sb = scores[b];
    if (std::isnan(sa) != std::isnan(sb)) return std::isnan(sa);
    return sa < sb;
  };
  const int32_t boundary = *std::min_element(want.begin(), want.end(), rank_less);
  const float bscore = scores[boundary];
  std::vector<int32_t> diff;
  std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(),
                                std::back_inserter(diff));
  for (int32_t i : diff) {
    const bool tie = (std::isnan(bscore) && std::isnan(scores[i])) || scores[i] == bscore;
    EXPECT_TRUE(tie) << what << ": index " << i << " (score " << scores[i]
                     << ") differs and does not tie the boundary score " << bscore;
  }
}

// Head h (len slots) of a device plan (`gpu`, its lists downloaded into `lists`) keeps what
// the CPU instance's plan keeps: the count and the slots. Returns the CPU's list (the slots the
// state rows compacted with it must hold), empty after a count mismatch.
inline std::vector<int32_t> expect_same_keep_list(const kernels::EvictionPlan& gpu,
                                                  const std::vector<int32_t>& lists,
                                                  const kernels::EvictionPlan& cpu, int h,
                                                  int len) {
  std::vector<int32_t> want;
  cpu.keep_list(h, len, &want);
  EXPECT_EQ(gpu.device_counts()[h], static_cast<int32_t>(want.size())) << "head " << h;
  if (gpu.device_counts()[h] != static_cast<int32_t>(want.size())) return {};
  const int32_t* got = lists.data() + static_cast<size_t>(h) * gpu.device_ld();
  EXPECT_EQ(std::vector<int32_t>(got, got + want.size()), want) << "head " << h;
  return want;
}

}  // namespace kvb::parity
