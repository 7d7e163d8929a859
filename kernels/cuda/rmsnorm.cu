// RMSNorm, CUDA twin of cpu/rmsnorm: one block per row, double sum of squares, f32 scaling.
#include "kernels/cuda/rmsnorm.h"

#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(float* y, const float* x, const float* weight, int dim, float eps,
                               __nv_bfloat16* y16) {
  const float* xt = x + static_cast<size_t>(blockIdx.x) * dim;  // [dim]
  float* yt = y + static_cast<size_t>(blockIdx.x) * dim;        // [dim]
  double ss = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xt[i]) * xt[i];
  __shared__ double part[kThreads];
  part[threadIdx.x] = ss;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(part[0] / dim + eps));
  // All reads of x happened before the barriers above, so y may alias x.
  __nv_bfloat16* y16t = y16 ? y16 + static_cast<size_t>(blockIdx.x) * dim : nullptr;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = __fmul_rn(xt[i], inv) * weight[i];
    yt[i] = v;
    if (y16t) y16t[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

void rmsnorm(float* y, const float* x, const float* weight, int n, int dim, float eps,
             cudaStream_t stream, __nv_bfloat16* y16) {
  KVB_CHECK(n >= 0 && dim > 0) << "cuda::rmsnorm: n = " << n << ", dim = " << dim;
  KVB_CHECK(eps >= 0) << "cuda::rmsnorm: eps = " << eps;
  if (n == 0) return;
  rmsnorm_kernel<<<n, kThreads, 0, stream>>>(y, x, weight, dim, eps, y16);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
