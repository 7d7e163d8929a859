// RMSNorm, CUDA twin of kernels/cpu/rmsnorm.h: y = x / sqrt(mean(x^2) + eps) * weight.
#pragma once

#include <cuda_runtime.h>

namespace kvb::kernels::cuda {
// Device pointers. y, x: [n, dim] (may alias); weight: [dim]. One block per row; the mean of
// squares is accumulated in double (block tree instead of the CPU's left-to-right sum).
void rmsnorm(float* y, const float* x, const float* weight, int n, int dim, float eps,
             cudaStream_t stream = 0);
}  // namespace kvb::kernels::cuda
