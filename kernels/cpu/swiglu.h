// Gated feed-forward activations (Shazeer 2020): SwiGLU out = silu(gate) * up (Llama, Qwen), and
// GeGLU with the tanh approximation of GELU out = gelu_tanh(gate) * up (Gemma; PyTorch's
// gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
#pragma once

#include <cstddef>

namespace kvb::kernels::cpu {
// gate: [n] (overwritten with the result); up: [n].
void swiglu(float* gate, const float* up, size_t n);
void geglu_tanh(float* gate, const float* up, size_t n);
}  // namespace kvb::kernels::cpu
