// 1-D max/avg pooling with stride 1 and same padding, CPU reference for SnapKV scores
// (POLICIES.md `snapkv`). Direct O(n * kernel) windows: the kernel is small (7) and a fixed
// window order keeps the result independent of thread count.
#include "kernels/cpu/pool.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/error.h"

namespace kvb::kernels::cpu {

void pool1d(const float* in, float* out, int rows, int n, int kernel, PoolKind kind) {
  KVB_CHECK(kernel >= 1 && kernel % 2 == 1)
      << "pool1d: kernel must be odd and >= 1 for same padding, got " << kernel;
  KVB_CHECK(rows >= 0 && n >= 0) << "pool1d: rows = " << rows << ", n = " << n;
  const size_t total = static_cast<size_t>(rows) * n;
  if (total == 0) return;
  const auto in_at = reinterpret_cast<uintptr_t>(in), out_at = reinterpret_cast<uintptr_t>(out);
  const uintptr_t bytes = total * sizeof(float);
  KVB_CHECK(in_at + bytes <= out_at || out_at + bytes <= in_at) << "pool1d: in and out overlap";
  const int pad = kernel / 2;
#pragma omp parallel for schedule(static) if (total > 4096)
  for (int r = 0; r < rows; ++r) {
    const float* x = in + static_cast<size_t>(r) * n;
    float* y = out + static_cast<size_t>(r) * n;
    for (int j = 0; j < n; ++j) {
      const int lo = std::max(0, j - pad);
      const int hi = std::min(n - 1, j + pad);
      if (kind == PoolKind::kMax) {
        float m = x[lo];
        for (int i = lo + 1; i <= hi; ++i) {
          if (x[i] > m || std::isnan(x[i])) m = x[i];
        }
        y[j] = m;
      } else {
        double s = 0;
        for (int i = lo; i <= hi; ++i) s += x[i];
        y[j] = static_cast<float>(s / kernel);
      }
    }
  }
}

}  // namespace kvb::kernels::cpu
