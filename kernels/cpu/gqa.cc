// reduce_gqa (gqa.h).
#include "kernels/cpu/gqa.h"

#include <algorithm>

namespace kvb::kernels::cpu {

void reduce_gqa(const float* rows, size_t row_stride, int group, int len, GqaReduce how,
                float* out) {
  for (int s = 0; s < len; ++s) {
    float acc = rows[s];
    for (int g = 1; g < group; ++g) {
      const float v = rows[g * row_stride + s];
      acc = how == GqaReduce::kMax ? std::max(acc, v) : acc + v;
    }
    out[s] = how == GqaReduce::kMax ? acc : acc / static_cast<float>(group);
  }
}

}  // namespace kvb::kernels::cpu
