// One output of kernels/cpu/pool1d on the device: the CPU's window loop verbatim, shared by
// cuda::pool1d (pool.cu) and the SnapKV window scores of CudaPolicyOps, so both are its bits.
#pragma once

namespace kvb::kernels::cuda::detail {

// x: [n] (device); 0 <= j < n; kernel odd >= 1. max: the window's max (a NaN propagates, as the
// CPU's `x[i] > m || isnan(x[i])`); avg: the window's sum left to right in double, divided by
// `kernel` (count_include_pad) and rounded to f32 once.
__device__ __forceinline__ float pool_at(const float* x, int n, int j, int kernel, bool max) {
  const int pad = kernel / 2;
  const int lo = j - pad < 0 ? 0 : j - pad;
  const int hi = j + pad > n - 1 ? n - 1 : j + pad;
  if (max) {
    float m = x[lo];
    for (int i = lo + 1; i <= hi; ++i) {
      if (x[i] > m || isnan(x[i])) m = x[i];
    }
    return m;
  }
  double s = 0;
  for (int i = lo; i <= hi; ++i) s += x[i];
  return static_cast<float>(s / kernel);
}

}  // namespace kvb::kernels::cuda::detail
