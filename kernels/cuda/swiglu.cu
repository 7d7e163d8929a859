// SwiGLU and GeGLU, CUDA twins of cpu/swiglu: silu(x) = x / (1 + exp(-x)) with the accurate
// expf; gelu_tanh with the accurate tanhf, the products rounded as the CPU's (no fma).
#include "kernels/cuda/swiglu.h"

#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {
__device__ __forceinline__ float silu_mul(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u);
}
__device__ __forceinline__ float gelu_tanh_mul(float g, float u) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
  const float inner = __fmul_rn(0.7978845608028654f, __fadd_rn(g, cube));
  const float half_g = __fmul_rn(0.5f, g);
  return __fmul_rn(__fmul_rn(half_g, __fadd_rn(1.0f, tanhf(inner))), u);
}
__global__ void swiglu_kernel(float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    gate[i] = silu_mul(gate[i], up[i]);
  }
}
__global__ void geglu_tanh_kernel(float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    gate[i] = gelu_tanh_mul(gate[i], up[i]);
  }
}
__global__ void glu_stacked_kernel(float* out, __nv_bfloat16* out16, const float* in, int h,
                                   size_t total, bool gelu) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = i / h, j = i - t * h;
    const float* row = in + t * 2 * h;
    const float v = gelu ? gelu_tanh_mul(row[j], row[h + j]) : silu_mul(row[j], row[h + j]);
    out[i] = v;
    if (out16) out16[i] = __float2bfloat16_rn(v);
  }
}
}  // namespace

void glu_stacked(float* out, __nv_bfloat16* out16, const float* in, int n, int h, bool gelu_tanh,
                 cudaStream_t stream) {
  KVB_CHECK(n >= 0 && h > 0) << "cuda::glu_stacked: n = " << n << ", h = " << h;
  const size_t total = static_cast<size_t>(n) * h;
  if (total == 0) return;
  KVB_CHECK(out != nullptr && in != nullptr) << "cuda::glu_stacked: null pointer";
  const unsigned blocks = grid_for(total, 256) > 65535u ? 65535u : grid_for(total, 256);
  glu_stacked_kernel<<<blocks, 256, 0, stream>>>(out, out16, in, h, total, gelu_tanh);
  KVB_CUDA_CHECK_LAUNCH();
}

void geglu_tanh(float* gate, const float* up, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  KVB_CHECK(gate != nullptr && up != nullptr) << "cuda::geglu_tanh: null pointer";
  const unsigned blocks = grid_for(n, 256) > 65535u ? 65535u : grid_for(n, 256);
  geglu_tanh_kernel<<<blocks, 256, 0, stream>>>(gate, up, n);
  KVB_CUDA_CHECK_LAUNCH();
}

void swiglu(float* gate, const float* up, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  KVB_CHECK(gate != nullptr && up != nullptr) << "cuda::swiglu: null pointer";
  const unsigned blocks = grid_for(n, 256) > 65535u ? 65535u : grid_for(n, 256);
  swiglu_kernel<<<blocks, 256, 0, stream>>>(gate, up, n);
  KVB_CUDA_CHECK_LAUNCH();
}
}  // namespace kvb::kernels::cuda
