// Small vector helpers with a fixed summation order (8 interleaved partial sums, then a fixed
// tree), so results do not depend on the compiler's vectorization choices.
#pragma once

#include <cstddef>

namespace kvb::kernels::cpu {

// sum_i a[i] * b[i]; a, b: [n].
inline float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// y[i] += alpha * x[i]; x, y: [n].
inline void axpy(float* y, float alpha, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace kvb::kernels::cpu
