// SwiGLU and GeGLU (tanh GELU), CPU reference: silu(x) = x / (1 + exp(-x)).
#include "kernels/cpu/swiglu.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/exp_exact.h"

namespace kvb::kernels::cpu {
// gate[i] = g / (1 + std::exp(-g)) * up[i], g = gate[i]: the exponentials of a chunk at once
// (exp_floats: std::exp's bits).
void swiglu(float* gate, const float* up, size_t n) {
  constexpr size_t kChunk = 256;
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t i0 = static_cast<size_t>(c) * kChunk;
    const int len = static_cast<int>(std::min(kChunk, n - i0));
    float e[kChunk];
    for (int j = 0; j < len; ++j) e[j] = -gate[i0 + j];
    exp_floats(e, e, len);
    for (int j = 0; j < len; ++j) {
      const float g = gate[i0 + j];
      gate[i0 + j] = g / (1.0f + e[j]) * up[i0 + j];
    }
  }
}

void geglu_tanh(float* gate, const float* up, size_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float inner = kSqrt2OverPi * (g + 0.044715f * g * g * g);
    gate[i] = 0.5f * g * (1.0f + std::tanh(inner)) * up[i];
  }
}
void geglu_sigmoid(float* gate, const float* up, size_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr size_t kChunk = 256;
  const size_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t c = 0; c < chunks; ++c) {
    float e[kChunk];
    const size_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
    for (size_t i = 0; i < m; ++i) {
      const float g = gate[i0 + i];
      e[i] = -2.0f * (kSqrt2OverPi * (g + 0.044715f * g * g * g));
    }
    exp_floats(e, e, static_cast<int>(m));
    for (size_t i = 0; i < m; ++i) gate[i0 + i] = gate[i0 + i] / (1.0f + e[i]) * up[i0 + i];
  }
}
}  // namespace kvb::kernels::cpu
