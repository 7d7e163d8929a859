#include "kernels/cpu/sketch.h"

#include <cmath>
#include <numbers>

#include "common/error.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/subgen_counter.h"

namespace kvb::kernels::cpu {

std::vector<float> gaussian_sketch(uint64_t seed, int layer, int head, int rows, int cols) {
  KVB_CHECK(layer >= 0 && head >= 0 && rows >= 0 && cols >= 0)
      << "gaussian_sketch: layer " << layer << ", head " << head << ", " << rows << " x " << cols;
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (size_t e = 0; e < out.size(); ++e) {
    const double u = counter_uniform(seed, static_cast<uint32_t>(layer),
                                     static_cast<uint32_t>(head), kSketchStep, 2 * e);
    const double v = counter_uniform(seed, static_cast<uint32_t>(layer),
                                     static_cast<uint32_t>(head), kSketchStep, 2 * e + 1);
    const double radius = std::sqrt(-2.0 * std::log(1.0 - u));
    out[e] = static_cast<float>(radius * std::cos(2.0 * std::numbers::pi * v));
  }
  return out;
}

std::vector<float> key_sketches(uint64_t seed, int layer, int first_head, int heads, int d, int k,
                                bool adjacent, int rot_dim) {
  KVB_CHECK(heads >= 0 && d >= 1 && k >= 1 && rot_dim >= 0 && rot_dim <= d)
      << "key_sketches: " << heads << " heads of " << d << " x " << k << ", rot_dim " << rot_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k)));
  std::vector<float> out(static_cast<size_t>(heads) * d * k);
  for (int h = 0; h < heads; ++h) {
    const std::vector<float> z = gaussian_sketch(seed, layer, first_head + h, d, k);
    for (int j = 0; j < d; ++j) {
      const int from = hf_channel_of_row(j, adjacent, rot_dim);
      for (int c = 0; c < k; ++c) {
        out[(static_cast<size_t>(h) * d + j) * k + c] =
            z[static_cast<size_t>(from) * k + c] * scale;
      }
    }
  }
  return out;
}

}  // namespace kvb::kernels::cpu
