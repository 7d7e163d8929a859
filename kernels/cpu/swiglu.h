// SwiGLU feed-forward activation (Shazeer 2020): out = silu(gate) * up.
#pragma once

#include <cstddef>

namespace kvb::kernels::cpu {
// gate: [n] (overwritten with the result); up: [n].
void swiglu(float* gate, const float* up, size_t n);
}  // namespace kvb::kernels::cpu
