// GEMM against weights stored [out, in], CUDA twin of kernels/cpu/matmul.h, through cuBLAS:
// y[n, m] = x[n, k] w[m, k]^T (+ bias[m]). f32 inputs (pedantic f32 compute: no TF32), and bf16
// inputs with f32 accumulation and f32 output (cublasGemmEx, CUBLAS_COMPUTE_32F). cuBLAS fixes
// no summation order, so results match the CPU to rounding, not bitwise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace kvb::kernels::cuda {

// Device pointers. y: [n, m]; x: [n, k]; w: [m, k]; bias: [m] or nullptr. n, m, k >= 0
// (k == 0 gives bias or 0); y must not alias x, w or bias.
void matmul(float* y, const float* x, const float* w, const float* bias, int n, int k, int m,
            cudaStream_t stream = 0);

// The same with bf16 x and w (f32 accumulation, f32 y and bias).
void matmul(float* y, const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, int n,
            int k, int m, cudaStream_t stream = 0);

// dst[i] = bf16(src[i]) rounded to nearest even (NaN stays NaN). src, dst: device [count].
void f32_to_bf16(__nv_bfloat16* dst, const float* src, size_t count, cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
