// SwiGLU, CPU reference: silu(x) = x / (1 + exp(-x)).
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
}  // namespace kvb::kernels::cpu
