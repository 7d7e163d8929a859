// Rotary position embedding (Su et al. 2021). Two pairings: kNorm rotates adjacent pairs
// (x[2i], x[2i+1]) as llama2.c and llama.cpp's GGUF llama models (whose Q/K rows were permuted at
// conversion); kNeox rotates (x[i], x[i + d/2]) as HF rotate_half and Qwen2/Gemma GGUFs.
#pragma once

#include <cstdint>
#include <vector>

namespace kvb::kernels::cpu {

enum class RopeStyle { kNorm, kNeox };

struct RopeParams {
  RopeStyle style = RopeStyle::kNorm;
  int rot_dim = 0;             // rotated dimensions per head (<= head_dim)
  float theta = 10000.0f;      // base
  float linear_scale = 1.0f;   // positions are divided by this ("linear" scaling)
  std::vector<float> freq_factors;  // optional [rot_dim/2] divisors of the frequencies (llama3,
                                    // Phi-3 LongRoPE, YaRN's blend expressed per dimension)
  float attn_factor = 1.0f;  // multiplies cos and sin (YaRN mscale, LongRoPE's attention factor)
};

// The Hugging Face channel that row j of a head holds: with `adjacent` (the model's rows rotate
// adjacent pairs: a GGUF llama's Q/K rows, permuted at conversion from HF's halves) row j <
// rot_dim is channel j / 2 for an even j and rot_dim / 2 + j / 2 for an odd one; otherwise j.
inline int hf_channel_of_row(int j, bool adjacent, int rot_dim) {
  return adjacent && j < rot_dim ? (j % 2 == 0 ? j / 2 : rot_dim / 2 + j / 2) : j;
}

// rope()'s inverse frequencies [rot_dim / 2]: 1 / theta^(2i / rot_dim) in f32, divided by the
// frequency factor where there is one (what a device computes with, to get the host's bits).
std::vector<float> rope_inv_freqs(const RopeParams& params);

// Applies RoPE in place to x: [n, num_heads, head_dim] at positions pos: [n].
// Frequencies are computed in f32 as HF does: inv_freq[i] = 1 / theta^(2i/rot_dim); cos and sin
// are rounded to f32 and then multiplied by attn_factor in f32 (HF's `cos() * attention_scaling`).
void rope(float* x, const int32_t* pos, int n, int num_heads, int head_dim,
          const RopeParams& params);

// rope()'s rotation averaged over the positions [first, first + count), count >= 1 (kvpress
// ExpectedAttentionPress's mean rotation of future queries): per pair i < rot_dim / 2, entry i is
// the mean of rope()'s f32 cosines (times attn_factor) and entry rot_dim / 2 + i the mean of its
// sines, summed in f64 in position order, divided by count and rounded to f32.
std::vector<float> rope_mean_rotation(const RopeParams& params, int32_t first, int count);

}  // namespace kvb::kernels::cpu
