// Small vector helpers with a fixed summation order (8 interleaved partial sums, then a fixed
// tree), so results do not depend on the compiler's vectorization choices.
#pragma once

#include <cmath>
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

// The fixed reduction tree of matmul (kernels/cpu/matmul.h) over 16 lane sums.
inline float tree16(const float* a) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// sum_i a[i] * b[i] in matmul's exact order (16 fma lanes, i = l mod 16, then tree16), so a
// row computed here has the bits matmul gives for it. a, b: [n].
inline float dot_matmul_order(const float* a, const float* b, int n) {
  float acc[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  }
  for (int l = 0; i + l < n; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  return tree16(acc);
}

}  // namespace kvb::kernels::cpu
