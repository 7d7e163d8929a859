// RMSNorm, CUDA twin of kernels/cpu/rmsnorm.h: y = x / sqrt(mean(x^2) + eps) * weight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kvb::kernels::cuda {
// Device pointers. y, x: [n, dim] (may alias); weight: [dim]. One block per row; the mean of
// squares is accumulated in double (block tree instead of the CPU's left-to-right sum). y16
// (nullable, [n, dim]): y rounded to bf16 as f32_to_bf16 rounds it, in the same launch (the
// input of a bf16 product).
void rmsnorm(float* y, const float* x, const float* weight, int n, int dim, float eps,
             cudaStream_t stream = 0, __nv_bfloat16* y16 = nullptr);
}  // namespace kvb::kernels::cuda
