// Decode attention on the CPU (kernels/cpu/attention.h) at one layer of Llama-3-8B's shape
// (32 query heads, 8 KV heads, head_dim 128), one query over a cache of `ctx` tokens per KV head,
// with or without the column sums an H2O-style policy reads (the per-slot probabilities of the
// decode query). bench/torch_eager_attention.py runs this binary and PyTorch's eager attention
// with output_attentions (what Python H2O implementations use) on the same shapes, in the same
// run, and prints the ratio. Before timing, every row checks query heads 0 and 31 and their
// column sums against a double-precision loop (counter `correct`).
//   bench_attention [--benchmark_filter=...] [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/f16.h"
#include "kernels/kv_cache.h"
#include "workers/engine/sampler.h"

namespace {

constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128;

float uniform(uint64_t seed, size_t i, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(kvb::engine::counter_uniform(seed, i));
}

// Args: {context, probabilities}. Bytes: K and V of every KV head (f32), q and out, and the
// column-sum rows written when asked.
void bm_decode_attention(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0));
  const bool probs = state.range(1) != 0;
  const int nh = kKvHeads * kGroup, d = kHeadDim;
  kvb::kernels::KvCache cache({1, kKvHeads, d}, ctx);
  std::vector<float> k(d), v(d);
  for (int h = 0; h < kKvHeads; ++h) {
    for (int j = 0; j < ctx; ++j) {
      const size_t at = (static_cast<size_t>(h) * ctx + j) * d;
      for (int x = 0; x < d; ++x) {
        k[x] = uniform(1, at + x, -2, 2);
        v[x] = uniform(2, at + x, -1, 1);
      }
      cache.append(0, h, k.data(), v.data(), j);
    }
  }
  cache.advance_position(ctx);
  std::vector<float> q(static_cast<size_t>(nh) * d), out(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = uniform(3, i, -2, 2);
  std::vector<float> col(probs ? static_cast<size_t>(nh) * ctx : 0);
  kvb::kernels::cpu::AttentionArgs a;
  a.out = out.data();
  a.q = q.data();
  a.kv = cache.layer(0);
  a.n = 1;
  a.num_heads = nh;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (probs) {
    a.col_sums = col.data();
    a.stats_stride = ctx;
  }
  kvb::kernels::cpu::attention(a);
  double max_err = 0;
  for (int h : {0, nh - 1}) {
    const int kvh = h / kGroup;
    std::vector<double> s(ctx), o(d, 0.0);
    double mx = -1e300, sum = 0;
    for (int j = 0; j < ctx; ++j) {
      double dot = 0;
      for (int x = 0; x < d; ++x) dot += double{q[static_cast<size_t>(h) * d + x]} * a.kv.key(kvh, j)[x];
      s[j] = dot * a.scale;
      mx = std::max(mx, s[j]);
    }
    for (int j = 0; j < ctx; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int j = 0; j < ctx; ++j) {
      for (int x = 0; x < d; ++x) o[x] += s[j] / sum * a.kv.value(kvh, j)[x];
      if (probs) {
        max_err = std::max(max_err, std::fabs(s[j] / sum - col[static_cast<size_t>(h) * ctx + j]));
      }
    }
    for (int x = 0; x < d; ++x) {
      max_err = std::max(max_err, std::fabs(o[x] - out[static_cast<size_t>(h) * d + x]));
    }
  }
  for (auto _ : state) {
    kvb::kernels::cpu::attention(a);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  double bytes = 2.0 * kKvHeads * ctx * d * sizeof(float) + 2.0 * nh * d * sizeof(float);
  if (probs) bytes += static_cast<double>(nh) * ctx * sizeof(float);
  state.counters["MB"] = bytes / 1e6;
  state.counters["GB"] = benchmark::Counter(bytes * state.iterations() / 1e9,
                                            benchmark::Counter::kIsRate);  // per wall second
  state.counters["correct"] = max_err <= 1e-4 ? 1 : 0;
  if (max_err > 1e-4) state.SkipWithError("decode attention differs from the double reference");
}

BENCHMARK(bm_decode_attention)
    ->ArgNames({"ctx", "probs"})
    ->ArgsProduct({{1024, 4096, 16384, 32768}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Prefill attention at SmolLM2-135M's shape (9 query heads, 3 KV heads, head_dim 64) over an f16
// cache (--dtype native's): n queries that are the cache's whole length, as one forward of an
// n-token prompt attends. The blocked path (32-query blocks: Q K^T with k = 64, the softmax, P V);
// fast: the softmax's exp is exp_fast (--dtype native's) rather than std::exp's bits. Before
// timing, query heads 0 and 8 at the last query are checked against a double loop.
void bm_prefill_attention(benchmark::State& state) {
  constexpr int kv_heads = 3, group = 3, d = 64;
  const int n = static_cast<int>(state.range(0));
  const bool fast = state.range(1) != 0;
  const int nh = kv_heads * group;
  kvb::kernels::KvCacheShape shape{1, kv_heads, d};
  shape.f16 = true;
  kvb::kernels::KvCache cache(shape, n);
  std::vector<float> k(d), v(d);
  for (int h = 0; h < kv_heads; ++h) {
    for (int j = 0; j < n; ++j) {
      const size_t at = (static_cast<size_t>(h) * n + j) * d;
      for (int x = 0; x < d; ++x) {
        k[x] = uniform(1, at + x, -2, 2);
        v[x] = uniform(2, at + x, -1, 1);
      }
      cache.append(0, h, k.data(), v.data(), j);
    }
  }
  cache.advance_position(n);
  std::vector<float> q(static_cast<size_t>(n) * nh * d), out(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = uniform(3, i, -2, 2);
  kvb::kernels::cpu::AttentionArgs a;
  a.out = out.data();
  a.q = q.data();
  a.kv = cache.layer(0);
  a.n = n;
  a.num_heads = nh;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.fast_exp = fast;
  kvb::kernels::cpu::attention(a);
  double max_err = 0;
  const int i = n - 1;  // the last query sees every slot
  for (int h : {0, nh - 1}) {
    const int kvh = h / group;
    const float* qi = q.data() + (static_cast<size_t>(i) * nh + h) * d;
    std::vector<double> s(n), o(d, 0.0);
    double mx = -1e300, sum = 0;
    for (int j = 0; j < n; ++j) {
      double dot = 0;
      for (int x = 0; x < d; ++x)
        dot += double{qi[x]} * kvb::kernels::f16_to_f32(a.kv.key16(kvh, j)[x]);
      s[j] = dot * a.scale;
      mx = std::max(mx, s[j]);
    }
    for (int j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int j = 0; j < n; ++j) {
      for (int x = 0; x < d; ++x)
        o[x] += s[j] / sum * kvb::kernels::f16_to_f32(a.kv.value16(kvh, j)[x]);
    }
    for (int x = 0; x < d; ++x) {
      max_err = std::max(max_err, std::fabs(o[x] - out[(static_cast<size_t>(i) * nh + h) * d + x]));
    }
  }
  for (auto _ : state) {
    kvb::kernels::cpu::attention(a);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // Multiply-adds of Q K^T and P V over the causal triangle.
  const double flops = 2.0 * 2.0 * nh * d * (static_cast<double>(n) * (n + 1) / 2);
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["correct"] = max_err <= 1e-4 ? 1 : 0;
  if (max_err > 1e-4) state.SkipWithError("prefill attention differs from the double reference");
}

BENCHMARK(bm_prefill_attention)
    ->ArgNames({"n", "fast"})
    ->ArgsProduct({{1024, 4096, 8192}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
