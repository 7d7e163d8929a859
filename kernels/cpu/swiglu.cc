// SwiGLU and GeGLU (tanh GELU), CPU reference: silu(x) = x / (1 + exp(-x)).
#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace kvb::kernels::cpu {
void swiglu(float* gate, const float* up, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
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
}  // namespace kvb::kernels::cpu
