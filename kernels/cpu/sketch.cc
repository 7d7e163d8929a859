#include "kernels/cpu/sketch.h"

#include <cmath>
#include <numbers>

#include "common/error.h"
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

}  // namespace kvb::kernels::cpu
