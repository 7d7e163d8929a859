// Google Benchmark for the CUDA twins (kernels/cuda): decode attention over ragged per-head
// caches up to 32K tokens (bytes moved, GB/s and percent of a device-to-device cudaMemcpy
// measured in the same run), and the H2O decode step at budget 1024 (score update + per-head
// argmin), and prefill attention of a 4K prompt on Llama-3-8B's shape (tokens/s and percent of
// the bf16 tensor-core rate of a cuBLAS GEMM measured in the same run) for the exact f32 kernel,
// the exact kernel on a bf16 cache, and the bf16 tensor-core kernel (attention_prefill_mma.h);
// the decode rows again with the grouped decode kernel's tuning (cu::AttentionArgs::decode_rows,
// decode_blocks) and on the streamed decode kernel (attention_decode_stream.h) for A/Bs in one
// run; the device half of a decode eviction (append + keep_slots
// of one slot per head) and CudaPolicyOps::keep_top's one-victim path against its radix select.
// Every row first checks its result against a CPU computation (counter `correct`).
// GPU time per iteration from CUDA events (manual time). Without a device: one line, exit 0.
// Built only when the CUDA backend is (bench/CMakeLists.txt).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/select.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_decode_mma.h"
#include "kernels/cuda/attention_decode_stream.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/scores.h"
#include "kernels/cuda/select.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"

namespace {

namespace cu = kvb::kernels::cuda;

// f rounded to bf16, nearest even (finite inputs): what the tensor-core kernels do to a query.
float round_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}
// The tensor-core kernels' bound against a double reference fed the bf16-rounded queries, with
// |v| <= 1: 2^-8 (P in bf16) + 4E, E = scale d 2^-22 max|q| max|k| bounding the f32 score-order
// difference (tests/cuda/parity_prefill_mma.h).
double mma_tolerance(float scale, int d, double qmax, double kmax) {
  return std::ldexp(1.0, -8) + 4 * scale * d * std::ldexp(1.0, -22) * qmax * kmax;
}

double g_d2d_gbps = 0;     // device-to-device copy bandwidth (read + write bytes), this run
double g_bf16_tflops = 0;  // cuBLAS bf16 GEMM rate (f32 accumulation), this run

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

// The tensor-core roof: best of 5 cuBLAS bf16 GEMMs of 8192^3 (f32 accumulation, bf16 out) on
// pseudo-random operands (zeros run faster than real data), 2 m^3 FLOP each.
double measure_bf16_tflops() {
  const int m = 8192;
  const size_t elems = static_cast<size_t>(m) * m;
  std::vector<uint16_t> host(elems);
  uint32_t x = 12345;
  for (uint16_t& h : host) {  // bf16 bits of values in [1, 2) with random signs
    x = x * 1664525u + 1013904223u;
    h = static_cast<uint16_t>(0x3f80u | ((x >> 16) & 0x7fu) | ((x >> 8) & 0x8000u));
  }
  cu::DeviceBuffer<uint16_t> a(elems), b(elems), c(elems);
  a.upload(host.data(), elems);
  b.upload(host.data(), elems);
  cublasHandle_t h = cu::cublas_handle(0);
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    KVB_CUBLAS_CHECK(cu::cublas().GemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, a.data(),
                                  CUDA_R_16BF, m, b.data(), CUDA_R_16BF, m, &beta, c.data(),
                                  CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  gemm();  // warm-up (handle, heuristics)
  double best = 1e30;
  for (int r = 0; r < 5; ++r) best = std::min(best, gpu_seconds(gemm));
  return 2.0 * m * m * static_cast<double>(m) / best / 1e12;
}

constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128;

// Decode attention: args {context, bf16, probabilities, ragged}. Ragged: KV head h holds between
// half the context and all of it; otherwise every head holds `context` tokens (the dense shape
// bench/torch_eager_attention.py compares with PyTorch); the query heads of a group read their KV head once from DRAM
// (the group's blocks run together and share it through L2), so bytes = sum over KV heads of
// len * head_dim * 2 (K and V) * element size + q + out (+ the probability rows written).
// decode_rows, decode_blocks: cu::AttentionArgs' tuning of the grouped decode kernel (0: default);
// decode_kernel: cu::AttentionArgs::decode_kernel (counters `streamed`: whether the streamed
// kernel took the shape, `per_sm`: its blocks resident per multiprocessor); the grouped kernel unless asked (the default is the streamed one).
void run_decode_attention(benchmark::State& state, int decode_rows, int decode_blocks,
                          int decode_kernel = cu::kDecodeGrouped) {
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
  a.decode_rows = decode_rows;
  a.decode_blocks = decode_blocks;
  a.decode_kernel = decode_kernel;
  if (probs) {
    a.col_sums = col.data();
    a.stats_stride = ctx;
  }
  const bool tensor = decode_kernel == cu::kDecodeTensorCore;
  if (decode_kernel == cu::kDecodeStreamed) {
    const cu::DecodeStreamPlan plan = cu::plan_decode_stream(a.kv, kGroup, ctx, decode_blocks);
    state.counters["streamed"] = plan.splits > 0 ? 1 : 0;
    state.counters["splits"] = plan.splits;
    state.counters["per_sm"] = plan.blocks_per_sm;  // blocks a multiprocessor holds
  } else if (tensor) {
    const cu::DecodeMmaPlan plan = cu::plan_decode_mma(a.kv, kGroup, ctx, decode_blocks);
    state.counters["tensor"] = plan.splits > 0 && !probs ? 1 : 0;  // else the default ran
    state.counters["splits"] = plan.splits;
    state.counters["per_sm"] = plan.blocks_per_sm;
  }
  // The tensor-core kernel's reference takes the queries rounded to bf16 (mma_tolerance).
  const bool rounded = tensor && !probs && dtype == cu::KvDtype::kBf16;
  auto q_ref = [&](size_t i) { return rounded ? double{round_bf16(q[i])} : double{q[i]}; };
  double qmax = 0, kmax = 0;
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
    double mx = -1e300, sum = 0, q2 = 0;
    for (int x = 0; x < d; ++x)
      q2 += q_ref(static_cast<size_t>(h) * d + x) * q_ref(static_cast<size_t>(h) * d + x);
    qmax = std::max(qmax, std::sqrt(q2));
    for (int j = 0; j < len; ++j) {
      double dot = 0, k2 = 0;
      for (int x = 0; x < d; ++x) {
        const double k = elem(kraw, static_cast<size_t>(j) * d + x);
        dot += q_ref(static_cast<size_t>(h) * d + x) * k;
        k2 += k * k;
      }
      kmax = std::max(kmax, std::sqrt(k2));
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
  // Checked heads only for qmax, kmax: the bound's E from the rows the check read.
  const double tol = rounded ? mma_tolerance(a.scale, d, qmax, kmax) : 1e-4;
  state.counters["max_err"] = max_err;
  state.counters["correct"] = max_err <= tol ? 1 : 0;
  if (max_err > tol) state.SkipWithError("decode attention differs from the double reference");
}

// Args {context, bf16, probabilities, ragged}: the grouped kernel at its default tuning (the
// baseline of bm_decode_attention_stream, which runs the default decode kernel).
void bm_decode_attention(benchmark::State& state) { run_decode_attention(state, 0, 0); }

// The streamed decode kernel (attention_decode_stream.h) on bm_decode_attention's shapes (its rows
// with the same args are the baseline of the same run), then args[4] = blocks_per_sm:
// decode_blocks = blocks_per_sm x the device's multiprocessors (0: the kernel's default, 4).
// run_decode_attention with `kernel` on args[4] x the device's multiprocessors blocks.
void run_decode_blocks_per_sm(benchmark::State& state, int kernel) {
  int sms = 0;
  KVB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = static_cast<int>(state.range(4)) * sms;
  state.counters["blocks"] = blocks;
  run_decode_attention(state, 0, blocks, kernel);
}

void bm_decode_attention_stream(benchmark::State& state) {
  run_decode_blocks_per_sm(state, cu::kDecodeStreamed);
}

// The tensor-core decode kernel (attention_decode_mma.h) on bm_decode_attention's shapes (its rows
// and bm_decode_attention_stream's with the same args are the baselines of the same run; with
// probabilities or an f32 cache the default kernel runs: counter `tensor` 0), then args[4] =
// blocks_per_sm as there. Correct: within mma_tolerance of the double reference fed the
// bf16-rounded queries.
void bm_decode_attention_mma(benchmark::State& state) {
  run_decode_blocks_per_sm(state, cu::kDecodeTensorCore);
}

// The A/B of the grouped decode kernel's tuning: the first four args as bm_decode_attention's
// (its rows with the same values are the baseline of the same run), then rows = decode_rows and
// blocks_per_sm: decode_blocks = blocks_per_sm x the device's multiprocessors (0: default 256).
// Counter `blocks`: the decode_blocks asked for (0: default).
void bm_decode_attention_tuning(benchmark::State& state) {
  int sms = 0;
  KVB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = static_cast<int>(state.range(5)) * sms;
  state.counters["blocks"] = blocks;
  run_decode_attention(state, static_cast<int>(state.range(4)), blocks);
}

// Dense, no probabilities: bf16 at 4K and 32K, f32 at 32K; rows 1 and 2 with the default grid
// (bm_decode_attention runs the default, rows 4), and rows 1, 2, 4 with more blocks (15 rows).
void decode_tuning_args(benchmark::internal::Benchmark* b) {
  for (const auto& [ctx, bf16] : {std::pair{4096, 1}, {32768, 1}, {32768, 0}}) {
    for (const auto& [rows, per_sm] : {std::pair{1, 0}, {2, 0}, {1, 8}, {2, 8}, {4, 8}}) {
      b->Args({ctx, bf16, 0, 0, rows, per_sm});
    }
  }
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

// The device half of one decode step's eviction in one layer of Llama-3-8B's cache shape (8 KV
// heads, head_dim 128, bf16): every head takes the step's token (append) and drops one slot
// (DeviceKvCache::keep_slots with device lists, as the engine applies a plan), so each iteration
// leaves the cache as it found it. Args {len, victim}: len slots per head before the append;
// victim 0 = the oldest slot (window, streaming_llm: every row moves), 1 = the middle. moved_MB:
// the K/V bytes of the rows that move, x4 (the compaction stages them: read, write, read,
// write). Check: after one step, the downloaded rows equal a host KvCache given the same.
void bm_decode_eviction(benchmark::State& state) {
  const int len = static_cast<int>(state.range(0)), victim_kind = static_cast<int>(state.range(1));
  const int d = kHeadDim, victim = victim_kind == 0 ? 0 : len / 2;
  const kvb::kernels::KvCacheShape shape{1, kKvHeads, d};
  cu::DeviceKvCache cache(shape, cu::KvDtype::kBf16, len + 1);
  kvb::kernels::KvCache host(shape, len + 1);
  const auto kd = to_device(random_vec(static_cast<size_t>(len) * kKvHeads * d, 31, -2, 2));
  const auto vd = to_device(random_vec(static_cast<size_t>(len) * kKvHeads * d, 32));
  std::vector<int32_t> pos(len);
  for (int i = 0; i < len; ++i) pos[i] = i;
  cache.append(0, kd.data(), vd.data(), to_device(pos).data(), len);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto k1 = to_device(random_vec(static_cast<size_t>(kKvHeads) * d, 33, -2, 2));
  const auto v1 = to_device(random_vec(static_cast<size_t>(kKvHeads) * d, 34));
  const int32_t next = len;  // the step's token: the same position every iteration
  std::vector<int32_t> list(static_cast<size_t>(kKvHeads) * len), keep(len);
  for (int j = 0; j < len; ++j) keep[j] = j < victim ? j : j + 1;  // all of len + 1 but victim
  for (int h = 0; h < kKvHeads; ++h) std::copy(keep.begin(), keep.end(), &list[size_t(h) * len]);
  const auto lists = to_device(list);
  const std::vector<int32_t> counts(kKvHeads, len);
  cu::DeviceBuffer<int32_t> step_pos(1);
  auto step = [&] {
    step_pos.upload(&next, 1);
    cache.append(0, k1.data(), v1.data(), step_pos.data(), 1);
    cache.keep_slots(0, lists.data(), len, counts.data(), 0, /*validated=*/true);
  };
  // The check, in the step's two halves: the append (read back: the host takes the device's
  // bf16 rows as they are), then the compaction against the host cache's.
  step_pos.upload(&next, 1);
  cache.append(0, k1.data(), v1.data(), step_pos.data(), 1);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  host = cache.download();
  cache.keep_slots(0, lists.data(), len, counts.data(), 0, /*validated=*/true);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  const kvb::kernels::KvCache got = cache.download();
  bool ok = true;
  for (int h = 0; h < kKvHeads; ++h) {
    host.keep_slots(0, h, keep);
    const kvb::kernels::LayerKvView a = got.layer(0), b = host.layer(0);
    ok = ok && got.length(0, h) == host.length(0, h);
    for (int s = 0; ok && s < host.length(0, h); ++s) {
      ok = a.position(h)[s] == b.position(h)[s] &&
           std::memcmp(a.key(h, s), b.key(h, s), d * sizeof(float)) == 0 &&
           std::memcmp(a.value(h, s), b.value(h, s), d * sizeof(float)) == 0;
    }
  }
  double total = 0;
  for (auto _ : state) {
    (void)_;
    const double t = gpu_seconds(step);
    state.SetIterationTime(t);
    total += t;
  }
  const double moved = 4.0 * kKvHeads * (len - victim) * 2.0 * d * 2;  // rows that shift, K+V
  const double gbps = moved * state.iterations() / total / 1e9;
  state.counters["moved_MB"] = moved / 1e6;
  state.counters["GB/s"] = gbps;
  state.counters["pct_d2d"] = 100.0 * gbps / g_d2d_gbps;
  state.counters["correct"] = ok ? 1 : 0;
  if (!ok) state.SkipWithError("keep_slots rows differ from the host cache's");
}

// CudaPolicyOps::keep_top over 8 heads of `len` slots with a window of 8 after the prefix, as
// h2o decides a decode step at the budget: path 0 keeps prefix - 1 (one victim: a block-wide
// minimum), path 1 keeps prefix - 2 (the 8-pass radix select). Check: the device lists equal the
// CPU instance's plan.
void bm_keep_top(benchmark::State& state) {
  using namespace kvb::policies;
  const int len = static_cast<int>(state.range(0)), path = static_cast<int>(state.range(1));
  const int prefix = len - 8, k = path == 0 ? prefix - 1 : prefix - 2;
  kvb::kernels::KvCache index({1, kKvHeads, kHeadDim}, len, /*host_rows=*/false);
  for (int h = 0; h < kKvHeads; ++h) {
    for (int s = 0; s < len; ++s) index.append(0, h, nullptr, nullptr, s);
  }
  cudaStream_t stream = nullptr;
  KVB_CUDA_CHECK(cudaStreamCreate(&stream));
  {
    cu::CudaPolicyOps gpu(stream);
    kvb::kernels::ops::CpuPolicyOps cpu;
    const std::vector<float> src = random_vec(static_cast<size_t>(kKvHeads) * len, 41, 0, 1);
    const auto src_d = to_device(src);
    const std::vector<int32_t> lens(kKvHeads, len);
    std::unique_ptr<SlotRows> gs = gpu.make_rows(SlotType::kF32, 1, kKvHeads);
    std::unique_ptr<SlotRows> cs = cpu.make_rows(SlotType::kF32, 1, kKvHeads);
    gpu.resize(*gs, 0, lens);
    cpu.resize(*cs, 0, lens);
    gpu.accumulate(*gs, 0, src_d.data(), len, len, 1, GqaReduce::kMean);
    cpu.accumulate(*cs, 0, src.data(), len, len, 1, GqaReduce::kMean);
    std::vector<KeepTop> tops;
    for (int h = 0; h < kKvHeads; ++h) {
      tops.push_back({.head = h, .score_head = h, .len = len, .prefix = prefix, .k = k});
    }
    kvb::kernels::EvictionPlan gplan, cplan;
    auto step = [&] {
      gplan.reset(0, kKvHeads);
      gpu.keep_top(*gs, 0, index, tops, {}, gplan);
    };
    step();
    cplan.reset(0, kKvHeads);
    cpu.keep_top(*cs, 0, index, tops, {}, cplan);
    KVB_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<int32_t> lists(static_cast<size_t>(kKvHeads) * gplan.device_ld()), want;
    KVB_CUDA_CHECK(cudaMemcpy(lists.data(), gplan.device_slots(), lists.size() * sizeof(int32_t),
                              cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int h = 0; h < kKvHeads; ++h) {
      cplan.keep_list(h, len, &want);
      ok = ok && gplan.device_counts()[h] == static_cast<int>(want.size()) &&
           std::equal(want.begin(), want.end(), &lists[size_t(h) * gplan.device_ld()]);
    }
    for (auto _ : state) {
      (void)_;
      state.SetIterationTime(gpu_seconds([&] {
        step();
        KVB_CUDA_CHECK(cudaStreamSynchronize(stream));  // the timing events are on stream 0
      }));
    }
    state.counters["correct"] = ok ? 1 : 0;
    if (!ok) state.SkipWithError("keep_top's device lists differ from the CPU instance's");
  }
  KVB_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Prefill attention of an n-token prompt (empty cache before it) on Llama-3-8B's shape: 32 query
// heads, 8 KV heads, head_dim 128. Args {n, kernel, stats}: kernel 0 = exact f32 kernel on an f32
// cache, 1 = exact kernel on a bf16 cache (today's bf16 path), 2 = bf16 tensor cores; stats 1 adds
// col_sums and the last 32 queries' probabilities (a second pass). FLOP counted: the causal
// Q K^T and P V products, 4 * head_dim per (query head, query, visible key), not the statistics
// pass. Check: queries 0, n/2, n-1 of heads 0 and 31 against a double loop (with the queries
// rounded to bf16 for kernel 2, and the tolerance of tests/cuda/parity_prefill_mma.h: 2^-8 max|v|
// for the P rounding + 4E for the f32 score order), and with stats the last query's
// probabilities of head 0 (within 1e-5).
void bm_prefill_attention(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), kernel = static_cast<int>(state.range(1));
  const bool stats = state.range(2) != 0;
  const cu::KvDtype dtype = kernel == 0 ? cu::KvDtype::kF32 : cu::KvDtype::kBf16;
  const int nh = kKvHeads * kGroup, d = kHeadDim, last_w = std::min(n, 32);
  cu::DeviceKvCache cache({1, kKvHeads, d}, dtype, n);
  const auto kd = to_device(random_vec(static_cast<size_t>(n) * kKvHeads * d, 11, -2, 2));
  const auto vd = to_device(random_vec(static_cast<size_t>(n) * kKvHeads * d, 12));
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  const auto pd = to_device(pos);
  cache.append(0, kd.data(), vd.data(), pd.data(), n);
  const std::vector<float> q = random_vec(static_cast<size_t>(n) * nh * d, 13, -2, 2);
  const auto qd = to_device(q);
  cu::DeviceBuffer<float> out(q.size()), col(static_cast<size_t>(nh) * n);
  cu::DeviceBuffer<float> last(static_cast<size_t>(nh) * last_w * n);
  cu::AttentionArgs a;
  a.out = out.data();
  a.q = qd.data();
  a.kv = cache.layer(0);
  a.n = n;
  a.num_heads = nh;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.tensor_core_prefill = kernel == 2;
  if (stats) {
    a.col_sums = col.data();
    a.last_probs = last.data();
    a.last_w = last_w;
    a.stats_stride = n;
  }
  cu::attention(a);  // warm-up, then the check
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(q.size()), got_last(stats ? last.size() : 0);
  out.download(got.data(), got.size());
  if (stats) last.download(got_last.data(), got_last.size());
  const kvb::kernels::KvCache host = cache.download();
  const kvb::kernels::LayerKvView view = host.layer(0);
  auto q_at = [&](int i, int h, int x) {
    const float f = q[(static_cast<size_t>(i) * nh + h) * d + x];
    return kernel != 2 ? double{f} : double{round_bf16(f)};
  };
  double max_err = 0, max_p_err = 0;
  for (int h : {0, nh - 1}) {
    const int kvh = h / kGroup;
    for (int i : {0, n / 2, n - 1}) {
      std::vector<double> s(i + 1), o(d, 0.0);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int x = 0; x < d; ++x) dot += q_at(i, h, x) * view.key(kvh, j)[x];
        s[j] = dot * a.scale;
        mx = std::max(mx, s[j]);
      }
      for (int j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int j = 0; j <= i; ++j) {
        for (int x = 0; x < d; ++x) o[x] += s[j] / sum * view.value(kvh, j)[x];
      }
      for (int x = 0; x < d; ++x) {
        const float g = got[(static_cast<size_t>(i) * nh + h) * d + x];
        max_err = std::max(max_err, std::fabs(o[x] - g));
      }
      if (stats && h == 0 && i == n - 1) {
        const float* row = got_last.data() + static_cast<size_t>(last_w - 1) * n;
        for (int j = 0; j <= i; ++j) {
          max_p_err = std::max(max_p_err, std::fabs(s[j] / sum - row[j]));
        }
      }
    }
  }
  // Kernel 2: mma_tolerance.
  double tol = 1e-4;
  if (kernel == 2) {
    double qmax = 0, kmax = 0;
    for (size_t r = 0; r < q.size() / d; ++r) {
      double s2 = 0;
      for (int x = 0; x < d; ++x) {
        const double v = q_at(static_cast<int>(r / nh), static_cast<int>(r % nh), x);
        s2 += v * v;
      }
      qmax = std::max(qmax, std::sqrt(s2));
    }
    for (int h = 0; h < kKvHeads; ++h) {
      for (int j = 0; j < n; ++j) {
        double s2 = 0;
        for (int x = 0; x < d; ++x) s2 += double{view.key(h, j)[x]} * view.key(h, j)[x];
        kmax = std::max(kmax, std::sqrt(s2));
      }
    }
    tol = mma_tolerance(a.scale, d, qmax, kmax);
  }
  const bool ok = max_err <= tol && max_p_err <= 1e-5;
  const double flop = 4.0 * d * nh * (static_cast<double>(n) * (n + 1) / 2);
  double total = 0;
  for (auto _ : state) {
    (void)_;
    const double t = gpu_seconds([&] { cu::attention(a); });
    state.SetIterationTime(t);
    total += t;
  }
  const double per = total / state.iterations();
  state.counters["tok/s"] = n / per;
  state.counters["TFLOP/s"] = flop / per / 1e12;
  state.counters["pct_bf16_peak"] = 100.0 * flop / per / 1e12 / g_bf16_tflops;
  state.counters["max_err"] = max_err;
  state.counters["correct"] = ok ? 1 : 0;
  if (!ok) state.SkipWithError("prefill attention differs from the double reference");
}

BENCHMARK(bm_decode_attention)
    ->ArgNames({"ctx", "bf16", "probs", "ragged"})
    ->ArgsProduct({{1024, 4096, 16384, 32768}, {0, 1}, {0, 1}, {0, 1}})
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_decode_attention_stream)
    ->ArgNames({"ctx", "bf16", "probs", "ragged", "blocks_per_sm"})
    ->ArgsProduct({{1024, 4096, 16384, 32768}, {0, 1}, {0, 1}, {0, 1}, {0}})
    ->Args({4096, 1, 0, 0, 2})
    ->Args({4096, 1, 0, 0, 8})
    ->Args({32768, 1, 0, 0, 2})
    ->Args({32768, 1, 0, 0, 8})
    ->Args({32768, 0, 0, 0, 8})
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_decode_attention_mma)
    ->ArgNames({"ctx", "bf16", "probs", "ragged", "blocks_per_sm"})
    ->ArgsProduct({{1024, 4096, 16384, 32768}, {1}, {0}, {0, 1}, {0}})
    ->Args({32768, 1, 0, 0, 2})
    ->Args({4096, 1, 0, 0, 2})
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_decode_attention_tuning)
    ->ArgNames({"ctx", "bf16", "probs", "ragged", "rows", "blocks_per_sm"})
    ->Apply(decode_tuning_args)
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_prefill_attention)
    ->ArgNames({"n", "kernel", "stats"})
    ->ArgsProduct({{1024, 4096}, {0, 1, 2}, {0, 1}})
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_decode_eviction)
    ->ArgNames({"len", "victim"})
    ->ArgsProduct({{1024, 32768}, {0, 1}})
    ->UseManualTime()
    ->Repetitions(3)
    ->DisplayAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_keep_top)
    ->ArgNames({"len", "path"})
    ->ArgsProduct({{1032, 8200}, {0, 1}})
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
  // --pool-keep-mib=N (ours, taken out before Google Benchmark reads the rest): the default
  // memory pool keeps N MiB across syncs (cu::keep_pool_memory); 0, the default, is CUDA's.
  // Every call below allocates its scratch with cudaMallocAsync and the timing syncs after it.
  long pool_keep_mib = 0;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--pool-keep-mib=", 0) == 0) {
      char* end = nullptr;
      pool_keep_mib = std::strtol(arg.c_str() + 16, &end, 10);
      if (*end != '\0' || pool_keep_mib < 0 || pool_keep_mib > (1L << 20)) {
        std::fprintf(stderr, "bench_cuda_kernels: --pool-keep-mib takes 0..1048576, got %s\n",
                     arg.c_str() + 16);
        return 2;
      }
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  if (pool_keep_mib > 0) cu::keep_pool_memory(static_cast<uint64_t>(pool_keep_mib) << 20);
  std::fprintf(stderr, "memory pool keeps %ld MiB across syncs\n", pool_keep_mib);
  benchmark::AddCustomContext("pool_keep_MiB", std::to_string(pool_keep_mib));
  g_d2d_gbps = measure_d2d_gbps();
  std::fprintf(stderr, "device-to-device cudaMemcpy: %.1f GB/s (read + write)\n", g_d2d_gbps);
  benchmark::AddCustomContext("d2d_GBps", std::to_string(g_d2d_gbps));
  g_bf16_tflops = measure_bf16_tflops();
  std::fprintf(stderr, "cuBLAS bf16 GEMM 8192^3: %.1f TFLOP/s\n", g_bf16_tflops);
  benchmark::AddCustomContext("bf16_gemm_TFLOPs", std::to_string(g_bf16_tflops));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
