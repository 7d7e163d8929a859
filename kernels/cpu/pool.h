// 1-D pooling along the token axis of SnapKV-family scores (POLICIES.md `snapkv`: "1-D pooling
// (stride 1, same padding, kernel 7)"), matching the authors' PyTorch calls
// F.max_pool1d(a, kernel, padding=kernel//2, stride=1) and F.avg_pool1d(a, kernel,
// padding=kernel//2, stride=1) with their defaults (avg: count_include_pad=True).
#pragma once

namespace kvb::kernels::cpu {

enum class PoolKind { kMax, kAvg };

// in, out: [rows, n], must not alias. kernel: odd, >= 1. With p = kernel / 2, for every row:
//   max: out[j] = max_{i in [max(0, j-p), min(n-1, j+p)]} in[i]   (padding never wins, as
//        PyTorch pads with -inf; a NaN in the window propagates, as PyTorch's CPU kernel does)
//   avg: out[j] = (sum_{i in [max(0, j-p), min(n-1, j+p)]} in[i]) / kernel
//        (count_include_pad=True: the padded zeros count in the divisor, so edge outputs shrink;
//        the sum is taken left to right in double, then divided and rounded to f32 once)
// The output has n entries per row (stride 1, same padding), also when kernel > n.
void pool1d(const float* in, float* out, int rows, int n, int kernel, PoolKind kind);

}  // namespace kvb::kernels::cpu
