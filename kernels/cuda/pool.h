// 1-D max/avg pooling along the token axis (stride 1, same padding), CUDA twin of
// kernels/cpu/pool.h, bit-identical to it (the same window order; avg sums in double).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cpu/pool.h"

namespace kvb::kernels::cuda {
using cpu::PoolKind;
// in, out: device [rows, n], must not alias; kernel odd >= 1 (see cpu::pool1d for the rule).
void pool1d(const float* in, float* out, int rows, int n, int kernel, PoolKind kind,
            cudaStream_t stream = 0);
}  // namespace kvb::kernels::cuda
