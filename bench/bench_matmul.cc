// Google Benchmark for kvb::kernels::cpu::matmul over SmolLM2-135M shapes: decode (n = 1, GFLOP/s
// and GB/s of weights read, weights cold as in the engine) and prefill (n = 512, 2048), the naive
// double-accumulating reference at one prefill shape as the baseline, and a plain read of 256 MiB
// as the memory-bandwidth roof. Every row first checks output rows against the reference.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace {

using kvb::kernels::cpu::matmul;
using kvb::kernels::cpu::matmul_reference;

using MatmulFn = void (*)(float*, const float*, const float*, const float*, int, int, int);

std::vector<float> random_vec(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& f : v) f = dist(gen);
  return v;
}

// Checks rows {0, n/2, n-1} of y against the reference (rows are independent, so each is a
// 1-row reference call); the bound is the unit test's: 4 (k+1) FLT_EPSILON sum|x w|.
bool rows_match_reference(const float* y, const float* x, const float* w, int n, int k, int m) {
  std::vector<float> ref(m);  // [m]
  for (int i : {0, n / 2, n - 1}) {
    const float* xi = x + static_cast<size_t>(i) * k;  // [k]
    matmul_reference(ref.data(), xi, w, nullptr, 1, k, m);
    for (int j = 0; j < m; ++j) {
      double abs_sum = 0.0;
      for (int p = 0; p < k; ++p)
        abs_sum += std::fabs(double{xi[p]} * w[static_cast<size_t>(j) * k + p]);
      const double err = std::fabs(double{y[static_cast<size_t>(i) * m + j]} - ref[j]);
      if (err > 4.0 * (k + 1) * FLT_EPSILON * abs_sum + 1e-30) return false;
    }
  }
  return true;
}

void run(benchmark::State& state, MatmulFn fn) {
  const int n = static_cast<int>(state.range(0));
  const int k = static_cast<int>(state.range(1));
  const int m = static_cast<int>(state.range(2));
  const std::vector<float> x = random_vec(static_cast<size_t>(n) * k, 1);  // [n, k]
  // Decode reads every weight once per token and a model's weights exceed the caches, so for
  // n == 1 the calls rotate over copies of w totalling >= 256 MiB: each call finds w cold.
  const size_t w_size = static_cast<size_t>(m) * k;
  const size_t copies = n == 1 ? std::max<size_t>(1, (size_t{256} << 20) / (w_size * 4) + 1) : 1;
  const std::vector<float> w = random_vec(w_size * copies, 2);  // [copies, m, k]
  std::vector<float> y(static_cast<size_t>(n) * m);             // [n, m]
  for (size_t c = 0; c < copies; ++c) {  // warm-up (page faults) and correctness
    fn(y.data(), x.data(), w.data() + c * w_size, nullptr, n, k, m);
    if (c == 0 && !rows_match_reference(y.data(), x.data(), w.data(), n, k, m)) {
      state.SkipWithError("output differs from matmul_reference");
      return;
    }
  }
  size_t next = 0;
  for (auto _ : state) {
    (void)_;
    fn(y.data(), x.data(), w.data() + next * w_size, nullptr, n, k, m);
    next = next + 1 == copies ? 0 : next + 1;
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double iters = static_cast<double>(state.iterations());
  const double flops = 2.0 * n * static_cast<double>(k) * m;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * iters / 1e9, benchmark::Counter::kIsRate);
  if (n == 1) {
    const double weight_bytes = static_cast<double>(m) * k * sizeof(float);
    state.counters["GB/s"] =
        benchmark::Counter(weight_bytes * iters / 1e9, benchmark::Counter::kIsRate);
  }
  state.counters["threads"] = omp_get_max_threads();
}

// Read bandwidth roof: sums 256 MiB with all threads (GB/s comparable with the decode rows).
void bm_read_bandwidth(benchmark::State& state) {
  const size_t count = size_t{64} << 20;
  std::vector<float> a(count, 1.0f);  // [count]
  for (auto _ : state) {
    (void)_;
    float total = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (size_t b = 0; b < count; b += 4096) {
      float part[16] = {};
      for (size_t i = b; i < b + 4096; i += 16) {
        for (int l = 0; l < 16; ++l) part[l] += a[i + l];
      }
      for (float v : part) total += v;
    }
    benchmark::DoNotOptimize(total);
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(count) * sizeof(float) * state.iterations() / 1e9,
                         benchmark::Counter::kIsRate);
  state.counters["threads"] = omp_get_max_threads();
}

// matmul_wt on the same shapes: w given transposed (b = w^T, [k, m]), the layouts attention's
// products have (K^T for Q K^T, V's rows for P V). Checked against the reference first.
void bm_matmul_wt(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = static_cast<int>(state.range(1));
  const int m = static_cast<int>(state.range(2));
  const std::vector<float> x = random_vec(static_cast<size_t>(n) * k, 1);  // [n, k]
  const std::vector<float> w = random_vec(static_cast<size_t>(m) * k, 2);  // [m, k]
  std::vector<float> b(static_cast<size_t>(k) * m);                        // [k, m]
  for (int j = 0; j < m; ++j) {
    for (int p = 0; p < k; ++p)
      b[static_cast<size_t>(p) * m + j] = w[static_cast<size_t>(j) * k + p];
  }
  std::vector<float> y(static_cast<size_t>(n) * m);  // [n, m]
  kvb::kernels::cpu::matmul_wt(y.data(), m, x.data(), k, b.data(), m, n, k, m);
  if (!rows_match_reference(y.data(), x.data(), w.data(), n, k, m)) {
    state.SkipWithError("output differs from matmul_reference");
    return;
  }
  for (auto _ : state) {
    (void)_;
    kvb::kernels::cpu::matmul_wt(y.data(), m, x.data(), k, b.data(), m, n, k, m);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * n * static_cast<double>(k) * m;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["threads"] = omp_get_max_threads();
}

void bm_matmul(benchmark::State& state) { run(state, &matmul); }
void bm_matmul_reference(benchmark::State& state) { run(state, &matmul_reference); }

// Args: {n, k, m}. Wall time (the kernel runs on OpenMP threads); 3 repetitions, aggregates shown.
BENCHMARK(bm_matmul)
    ->ArgNames({"n", "k", "m"})
    ->Args({1, 576, 576})
    ->Args({1, 576, 1536})
    ->Args({1, 1536, 576})
    ->Args({1, 576, 49152})
    ->Args({512, 576, 576})
    ->Args({512, 576, 1536})
    ->Args({512, 1536, 576})
    ->Args({2048, 576, 576})
    // Prefill attention's products at SmolLM2's head_dim 64 (attention.cc's blocked path: 3
    // query heads x 32 queries per block): Q K^T over 4,096 keys, then P V.
    ->Args({96, 64, 4096})
    ->Args({96, 4096, 64})
    ->UseRealTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_matmul_wt)
    ->ArgNames({"n", "k", "m"})
    ->Args({96, 64, 4096})
    ->Args({96, 4096, 64})
    ->Args({512, 576, 576})
    ->UseRealTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_read_bandwidth)
    ->UseRealTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_matmul_reference)
    ->ArgNames({"n", "k", "m"})
    ->Args({512, 576, 576})
    ->UseRealTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
