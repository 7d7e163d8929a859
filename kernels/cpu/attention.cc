// Causal GQA attention over the ragged per-head cache, CPU reference.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/vec.h"

namespace kvb::kernels::cpu {

void attention(const AttentionArgs& a) {
  const LayerKvView& kv = a.kv;
  const int d = kv.head_dim;
  KVB_CHECK(a.num_heads % kv.num_kv_heads == 0)
      << "num_heads " << a.num_heads << " not a multiple of num_kv_heads " << kv.num_kv_heads;
  const int group = a.num_heads / kv.num_kv_heads;
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    KVB_CHECK(kv.lengths[h] >= a.n) << "attention: head " << h << " holds " << kv.lengths[h]
                                    << " slots, fewer than the " << a.n << " queries";
  }
  const int total = a.num_heads * a.n;
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 4)
    for (int job = 0; job < total; ++job) {
      // Heads outermost inside a thread's run keeps one KV head's keys hot in cache.
      const int h = job / a.n, i = job % a.n;
      const int kvh = h / group;
      const int visible = kv.lengths[kvh] - a.n + i + 1;
      const float* q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * d;
      float* out = a.out + (static_cast<size_t>(i) * a.num_heads + h) * d;
      scores.resize(visible);
      float max_score = -INFINITY;
      for (int s = 0; s < visible; ++s) {
        scores[s] = dot(q, kv.key(kvh, s), d) * a.scale;
        max_score = std::max(max_score, scores[s]);
      }
      double sum = 0;
      for (int s = 0; s < visible; ++s) {
        scores[s] = std::exp(scores[s] - max_score);
        sum += scores[s];
      }
      const float inv = static_cast<float>(1.0 / sum);
      std::fill(out, out + d, 0.0f);
      for (int s = 0; s < visible; ++s) axpy(out, scores[s] * inv, kv.value(kvh, s), d);
    }
  }
}

}  // namespace kvb::kernels::cpu
