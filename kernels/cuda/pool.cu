// 1-D pooling, CUDA twin of cpu/pool: one thread per output, the CPU's window loop verbatim
// (pool.cuh).
#include "kernels/cuda/pool.h"

#include <cstdint>

#include "kernels/cuda/pool.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {
__global__ void pool_kernel(const float* in, float* out, int rows, int n, int kernel, bool max) {
  const size_t total = static_cast<size_t>(rows) * n;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float* x = in + (idx / n) * n;  // [n]
    out[idx] = detail::pool_at(x, n, static_cast<int>(idx % n), kernel, max);
  }
}
}  // namespace

void pool1d(const float* in, float* out, int rows, int n, int kernel, PoolKind kind,
            cudaStream_t stream) {
  KVB_CHECK(kernel >= 1 && kernel % 2 == 1)
      << "cuda::pool1d: kernel must be odd and >= 1 for same padding, got " << kernel;
  KVB_CHECK(rows >= 0 && n >= 0) << "cuda::pool1d: rows = " << rows << ", n = " << n;
  const size_t total = static_cast<size_t>(rows) * n;
  if (total == 0) return;
  const auto in_at = reinterpret_cast<uintptr_t>(in), out_at = reinterpret_cast<uintptr_t>(out);
  const uintptr_t bytes = total * sizeof(float);
  KVB_CHECK(in_at + bytes <= out_at || out_at + bytes <= in_at)
      << "cuda::pool1d: in and out overlap";
  const unsigned blocks = grid_for(total, 256) > 65535u ? 65535u : grid_for(total, 256);
  pool_kernel<<<blocks, 256, 0, stream>>>(in, out, rows, n, kernel, kind == PoolKind::kMax);
  KVB_CUDA_CHECK_LAUNCH();
}
}  // namespace kvb::kernels::cuda
