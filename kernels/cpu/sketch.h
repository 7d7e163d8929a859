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

// LeverageScorePress's sketches of a layer's KV heads first_head .. first_head + heads - 1 (global
// indices), [heads, d, k] row-major: gaussian_sketch(seed, layer, head, d, k) times float(1 /
// sqrt(k)) (an f32 product, as torch scales randn's draws), its rows drawn in Hugging Face's
// channel order. With `adjacent` (the model's rows rotate adjacent pairs: a GGUF llama's K rows,
// permuted at conversion) row j < rot_dim is HF's channel j / 2 for an even j and rot_dim / 2 +
// j / 2 for an odd one, so that one model gets one sketch from either file.
std::vector<float> key_sketches(uint64_t seed, int layer, int first_head, int heads, int d, int k,
                                bool adjacent, int rot_dim);

}  // namespace kvb::kernels::cpu
