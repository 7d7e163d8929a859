// Causal GQA attention over the ragged per-head cache with optional statistics, CPU reference.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/vec.h"

namespace kvb::kernels::cpu {

namespace {
// One query row: probabilities into `p` ([visible]), output into `out` ([head_dim]).
void attend_row(const float* q, const LayerKvView& kv, int kvh, int visible, float scale,
                std::vector<float>& p, float* out) {
  const int d = kv.head_dim;
  p.resize(visible);
  float max_score = -INFINITY;
  for (int s = 0; s < visible; ++s) {
    p[s] = dot(q, kv.key(kvh, s), d) * scale;
    max_score = std::max(max_score, p[s]);
  }
  double sum = 0;
  for (int s = 0; s < visible; ++s) {
    p[s] = std::exp(p[s] - max_score);
    sum += p[s];
  }
  const float inv = static_cast<float>(1.0 / sum);
  std::fill(out, out + d, 0.0f);
  for (int s = 0; s < visible; ++s) {
    p[s] *= inv;
    axpy(out, p[s], kv.value(kvh, s), d);
  }
}
}  // namespace

void attention(const AttentionArgs& a) {
  const LayerKvView& kv = a.kv;
  const int d = kv.head_dim;
  KVB_CHECK(a.num_heads % kv.num_kv_heads == 0)
      << "num_heads " << a.num_heads << " not a multiple of num_kv_heads " << kv.num_kv_heads;
  const int group = a.num_heads / kv.num_kv_heads;
  int max_len = 0;
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    KVB_CHECK(kv.lengths[h] >= a.n) << "attention: head " << h << " holds " << kv.lengths[h]
                                    << " slots, fewer than the " << a.n << " queries";
    max_len = std::max(max_len, static_cast<int>(kv.lengths[h]));
  }
  const bool stats = a.col_sums != nullptr || a.last_probs != nullptr;
  if (stats) {
    KVB_CHECK(a.stats_stride >= max_len) << "attention: stats_stride " << a.stats_stride
                                         << " < longest head " << max_len;
    const size_t rows = static_cast<size_t>(a.num_heads) * a.stats_stride;
    if (a.col_sums) std::memset(a.col_sums, 0, rows * sizeof(float));
    if (a.last_probs) {
      KVB_CHECK(a.last_w >= 1 && a.last_w <= a.n) << "attention: last_w " << a.last_w
                                                  << " outside [1, " << a.n << "]";
      std::memset(a.last_probs, 0, rows * a.last_w * sizeof(float));
    }
  }
  auto row = [&](int h, int i, std::vector<float>& p) {
    const int kvh = h / group;
    const int visible = kv.lengths[kvh] - a.n + i + 1;
    const float* q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * d;
    float* out = a.out + (static_cast<size_t>(i) * a.num_heads + h) * d;
    attend_row(q, kv, kvh, visible, a.scale, p, out);
    if (a.col_sums) {
      float* cs = a.col_sums + static_cast<size_t>(h) * a.stats_stride;
      for (int s = 0; s < visible; ++s) cs[s] += p[s];
    }
    const int w_index = i - (a.n - a.last_w);
    if (a.last_probs && w_index >= 0) {
      float* lp = a.last_probs + (static_cast<size_t>(h) * a.last_w + w_index) * a.stats_stride;
      std::memcpy(lp, p.data(), visible * sizeof(float));
    }
  };
  if (a.col_sums) {
    // Column sums accumulate over queries: one head per thread keeps the order fixed.
#pragma omp parallel
    {
      std::vector<float> p;
#pragma omp for schedule(dynamic, 1)
      for (int h = 0; h < a.num_heads; ++h) {
        for (int i = 0; i < a.n; ++i) row(h, i, p);
      }
    }
    return;
  }
  const int total = a.num_heads * a.n;
#pragma omp parallel
  {
    std::vector<float> p;
#pragma omp for schedule(dynamic, 4)
    for (int job = 0; job < total; ++job) row(job / a.n, job % a.n, p);
  }
}

}  // namespace kvb::kernels::cpu
