// Gaussian sketches drawn from a counter (no generator state): the random projections of
// kvpress's LeverageScorePress (Compactor's right sketch), made reproducible. Entry (i, c) of the
// rows x cols sketch of (seed, layer, head) is Box-Muller's z = sqrt(-2 ln(1 - u)) cos(2 pi v) of
// two counter_uniform draws (subgen_counter.h), u at slot 2 (i cols + c) and v at the next, step
// kSketchStep, in f64 with the C library's log, cos and sqrt, rounded to f32. scripts/
// compare_kvpress.py draws the same values in Python (math.log, math.cos and math.sqrt are the
// C library's) and hands them to kvpress in place of torch.randn's.
#pragma once

#include <cstdint>
#include <vector>

namespace kvb::kernels::cpu {

inline constexpr uint64_t kSketchStep = 0x736b65746368ull;  // "sketch"

// The rows x cols sketch of (seed, layer, head), row-major.
std::vector<float> gaussian_sketch(uint64_t seed, int layer, int head, int rows, int cols);

}  // namespace kvb::kernels::cpu
