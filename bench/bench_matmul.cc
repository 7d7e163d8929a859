// Google Benchmark for kvb::kernels::cpu::matmul over SmolLM2-135M shapes: decode (n = 1,
// reported in GFLOP/s and GB/s of weights read) and prefill (n = 512, 2048), plus the naive
// double-accumulating reference at one prefill shape as the baseline. Every row first checks a
// few output rows against the reference and fails the row if they are off.
#include <benchmark/benchmark.h>
#include <omp.h>

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
      for (int p = 0; p < k; ++p) abs_sum += std::fabs(double{xi[p]} * w[static_cast<size_t>(j) * k + p]);
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
  const std::vector<float> w = random_vec(static_cast<size_t>(m) * k, 2);  // [m, k]
  std::vector<float> y(static_cast<size_t>(n) * m);                        // [n, m]
  fn(y.data(), x.data(), w.data(), nullptr, n, k, m);  // warm-up and correctness
  if (!rows_match_reference(y.data(), x.data(), w.data(), n, k, m)) {
    state.SkipWithError("output differs from matmul_reference");
    return;
  }
  for (auto _ : state) {
    fn(y.data(), x.data(), w.data(), nullptr, n, k, m);
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

void bm_matmul(benchmark::State& state) { run(state, &matmul); }
void bm_matmul_reference(benchmark::State& state) { run(state, &matmul_reference); }

// Args: {n, k, m}. Wall time: the kernel runs on OpenMP threads.
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
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_matmul_reference)
    ->ArgNames({"n", "k", "m"})
    ->Args({512, 576, 576})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
