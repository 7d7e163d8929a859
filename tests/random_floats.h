// Floats drawn uniformly from [-1, 1) by mt19937 from a seed: the operands of the matmul tests
// (the same draws for a seed on every machine and run).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kvb::test {

inline std::vector<float> random_vec(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& f : v) f = dist(gen);
  return v;
}

}  // namespace kvb::test
