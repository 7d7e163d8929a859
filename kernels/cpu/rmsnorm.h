// RMSNorm (Zhang & Sennrich 2019) as Llama uses it: y = x / sqrt(mean(x^2) + eps) * weight.
#pragma once

namespace kvb::kernels::cpu {
// y, x: [n, dim] (may alias); weight: [dim]. Mean of squares accumulated in double.
void rmsnorm(float* y, const float* x, const float* weight, int n, int dim, float eps);
}  // namespace kvb::kernels::cpu
