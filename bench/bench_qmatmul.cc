// Google Benchmark for kvb::kernels::cpu::qmatmul (`--dtype native`'s products) at the shapes of
// Gemma-3-270M Q4_K_M (Q5_0 and Q8_0 rows of 640, Q4_K and Q6_K rows of 1,024 and 2,048) and
// SmolLM2-135M Q4_1 (rows of 576 and 1,536): prefill (n = 512 activation rows) and decode
// (n = 1, weights cold), on each path this CPU runs. Counters: integer multiply-adds per second
// (n k m / time) and, for decode, the weight bytes read per second. The roof row is a register-only
// chain of the widest integer dot-product instruction the build has (vpdpbusd, else
// vpmaddubsw + vpmaddwd): the multiply-adds per second one core can issue. Every row first checks
// its output against the portable path, bit for bit.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/dequant.h"
#include "kernels/cpu/qmatmul.h"

namespace {

using kvb::kernels::cpu::ggml_block_info;
using kvb::kernels::cpu::Q8Act;
using kvb::kernels::cpu::qmatmul;
using kvb::kernels::cpu::QPath;
using kvb::kernels::cpu::qpath_supported;
using kvb::kernels::cpu::qrow_bytes;
using kvb::kernels::cpu::quantize_q8_act;

// Random blocks whose f16 scales are finite and small (2^-8 .. 1), as test_qmatmul's.
std::vector<uint8_t> random_rows(uint32_t type, int m, int k, uint32_t seed) {
  const size_t row = qrow_bytes(type, k);
  std::vector<uint8_t> w(row * m);
  std::mt19937 gen(seed);
  for (auto& b : w) b = static_cast<uint8_t>(gen());
  // Every f16 field (the block's scales, at these offsets) becomes a small positive normal.
  size_t block = 0, elems = 0;
  ggml_block_info(type, &block, &elems);
  const std::vector<size_t> at = type == 14                              ? std::vector<size_t>{208}
                                 : type == 3 || type == 12 || type == 13 ? std::vector<size_t>{0, 2}
                                                                         : std::vector<size_t>{0};
  const size_t blocks = static_cast<size_t>(m) * k / elems;
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t o : at) {
      const uint16_t h = static_cast<uint16_t>(((7 + gen() % 8) << 10) | (gen() & 0x3FF));
      std::memcpy(&w[b * block + o], &h, 2);
    }
  }
  return w;
}

void run(benchmark::State& state, uint32_t type, QPath path) {
  if (!qpath_supported(path)) {
    state.SkipWithError("path not available on this CPU or build");
    return;
  }
  const int n = static_cast<int>(state.range(0));
  const int k = static_cast<int>(state.range(1));
  const int m = static_cast<int>(state.range(2));
  std::mt19937 gen(7);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> x(static_cast<size_t>(n) * k);
  for (float& v : x) v = g(gen);
  std::vector<Q8Act> xq(static_cast<size_t>(n) * k / 32);
  quantize_q8_act(x.data(), n, k, xq.data());
  // Decode reads every weight once per token from memory: rotate over copies >= 256 MiB.
  const size_t row = qrow_bytes(type, k), bytes = row * m;
  const size_t copies = n == 1 ? std::max<size_t>(1, (size_t{256} << 20) / bytes + 1) : 1;
  std::vector<uint8_t> w;
  for (size_t c = 0; c < copies; ++c) {
    const std::vector<uint8_t> one = random_rows(type, m, k, 11 + static_cast<uint32_t>(c));
    w.insert(w.end(), one.begin(), one.end());
  }
  std::vector<float> y(static_cast<size_t>(n) * m), ref(y.size());
  qmatmul(ref.data(), xq.data(), w.data(), type, nullptr, n, k, m, QPath::kPortable);
  qmatmul(y.data(), xq.data(), w.data(), type, nullptr, n, k, m, path);
  if (std::memcmp(y.data(), ref.data(), y.size() * 4) != 0) {
    state.SkipWithError("output differs from the portable path");
    return;
  }
  size_t c = 0;
  for (auto _ : state) {
    qmatmul(y.data(), xq.data(), w.data() + c * bytes, type, nullptr, n, k, m, path);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["GMAC/s"] =
      benchmark::Counter(iters * n * k * m * 1e-9, benchmark::Counter::kIsRate);
  if (n == 1) {
    state.counters["GB/s"] = benchmark::Counter(iters * bytes * 1e-9, benchmark::Counter::kIsRate);
  }
  state.counters["threads"] = omp_get_max_threads();
}

// One core's integer multiply-add issue rate: eight independent chains (latency 4-5 cycles, so
// eight keep two units busy) of the build's widest
// u8 x s8 dot product on 256-bit registers (32 multiply-adds each).
void roof(benchmark::State& state) {
#if defined(__AVX2__)
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  __m256i c0 = _mm256_set1_epi32(0), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KVB_DOT(c) c = _mm256_dpbusd_epi32(c, a, b)
#else
#define KVB_DOT(c) \
  c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
#endif
  constexpr int kSteps = 4096;
  for (auto _ : state) {
    for (int s = 0; s < kSteps; ++s) {
      KVB_DOT(c0);
      KVB_DOT(c1);
      KVB_DOT(c2);
      KVB_DOT(c3);
      KVB_DOT(c4);
      KVB_DOT(c5);
      KVB_DOT(c6);
      KVB_DOT(c7);
      // Keeps the chains in registers, each step's work live, with no store.
      asm volatile(""
                   : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6),
                     "+x"(c7));
    }
  }
#undef KVB_DOT
  benchmark::DoNotOptimize(_mm256_add_epi32(_mm256_add_epi32(c0, c1), c7));
  state.counters["GMAC/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kSteps * 8 * 32 * 1e-9,
                         benchmark::Counter::kIsRate);
#else
  state.SkipWithError("no AVX2 in this build");
#endif
}

constexpr uint32_t kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14;

void shapes(benchmark::internal::Benchmark* b, uint32_t type) {
  // {n, k, m}: Gemma-3-270M's q|k|v, gate|up (k 640), o (k 1,024), down (k 2,048); SmolLM2's
  // q (k 576) and down (k 1,536).
  switch (type) {
    case kQ5_0:
      b->Args({512, 640, 1536})->Args({512, 640, 4096})->Args({1, 640, 4096});
      break;
    case kQ8_0:
      b->Args({512, 640, 2048})->Args({1, 640, 2048});
      break;
    case kQ4_K:
      b->Args({512, 1024, 640})->Args({512, 2048, 640})->Args({1, 2048, 640});
      break;
    case kQ6_K:
      b->Args({512, 2048, 640})->Args({1, 2048, 640});
      break;
    case kQ4_1:
      b->Args({512, 576, 576})->Args({512, 1536, 576})->Args({1, 1536, 576});
      break;
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

#define KVB_QBENCH(T, NAME)                                                                       \
  BENCHMARK_CAPTURE(run, NAME##_avx512, T, QPath::kAvx512)->Apply([](auto* b) { shapes(b, T); }); \
  BENCHMARK_CAPTURE(run, NAME##_avx2, T, QPath::kAvx2)->Apply([](auto* b) { shapes(b, T); })

KVB_QBENCH(kQ5_0, Q5_0);
KVB_QBENCH(kQ8_0, Q8_0);
KVB_QBENCH(kQ4_K, Q4_K);
KVB_QBENCH(kQ6_K, Q6_K);
KVB_QBENCH(kQ4_1, Q4_1);
BENCHMARK(roof)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
