// Causal GQA attention over the ragged per-head cache with optional statistics, CPU reference.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec.h"

namespace kvb::kernels::cpu {

namespace {
// One query row: probabilities into `p` ([visible]), output into `out` ([head_dim]). Scores and
// the P x V sum use matmul's summation order (16 fma lanes over the summed index, then its fixed
// tree), so a row gives the same bits here as in the blocked prefill path below.
// Slots [first, visible) take part (first > 0 only under a window; p[0, first) is not written).
void attend_row(const float* q, const LayerKvView& kv, int kvh, int first, int visible,
                float scale, std::vector<float>& p, std::vector<float>& lanes, float* out) {
  const int d = kv.head_dim;
  p.resize(visible);
  float max_score = -INFINITY;
  for (int s = first; s < visible; ++s) {
    p[s] = dot_matmul_order(q, kv.key(kvh, s), d) * scale;
    max_score = std::max(max_score, p[s]);
  }
  double sum = 0;
  for (int s = first; s < visible; ++s) {
    p[s] = std::exp(p[s] - max_score);
    sum += p[s];
  }
  const float inv = static_cast<float>(1.0 / sum);
  lanes.assign(static_cast<size_t>(16) * d, 0.0f);  // [16 lanes, d]
  for (int s = first; s < visible; ++s) {
    p[s] *= inv;
    float* acc = &lanes[static_cast<size_t>(s & 15) * d];
    const float* v = kv.value(kvh, s);
    for (int j = 0; j < d; ++j) acc[j] = std::fma(p[s], v[j], acc[j]);
  }
  float col[16];
  for (int j = 0; j < d; ++j) {
    for (int l = 0; l < 16; ++l) col[l] = lanes[static_cast<size_t>(l) * d + j];
    out[j] = tree16(col);
  }
}

// Prefill blocks of many queries go through the GEMM kernel: per (KV head, query block), the
// scores of the group's query heads against the visible keys in one matmul, a masked softmax
// per row, then P x V in a second matmul (V transposed once per call). Probabilities, outputs and
// statistics are the same quantities as the row path, up to f32 summation order.
constexpr int kBlockedMinQueries = 32;
constexpr int kQueryBlock = 32;

void attention_blocked(const AttentionArgs& a, int group) {
  const LayerKvView& kv = a.kv;
  const int d = kv.head_dim;
  const int n = a.n;
  // V^T per KV head: [num_kv_heads][d, len] (the matmul's weight layout for P x V). Under a
  // window each block transposes only the span it sees.
  std::vector<std::vector<float>> vt(a.window > 0 ? 0 : kv.num_kv_heads);
  for (int h = 0; h < static_cast<int>(vt.size()); ++h) {
    const int len = kv.lengths[h];
    vt[h].resize(static_cast<size_t>(d) * len);
    for (int s = 0; s < len; ++s) {
      const float* v = kv.value(h, s);
      for (int j = 0; j < d; ++j) vt[h][static_cast<size_t>(j) * len + s] = v[j];
    }
  }
  const int blocks = (n + kQueryBlock - 1) / kQueryBlock;
  auto run_block = [&](int kvh, int b, std::vector<float>& qb, std::vector<float>& sc,
                       std::vector<float>& ob, std::vector<float>& vt_span) {
    const int len = kv.lengths[kvh];
    const int i0 = b * kQueryBlock, i1 = std::min(n, i0 + kQueryBlock), nb = i1 - i0;
    const int rows = group * nb;
    const int vis_max = len - n + i1;  // keys the last query of the block sees
    // Without a window the block's keys are [0, vis_max) and probability rows have len entries;
    // with one, [lo, vis_max) (the first query's window onwards) and rows of that span.
    const int lo = a.window > 0 ? std::max(0, len - n + i0 - a.window + 1) : 0;
    const int span = vis_max - lo;
    const int width = a.window > 0 ? span : len;
    qb.resize(static_cast<size_t>(rows) * d);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int r = 0; r < nb; ++r) {
        std::memcpy(&qb[(static_cast<size_t>(g) * nb + r) * d],
                    a.q + (static_cast<size_t>(i0 + r) * a.num_heads + h) * d, d * sizeof(float));
      }
    }
    // Scores [rows, span], then probabilities padded with zeros to [rows, width].
    sc.assign(static_cast<size_t>(rows) * width, 0.0f);
    std::vector<float> tmp(static_cast<size_t>(rows) * span);
    matmul(tmp.data(), qb.data(), kv.key(kvh, lo), nullptr, rows, d, span);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int r = 0; r < nb; ++r) {
        const int i = i0 + r;
        // Row entries [first, visible) relative to lo (first > 0 only under a window).
        const int visible = len - n + i + 1 - lo;
        const int first = a.window > 0 ? std::max(0, visible - a.window) : 0;
        const float* srow = &tmp[(static_cast<size_t>(g) * nb + r) * span];
        float* p = &sc[(static_cast<size_t>(g) * nb + r) * width];
        float max_score = -INFINITY;
        for (int s = first; s < visible; ++s) {
          p[s] = srow[s] * a.scale;
          max_score = std::max(max_score, p[s]);
        }
        double sum = 0;
        for (int s = first; s < visible; ++s) {
          p[s] = std::exp(p[s] - max_score);
          sum += p[s];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int s = first; s < visible; ++s) p[s] *= inv;
        if (a.col_sums) {
          float* cs = a.col_sums + static_cast<size_t>(h) * a.stats_stride;
          for (int s = 0; s < visible; ++s) cs[s] += p[s];
        }
        const int w_index = i - (n - a.last_w);
        if (a.last_probs && w_index >= 0) {
          std::memcpy(a.last_probs + (static_cast<size_t>(h) * a.last_w + w_index) * a.stats_stride,
                      p, visible * sizeof(float));
        }
      }
    }
    ob.resize(static_cast<size_t>(rows) * d);
    if (a.window > 0) {
      vt_span.resize(static_cast<size_t>(d) * span);
      for (int s = 0; s < span; ++s) {
        const float* v = kv.value(kvh, lo + s);
        for (int j = 0; j < d; ++j) vt_span[static_cast<size_t>(j) * span + s] = v[j];
      }
    }
    matmul(ob.data(), sc.data(), a.window > 0 ? vt_span.data() : vt[kvh].data(), nullptr, rows,
           width, d);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int r = 0; r < nb; ++r) {
        std::memcpy(a.out + (static_cast<size_t>(i0 + r) * a.num_heads + h) * d,
                    &ob[(static_cast<size_t>(g) * nb + r) * d], d * sizeof(float));
      }
    }
  };
  if (a.col_sums) {
    // Column sums accumulate in query order: one KV head per thread, its blocks in order.
#pragma omp parallel
    {
      std::vector<float> qb, sc, ob, vt_span;
#pragma omp for schedule(dynamic, 1)
      for (int kvh = 0; kvh < kv.num_kv_heads; ++kvh) {
        for (int b = 0; b < blocks; ++b) run_block(kvh, b, qb, sc, ob, vt_span);
      }
    }
    return;
  }
  const int jobs = kv.num_kv_heads * blocks;
#pragma omp parallel
  {
    std::vector<float> qb, sc, ob, vt_span;
    // Later blocks see more keys: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int j = 0; j < jobs; ++j) {
      const int b = blocks - 1 - j / kv.num_kv_heads;
      run_block(j % kv.num_kv_heads, b, qb, sc, ob, vt_span);
    }
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
  KVB_CHECK(a.window >= 0 && (a.window == 0 || !stats))
      << "attention: window " << a.window << " (statistics are not defined under a window)";
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
  auto row = [&](int h, int i, std::vector<float>& p, std::vector<float>& lanes) {
    const int kvh = h / group;
    const int visible = kv.lengths[kvh] - a.n + i + 1;
    const int first = a.window > 0 ? std::max(0, visible - a.window) : 0;
    const float* q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * d;
    float* out = a.out + (static_cast<size_t>(i) * a.num_heads + h) * d;
    attend_row(q, kv, kvh, first, visible, a.scale, p, lanes, out);
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
  if (a.n >= kBlockedMinQueries) {
    attention_blocked(a, group);
    return;
  }
  if (a.col_sums) {
    // Column sums accumulate over queries: one head per thread keeps the order fixed.
#pragma omp parallel
    {
      std::vector<float> p, lanes;
#pragma omp for schedule(dynamic, 1)
      for (int h = 0; h < a.num_heads; ++h) {
        for (int i = 0; i < a.n; ++i) row(h, i, p, lanes);
      }
    }
    return;
  }
  const int total = a.num_heads * a.n;
#pragma omp parallel
  {
    std::vector<float> p, lanes;
#pragma omp for schedule(dynamic, 4)
    for (int job = 0; job < total; ++job) row(job / a.n, job % a.n, p, lanes);
  }
}

}  // namespace kvb::kernels::cpu
