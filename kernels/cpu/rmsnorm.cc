// RMSNorm, CPU reference. The mean of squares is accumulated in double (llm.c's habit: the
// reference accumulates in higher precision), then the scale is applied in f32 as HF does.
#include "kernels/cpu/rmsnorm.h"

#include <cmath>

namespace kvb::kernels::cpu {
void rmsnorm(float* y, const float* x, const float* weight, int n, int dim, float eps) {
#pragma omp parallel for schedule(static) if (n > 16)
  for (int t = 0; t < n; ++t) {
    const float* xt = x + static_cast<size_t>(t) * dim;
    float* yt = y + static_cast<size_t>(t) * dim;
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int i = 0; i < dim; ++i) yt[i] = (xt[i] * inv) * weight[i];
  }
}
}  // namespace kvb::kernels::cpu
