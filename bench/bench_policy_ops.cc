// A per-policy op against the vocabulary's composition of the same quantity (issue 32: "a
// per-policy kernel stays only where a benchmark shows the vocabulary is too slow"), on the
// CPU instance. KVzip's replay_attention_max (each slot's largest attention probability over a
// block of m queries, each seeing the cache up to itself) against window_attention over the same
// queries (w = m; its [q heads, m, n] rows) followed by the same maximum over the group's query
// heads and the m queries on the host. One layer of SmolLM2-135M's shape (9 query heads, 3 KV
// heads, head_dim 64), random keys and queries; A and B alternate (A B A B ...), --pairs times;
// the table holds medians and B/A. The two compute the same probabilities in different
// arithmetic (f32 logits and an 8-lane normaliser against f64), so the check printed is the
// largest difference between their maxima, not equality.
//   bench_policy_ops [--slots 2048] [--queries 128] [--pairs 5]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "bench/bench_stats.h"
#include "common/table.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"

namespace {
using kvb::bench::fmt;
using kvb::bench::median;
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace kvb;
  int slots = 2048, m = 128, pairs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--slots") {
      slots = v;
    } else if (a == "--queries") {
      m = v;
    } else if (a == "--pairs") {
      pairs = v;
    } else {
      std::cerr << "bench_policy_ops: unknown option " << a
                << " (--slots N, --queries M, --pairs P)\n";
      return 2;
    }
  }
  if (slots < 1 || m < 1 || m > slots || pairs < 1) {
    std::cerr << "bench_policy_ops: need 1 <= --queries <= --slots and --pairs >= 1\n";
    return 2;
  }
  const int kv = 3, qh = 9, d = 64, group = qh / kv;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  kernels::KvCache cache({1, kv, d}, slots);
  std::vector<float> k(d), v(d);
  for (int h = 0; h < kv; ++h) {
    for (int s = 0; s < slots; ++s) {
      for (int c = 0; c < d; ++c) k[c] = normal(rng), v[c] = normal(rng);
      cache.append(0, h, k.data(), v.data(), s);
    }
  }
  std::vector<float> queries(static_cast<size_t>(m) * qh * d);
  for (float& x : queries) x = normal(rng);
  kernels::ops::LayerStats st;
  st.layer = 0;
  st.num_heads = qh;
  st.n_new = m;
  st.n_queries = m;
  st.last_queries = queries.data();
  st.block_end = slots;  // the block is the cache's last m slots
  kernels::ops::CpuPolicyOps ops;
  const int count = slots - m;  // every slot before the block
  std::unique_ptr<kernels::ops::SlotRows> fused = ops.make_rows(kernels::ops::SlotType::kF32, 1, kv);
  std::unique_ptr<kernels::ops::WindowProbs> probs = ops.make_window_probs();
  std::vector<std::vector<float>> composed(kv, std::vector<float>(count));
  std::vector<double> a_ms, b_ms;
  for (int p = 0; p < pairs; ++p) {
    auto t0 = std::chrono::steady_clock::now();
    ops.replay_attention_max(*fused, 0, cache, 0, st, 0, 0, count);
    a_ms.push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    ops.window_attention(*probs, cache, 0, st, m);
    for (int h = 0; h < kv; ++h) {
      std::fill(composed[h].begin(), composed[h].end(), 0.0f);
      for (int g = 0; g < group; ++g) {
        for (int i = 0; i < m; ++i) {
          const float* row =
              probs->data() + (static_cast<size_t>(h * group + g) * m + i) * probs->stride();
          for (int j = 0; j < count; ++j) composed[h][j] = std::max(composed[h][j], row[j]);
        }
      }
    }
    b_ms.push_back(ms_since(t0));
  }
  double worst = 0;
  for (int h = 0; h < kv; ++h) {
    const std::vector<float> f = ops.read_f32(*fused, 0, h);
    for (int j = 0; j < count; ++j) {
      worst = std::max(worst, std::fabs(static_cast<double>(f[j]) - composed[h][j]));
    }
  }
  const double a = median(a_ms), b = median(b_ms);
  std::cout << "one layer, " << qh << " query heads over " << kv << " KV heads, head_dim " << d
            << ", " << slots << " slots, " << m << " queries; " << pairs
            << " interleaved pairs, medians\n";
  Table t({"op", "ms", "vs fused"});
  t.add({"replay_attention_max (per-policy, fused)", fmt(a, 2), "1.00x"});
  t.add({"window_attention + host max (vocabulary)", fmt(b, 2), fmt(b / a, 2) + "x"});
  t.print(std::cout, "md");
  std::cout << "window rows: " << fmt(static_cast<double>(qh) * m * probs->stride() * 4 / 1048576.0, 1)
            << " MiB; largest |difference| of the maxima: " << worst << "\n";
  return 0;
}
