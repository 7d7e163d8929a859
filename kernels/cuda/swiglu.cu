// SwiGLU and GeGLU, CUDA twins of cpu/swiglu: silu(x) = x / (1 + exp(-x)) with the accurate
// expf; gelu_tanh with the accurate tanhf, the products rounded as the CPU's (no fma).
#include "kernels/cuda/swiglu.h"

#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {
__global__ void swiglu_kernel(float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), up[i]);
  }
}
__global__ void geglu_tanh_kernel(float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float inner = __fmul_rn(0.7978845608028654f, __fadd_rn(g, cube));
    const float half_g = __fmul_rn(0.5f, g);
    gate[i] = __fmul_rn(__fmul_rn(half_g, __fadd_rn(1.0f, tanhf(inner))), up[i]);
  }
}
}  // namespace

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
