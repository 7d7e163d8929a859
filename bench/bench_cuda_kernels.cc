// Google Benchmark for the CUDA twins (kernels/cuda): decode attention over ragged per-head
// caches up to 32K tokens (bytes moved, GB/s and percent of a device-to-device cudaMemcpy
// measured in the same run), and the H2O decode step at budget 1024 (score update + per-head
// argmin). Every row first checks its result against a CPU computation (counter `correct`).
// GPU time per iteration from CUDA events (manual time). Without a device: one line, exit 0.
// Built only when the CUDA backend is (bench/CMakeLists.txt).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/select.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/scores.h"
#include "kernels/cuda/select.h"
#include "kernels/policies/policy.h"

namespace {

namespace cu = kvb::kernels::cuda;

double g_d2d_gbps = 0;  // device-to-device copy bandwidth (read + write bytes), this run

std::vector<float> random_vec(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] =
        lo + (hi - lo) * static_cast<float>(kvb::kernels::cpu::counter_uniform(seed, 0, 0, 0, i));
  }
  return v;
}

template <typename T>
cu::DeviceBuffer<T> to_device(const std::vector<T>& v) {
  cu::DeviceBuffer<T> d(v.size());
  d.upload(v.data(), v.size());
  return d;
}

// Times `fn` on the default stream with CUDA events; seconds.
template <typename Fn>
double gpu_seconds(Fn&& fn) {
  cudaEvent_t start, stop;
  KVB_CUDA_CHECK(cudaEventCreate(&start));
  KVB_CUDA_CHECK(cudaEventCreate(&stop));
  KVB_CUDA_CHECK(cudaEventRecord(start));
  fn();
  KVB_CUDA_CHECK(cudaEventRecord(stop));
  KVB_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  KVB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  KVB_CUDA_CHECK(cudaEventDestroy(start));
  KVB_CUDA_CHECK(cudaEventDestroy(stop));
  return ms * 1e-3;
}

// The roof: best of 5 copies of 1 GiB; counts the bytes read plus the bytes written.
double measure_d2d_gbps() {
  const size_t bytes = size_t{1} << 30;
  cu::DeviceBuffer<unsigned char> a(bytes), b(bytes);
  KVB_CUDA_CHECK(cudaMemset(a.data(), 1, bytes));
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    best = std::min(
        best, gpu_seconds([&] {
          KVB_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
        }));
  }
  return 2.0 * bytes / best / 1e9;
}

constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128;

// Decode attention: args {context, bf16, probabilities, ragged}. Ragged: KV head h holds between
// half the context and all of it; otherwise every head holds `context` tokens (the dense shape
// bench/torch_eager_attention.py compares with PyTorch); the query heads of a group read their KV head once from DRAM
// (the group's blocks run together and share it through L2), so bytes = sum over KV heads of
// len * head_dim * 2 (K and V) * element size + q + out (+ the probability rows written).
void bm_decode_attention(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0));
  const cu::KvDtype dtype = state.range(1) ? cu::KvDtype::kBf16 : cu::KvDtype::kF32;
  const bool probs = state.range(2) != 0, ragged = state.range(3) != 0;
  const int nh = kKvHeads * kGroup, d = kHeadDim;
  std::vector<int32_t> lens(kKvHeads, ctx);
  if (ragged) {
    for (int h = 0; h < kKvHeads; ++h) lens[h] = ctx / 2 + (ctx / 2) * h / (kKvHeads - 1);
  }
  cu::DeviceKvCache cache({1, kKvHeads, d}, dtype, std::vector<int32_t>(kKvHeads, ctx));
  const int chunk = std::min(ctx, 1024);
  const auto kc = to_device(random_vec(static_cast<size_t>(chunk) * kKvHeads * d, 1, -2, 2));
  const auto vc = to_device(random_vec(static_cast<size_t>(chunk) * kKvHeads * d, 2));
  std::vector<int32_t> pos(chunk);
  for (int done = 0; done < ctx; done += chunk) {
    const int n = std::min(chunk, ctx - done);
    for (int i = 0; i < n; ++i) pos[i] = done + i;
    const auto pd = to_device(pos);
    cache.append(0, kc.data(), vc.data(), pd.data(), n);
  }
  // Trim to the ragged lengths: keep each head's first lens[h] slots (nothing moves).
  std::vector<int32_t> lists(static_cast<size_t>(kKvHeads) * ctx);
  for (int h = 0; h < kKvHeads; ++h) {
    for (int j = 0; j < ctx; ++j) lists[static_cast<size_t>(h) * ctx + j] = j;
  }
  const auto lists_d = to_device(lists);
  cache.keep_slots(0, lists_d.data(), ctx, lens.data());
  const std::vector<float> q = random_vec(static_cast<size_t>(nh) * d, 3, -2, 2);
  const auto qd = to_device(q);
  cu::DeviceBuffer<float> out(static_cast<size_t>(nh) * d), col(static_cast<size_t>(nh) * ctx);
  cu::AttentionArgs a;
  a.out = out.data();
  a.q = qd.data();
  a.kv = cache.layer(0);
  a.n = 1;
  a.num_heads = nh;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (probs) {
    a.col_sums = col.data();
    a.stats_stride = ctx;
  }
  cu::attention(a);  // warm-up, then the check: query heads 0 and nh - 1 against a double loop
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(static_cast<size_t>(nh) * d);
  out.download(got.data(), got.size());
  const size_t eb = cu::kv_dtype_bytes(dtype);
  double max_err = 0;
  for (int h : {0, nh - 1}) {
    const int kvh = h / kGroup, len = lens[kvh];
    std::vector<unsigned char> kraw(static_cast<size_t>(len) * d * eb), vraw(kraw.size());
    const size_t at = static_cast<size_t>(cache.offset(0, kvh)) * d * eb;
    KVB_CUDA_CHECK(cudaMemcpy(kraw.data(), static_cast<unsigned char*>(a.kv.keys) + at, kraw.size(),
                              cudaMemcpyDeviceToHost));
    KVB_CUDA_CHECK(cudaMemcpy(vraw.data(), static_cast<unsigned char*>(a.kv.values) + at,
                              vraw.size(), cudaMemcpyDeviceToHost));
    auto elem = [&](const std::vector<unsigned char>& raw, size_t i) {
      if (dtype == cu::KvDtype::kF32) return reinterpret_cast<const float*>(raw.data())[i];
      const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(raw.data())[i])
                            << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    };
    std::vector<double> s(len), o(d, 0.0);
    double mx = -1e300, sum = 0;
    for (int j = 0; j < len; ++j) {
      double dot = 0;
      for (int x = 0; x < d; ++x)
        dot +=
            double{q[static_cast<size_t>(h) * d + x]} * elem(kraw, static_cast<size_t>(j) * d + x);
      s[j] = dot * a.scale;
      mx = std::max(mx, s[j]);
    }
    for (int j = 0; j < len; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int j = 0; j < len; ++j) {
      for (int x = 0; x < d; ++x) o[x] += s[j] / sum * elem(vraw, static_cast<size_t>(j) * d + x);
    }
    for (int x = 0; x < d; ++x) {
      max_err = std::max(max_err, std::fabs(o[x] - got[static_cast<size_t>(h) * d + x]));
    }
  }
  double kv_bytes = 0;
  for (int h = 0; h < kKvHeads; ++h) kv_bytes += static_cast<double>(lens[h]) * d * 2 * eb;
  double bytes = kv_bytes + 2.0 * nh * d * sizeof(float);
  if (probs) {
    for (int h = 0; h < nh; ++h) bytes += 3.0 * lens[h / kGroup] * sizeof(float);  // score, read, p
  }
  double total = 0;
  for (auto _ : state) {
    (void)_;
    const double t = gpu_seconds([&] { cu::attention(a); });
    state.SetIterationTime(t);
    total += t;
  }
  const double gbps = bytes * state.iterations() / total / 1e9;
  state.counters["MB"] = bytes / 1e6;
  state.counters["GB/s"] = gbps;
  state.counters["pct_d2d"] = 100.0 * gbps / g_d2d_gbps;
  state.counters["correct"] = max_err <= 1e-4 ? 1 : 0;
  if (max_err > 1e-4) state.SkipWithError("decode attention differs from the double reference");
}

// One H2O decode step per iteration at budget 1024 (1025 slots per head before the eviction):
// every KV head's scores += GQA mean of its query heads' probabilities, then the argmin over the
// heavy candidates (all but the 512 recent, H2O's default split) of every head.
void bm_h2o_step(benchmark::State& state) {
  const int budget = 1024, len = budget + 1, candidates = len - budget / 2;
  const int stride = len, nh = kKvHeads * kGroup;
  const std::vector<float> probs = random_vec(static_cast<size_t>(nh) * stride, 4, 0, 1e-3f);
  std::vector<float> scores = random_vec(static_cast<size_t>(kKvHeads) * len, 5, 0, 1);
  const auto pd = to_device(probs);
  auto sd = to_device(scores);
  const auto lens = to_device(std::vector<int32_t>(kKvHeads, len));
  const auto cand = to_device(std::vector<int32_t>(kKvHeads, candidates));
  cu::DeviceBuffer<int32_t> victims(kKvHeads);
  auto step = [&] {
    cu::accumulate_scores(sd.data(), len, lens.data(), pd.data(), stride, kKvHeads, kGroup,
                          kvb::policies::GqaReduce::kMean);
    cu::select_argmin_rows(sd.data(), kKvHeads, len, cand.data(), victims.data());
  };
  step();  // check one step against the CPU
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> after(scores.size());
  std::vector<int32_t> got(kKvHeads);
  sd.download(after.data(), after.size());
  victims.download(got.data(), got.size());
  bool ok = true;
  std::vector<float> add(len);
  for (int h = 0; h < kKvHeads; ++h) {
    kvb::policies::reduce_gqa(probs.data() + static_cast<size_t>(h) * kGroup * stride, stride,
                              kGroup, len, kvb::policies::GqaReduce::kMean, add.data());
    for (int s = 0; s < len; ++s) {
      scores[static_cast<size_t>(h) * len + s] += add[s];
      ok =
          ok && scores[static_cast<size_t>(h) * len + s] == after[static_cast<size_t>(h) * len + s];
    }
    ok = ok && got[h] == kvb::kernels::cpu::select_argmin(&scores[static_cast<size_t>(h) * len],
                                                          nullptr, candidates);
  }
  for (auto _ : state) {
    (void)_;
    state.SetIterationTime(gpu_seconds(step));
  }
  state.counters["heads"] = kKvHeads;
  state.counters["correct"] = ok ? 1 : 0;
  if (!ok) state.SkipWithError("H2O step differs from the CPU policy arithmetic");
}

BENCHMARK(bm_decode_attention)
    ->ArgNames({"ctx", "bf16", "probs", "ragged"})
    ->ArgsProduct({{1024, 4096, 16384, 32768}, {0, 1}, {0, 1}, {0, 1}})
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_h2o_step)
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  if (!cu::has_device()) {
    std::fprintf(stderr,
                 "bench_cuda_kernels: no CUDA device (cudaGetDeviceCount found none); "
                 "nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  g_d2d_gbps = measure_d2d_gbps();
  std::fprintf(stderr, "device-to-device cudaMemcpy: %.1f GB/s (read + write)\n", g_d2d_gbps);
  benchmark::AddCustomContext("d2d_GBps", std::to_string(g_d2d_gbps));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
