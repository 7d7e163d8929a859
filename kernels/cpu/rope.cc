// RoPE, CPU reference; angle = position * inv_freq in f32 (as HF computes it), sin/cos exact.
#include "kernels/cpu/rope.h"

#include <cmath>

#include "common/error.h"

namespace kvb::kernels::cpu {
std::vector<float> rope_inv_freqs(const RopeParams& p) {
  const int half = p.rot_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    float f = 1.0f / std::pow(p.theta, static_cast<float>(2 * i) / static_cast<float>(p.rot_dim));
    if (!p.freq_factors.empty()) f /= p.freq_factors[i];
    inv_freq[i] = f;
  }
  return inv_freq;
}

std::vector<float> rope_mean_rotation(const RopeParams& p, int32_t first, int count) {
  KVB_CHECK(p.rot_dim > 0 && p.rot_dim % 2 == 0 && count >= 1 && first >= 0)
      << "rope_mean_rotation: rot_dim " << p.rot_dim << ", positions " << first << " + "
      << count;
  const int half = p.rot_dim / 2;
  const std::vector<float> inv_freq = rope_inv_freqs(p);
  std::vector<double> c(half, 0.0), s(half, 0.0);
  for (int k = 0; k < count; ++k) {
    const float position = static_cast<float>(first + k) / p.linear_scale;
    for (int i = 0; i < half; ++i) {
      const float angle = position * inv_freq[i];
      c[i] += static_cast<float>(std::cos(static_cast<double>(angle))) * p.attn_factor;
      s[i] += static_cast<float>(std::sin(static_cast<double>(angle))) * p.attn_factor;
    }
  }
  std::vector<float> out(2 * static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    out[i] = static_cast<float>(c[i] / count);
    out[half + i] = static_cast<float>(s[i] / count);
  }
  return out;
}

void rope(float* x, const int32_t* pos, int n, int num_heads, int head_dim,
          const RopeParams& p) {
  const int half = p.rot_dim / 2;
  KVB_CHECK(p.rot_dim > 0 && p.rot_dim <= head_dim && p.rot_dim % 2 == 0)
      << "rope: rot_dim " << p.rot_dim << " head_dim " << head_dim;
  const std::vector<float> inv_freq = rope_inv_freqs(p);
#pragma omp parallel for schedule(static) if (n > 8)
  for (int t = 0; t < n; ++t) {
    const float position = static_cast<float>(pos[t]) / p.linear_scale;
    std::vector<float> c(half), s(half);
    for (int i = 0; i < half; ++i) {
      const float angle = position * inv_freq[i];
      c[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * p.attn_factor;
      s[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * p.attn_factor;
    }
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (static_cast<size_t>(t) * num_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const int a = p.style == RopeStyle::kNorm ? 2 * i : i;
        const int b = p.style == RopeStyle::kNorm ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c[i] - x1 * s[i];
        v[b] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}
}  // namespace kvb::kernels::cpu
