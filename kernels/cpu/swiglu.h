// Gated feed-forward activations (Shazeer 2020): SwiGLU out = silu(gate) * up (Llama, Qwen), and
// GeGLU with the tanh approximation of GELU out = gelu_tanh(gate) * up (Gemma; PyTorch's
// gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
#pragma once

#include <cstddef>

namespace kvb::kernels::cpu {
// gate: [n] (overwritten with the result); up: [n].
void swiglu(float* gate, const float* up, size_t n);
void geglu_tanh(float* gate, const float* up, size_t n);
// The same GELU written as 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715
// x^3): out = (g / (1 + exp(-2u))) * up with exp_floats (std::exp's bits on every SIMD path, 16
// at a time) where geglu_tanh calls the scalar tanhf, which took 20% of a Gemma-3 prefill. Within
// a few ulp of geglu_tanh, not its bits: --dtype native's (llama.cpp's family: ggml tabulates
// GELU in f16); the f32 reference keeps geglu_tanh. Bits independent of KVB_ISA.
void geglu_sigmoid(float* gate, const float* up, size_t n);
}  // namespace kvb::kernels::cpu
