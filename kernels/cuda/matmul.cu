// GEMM through cuBLAS, CUDA twin of cpu/matmul. Row-major y = x w^T is, in cuBLAS's column-major
// view, y^T (m x n) = W (m x k, op T of the k x m column-major w) * x^T (k x n): one GemmEx with
// op(A) = T, op(B) = N and no copies. The bias is broadcast into y first and added with beta = 1.
#include "kernels/cuda/matmul.h"

#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

// y[i, j] = bias[j] (or 0 with no bias).
__global__ void fill_bias_kernel(float* y, const float* bias, size_t n, int m) {
  const size_t total = n * static_cast<size_t>(m);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] = bias ? bias[i % m] : 0.0f;
  }
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16* dst, const float* src, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

unsigned capped_grid(size_t work) {
  const unsigned g = grid_for(work, 256);
  return g > 65535u ? 65535u : g;
}

void gemm(float* y, const void* x, const void* w, cudaDataType_t in_type,
          cublasComputeType_t compute, const float* bias, int n, int k, int m,
          cudaStream_t stream) {
  KVB_CHECK(n >= 0 && k >= 0 && m >= 0)
      << "cuda::matmul: n = " << n << ", k = " << k << ", m = " << m;
  if (n == 0 || m == 0) return;
  KVB_CHECK(y != nullptr && (k == 0 || (x != nullptr && w != nullptr)))
      << "cuda::matmul: null operand";
  const size_t ny = static_cast<size_t>(n) * m;
  fill_bias_kernel<<<capped_grid(ny), 256, 0, stream>>>(y, bias, n, m);
  KVB_CUDA_CHECK_LAUNCH();
  if (k == 0) return;
  const float alpha = 1.0f, beta = 1.0f;
  cublasHandle_t h = cublas_handle(stream);
  KVB_CUBLAS_CHECK(cublas().GemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, in_type, k, x,
                                in_type, k, &beta, y, CUDA_R_32F, m, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void matmul(float* y, const float* x, const float* w, const float* bias, int n, int k, int m,
            cudaStream_t stream) {
  // Pedantic: true f32 products (no TF32 even where NVIDIA_TF32_OVERRIDE or the math mode
  // would allow it); the CPU reference is f32.
  gemm(y, x, w, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC, bias, n, k, m, stream);
}

void matmul(float* y, const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, int n,
            int k, int m, cudaStream_t stream) {
  gemm(y, x, w, CUDA_R_16BF, CUBLAS_COMPUTE_32F, bias, n, k, m, stream);
}

void f32_to_bf16(__nv_bfloat16* dst, const float* src, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  KVB_CHECK(dst != nullptr && src != nullptr) << "cuda::f32_to_bf16: null pointer";
  f32_to_bf16_kernel<<<capped_grid(count), 256, 0, stream>>>(dst, src, count);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
