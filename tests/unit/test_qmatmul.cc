// The quantized products (kernels/cpu/qmatmul.h, issue 35): activations quantized as the contract
// says (a hand-computed block, ties to even), every block type's row product against an
// independent float64 sum over ggml's own dequantization (kernels/cpu/dequant.h, bit-identical to
// gguf-py) of the weights and of the quantized activations, and every path (AVX-512, AVX2,
// portable, auto) bit-identical on random blocks, for several shapes, biases and thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/qmatmul.h"

namespace kvb::kernels::cpu {
namespace {

struct TypeCase {
  const char* name;
  uint32_t type;
  size_t block_bytes, block_elems;
  std::vector<size_t> f16_at;  // offsets of the block's f16 scales
};
const std::vector<TypeCase> kTypes = {
    {"Q4_0", 2, 18, 32, {0}},    {"Q4_1", 3, 20, 32, {0, 2}},   {"Q5_0", 6, 22, 32, {0}},
    {"Q8_0", 8, 34, 32, {0}},    {"Q4_K", 12, 144, 256, {0, 2}}, {"Q5_K", 13, 176, 256, {0, 2}},
    {"Q6_K", 14, 210, 256, {208}},
};

// m rows of k elements: random quants and packed scales, f16 scales of either sign with
// magnitudes 2^-8 .. 2^0 (so no product under- or overflows).
std::vector<uint8_t> random_rows(const TypeCase& t, int m, int k, std::mt19937& rng) {
  const size_t blocks = static_cast<size_t>(m) * k / t.block_elems;
  std::vector<uint8_t> w(blocks * t.block_bytes);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t at : t.f16_at) {
      const uint16_t h = static_cast<uint16_t>(((rng() & 1) << 15) | ((7 + rng() % 8) << 10) |
                                               (rng() & 0x3FF));
      std::memcpy(&w[b * t.block_bytes + at], &h, 2);
    }
  }
  return w;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0, 1);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  return x;
}

std::vector<QPath> available_paths() {
  std::vector<QPath> out;
  for (QPath p : {QPath::kAuto, QPath::kAvx512, QPath::kAvx2, QPath::kPortable}) {
    if (qpath_supported(p)) out.push_back(p);
  }
  return out;
}

TEST(QMatmul, ActivationsQuantizeAsTheContractSays) {
  // max |x| = 15.875: d = 15.875 / 127 = 0.125 exactly, so q = x * 8 rounded (ties to even).
  std::vector<float> x(32, 0.0f);
  x[0] = 15.875f;          // 127
  x[1] = -15.875f;         // -127
  x[2] = 63.4f / 8;        // 63
  x[3] = 2.5f / 8;         // 2.5: a tie, to 2
  x[4] = -3.5f / 8;        // -3.5: a tie, to -4
  x[5] = 0.01f;            // 0.08: 0
  x[31] = 100.6f / 8;      // 101
  Q8Act q{};
  for (QPath p : available_paths()) {
    quantize_q8_act(x.data(), 1, 32, &q, p);
    EXPECT_EQ(q.d, 0.125f);
    const std::vector<int> want = {127, -127, 63, 2, -4, 0};
    for (int l = 0; l < 6; ++l) EXPECT_EQ(q.q[l], want[l]) << l;
    EXPECT_EQ(q.q[31], 101);
    EXPECT_EQ(q.sum, 127 - 127 + 63 + 2 - 4 + 101);
  }
  // An all-zero block: d = 0, every q 0.
  std::vector<float> z(32, 0.0f);
  quantize_q8_act(z.data(), 1, 32, &q);
  EXPECT_EQ(q.d, 0.0f);
  EXPECT_EQ(q.sum, 0);
  // |x - d q| <= d / 2 everywhere (round to nearest), on random rows.
  std::mt19937 rng(7);
  const std::vector<float> r = random_floats(4 * 256, rng);
  std::vector<Q8Act> rq(4 * 8);
  quantize_q8_act(r.data(), 4, 256, rq.data());
  for (size_t e = 0; e < r.size(); ++e) {
    const Q8Act& b = rq[e / 32];
    EXPECT_LE(std::fabs(r[e] - b.d * b.q[e % 32]), b.d * 0.5f * 1.0001f) << e;
  }
}

// Quantization on every path and thread count (a call of 64 x 2,048 is split over threads) gives
// the portable loop's bits, with blocks whose elements land on ties (x = (j + 1/2) d, d a power of
// two), zero blocks and negative zeros among random ones.
TEST(QMatmul, QuantizationOnEveryPathAndThreadCountIsThePortableBits) {
  std::mt19937 rng(21);
  const int n = 64, k = 2048;
  std::vector<float> x = random_floats(static_cast<size_t>(n) * k, rng);
  for (int b = 0; b < n * k / 32; b += 7) {
    float* v = x.data() + 32 * b;
    v[0] = 127.0f / 16;  // amax: d = 1/16 exactly
    for (int l = 1; l < 32; ++l) {
      v[l] = (static_cast<float>(static_cast<int>(rng() % 200) - 100) + 0.5f) / 16;
    }
  }
  for (int l = 0; l < 32; ++l) x[32 * 5 + l] = l % 2 ? -0.0f : 0.0f;
  std::vector<Q8Act> ref(static_cast<size_t>(n) * k / 32);
  omp_set_num_threads(1);
  quantize_q8_act(x.data(), n, k, ref.data(), QPath::kPortable);
  EXPECT_EQ(ref[5].d, 0.0f);
  for (int l = 1; l < 32; ++l) EXPECT_EQ(ref[7].q[l] % 2, 0) << l;  // ties went to even
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (QPath p : available_paths()) {
      std::vector<Q8Act> got(ref.size());
      quantize_q8_act(x.data(), n, k, got.data(), p);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(Q8Act)), 0)
          << qpath_name(p) << " threads " << threads;
    }
  }
  omp_set_num_threads(1);
}

// The contract's integers and floats against float64 over ggml's dequantization: a wrong nibble,
// bit, scale or offset moves a result by far more than the float rounding allowed here.
TEST(QMatmul, EveryTypeMatchesFloat64OverDequantizedBlocks) {
  std::mt19937 rng(1234);
  const int n = 3, k = 512, m = 9;
  const std::vector<float> x = random_floats(static_cast<size_t>(n) * k, rng);
  std::vector<Q8Act> xq(static_cast<size_t>(n) * k / 32);
  quantize_q8_act(x.data(), n, k, xq.data());
  // The quantized activations as floats: d * q.
  std::vector<double> xa(x.size());
  for (size_t e = 0; e < x.size(); ++e) xa[e] = double(xq[e / 32].d) * xq[e / 32].q[e % 32];
  for (const TypeCase& t : kTypes) {
    ASSERT_TRUE(qmatmul_supports(t.type)) << t.name;
    EXPECT_EQ(qrow_bytes(t.type, k), k / t.block_elems * t.block_bytes) << t.name;
    const std::vector<uint8_t> w = random_rows(t, m, k, rng);
    std::vector<float> wf(static_cast<size_t>(m) * k);
    dequantize(t.type, w.data(), wf.data(), wf.size());
    const std::vector<float> bias = random_floats(m, rng);
    for (QPath p : available_paths()) {
      std::vector<float> y(static_cast<size_t>(n) * m);
      qmatmul(y.data(), xq.data(), w.data(), t.type, bias.data(), n, k, m, p);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < m; ++j) {
          double want = bias[j], mag = std::fabs(bias[j]);
          for (int e = 0; e < k; ++e) {
            const double term = double(wf[size_t(j) * k + e]) * xa[size_t(i) * k + e];
            want += term;
            mag += std::fabs(term);
          }
          EXPECT_NEAR(y[size_t(i) * m + j], want, 1e-5 * mag + 1e-30)
              << t.name << " path " << qpath_name(p) << " row " << i << " col " << j;
        }
      }
    }
  }
}

TEST(QMatmul, EveryPathGivesTheSameBits) {
  std::mt19937 rng(99);
  const std::vector<QPath> paths = available_paths();
  std::string ran;
  for (QPath p : paths) ran += std::string(qpath_name(p)) + " ";
  std::cout << "paths: " << ran << "\n";
  for (const TypeCase& t : kTypes) {
    for (const auto& [n, k, m] :
         {std::tuple{1, 256, 1}, std::tuple{1, 768, 64}, std::tuple{5, 512, 33},
          std::tuple{2, 2048, 130}, std::tuple{13, 512, 24}, std::tuple{17, 256, 17}}) {
      const std::vector<float> x = random_floats(static_cast<size_t>(n) * k, rng);
      std::vector<Q8Act> xq(static_cast<size_t>(n) * k / 32);
      quantize_q8_act(x.data(), n, k, xq.data(), QPath::kPortable);
      const std::vector<uint8_t> w = random_rows(t, m, k, rng);
      const std::vector<float> bias = random_floats(m, rng);
      std::vector<float> ref(static_cast<size_t>(n) * m);
      omp_set_num_threads(1);
      qmatmul(ref.data(), xq.data(), w.data(), t.type, nullptr, n, k, m, QPath::kPortable);
      std::vector<float> ref_b(ref.size());
      qmatmul(ref_b.data(), xq.data(), w.data(), t.type, bias.data(), n, k, m, QPath::kPortable);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        for (QPath p : paths) {
          std::vector<Q8Act> xq_p(xq.size());
          quantize_q8_act(x.data(), n, k, xq_p.data(), p);
          ASSERT_EQ(std::memcmp(xq_p.data(), xq.data(), xq.size() * sizeof(Q8Act)), 0)
              << qpath_name(p);
          std::vector<float> y(ref.size()), yb(ref.size());
          qmatmul(y.data(), xq.data(), w.data(), t.type, nullptr, n, k, m, p);
          qmatmul(yb.data(), xq.data(), w.data(), t.type, bias.data(), n, k, m, p);
          EXPECT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0)
              << t.name << " " << qpath_name(p) << " n " << n << " k " << k << " m " << m
              << " threads " << threads;
          EXPECT_EQ(std::memcmp(yb.data(), ref_b.data(), yb.size() * 4), 0)
              << t.name << " " << qpath_name(p) << " with bias";
        }
      }
    }
  }
  omp_set_num_threads(1);
}

// A forced path is the path that runs: portable counts as portable, avx2 as the AVX2 kernels,
// avx512 as the VNNI kernels where the build has them (else AVX2), auto as the active ISA's.
TEST(QMatmul, ForcedPathsAreThePathsThatRun) {
  std::mt19937 rng(5);
  const TypeCase& t = kTypes[1];
  const std::vector<uint8_t> w = random_rows(t, 4, 64, rng);
  const std::vector<float> x = random_floats(64, rng);
  std::vector<Q8Act> xq(2);
  quantize_q8_act(x.data(), 1, 64, xq.data());
  float y[4];
  EXPECT_EQ(qpath_kernels(QPath::kPortable), Isa::kPortable);
  for (QPath p : available_paths()) {
    const Isa want = qpath_kernels(p);
    if (p == QPath::kAvx2) {
      EXPECT_EQ(want, Isa::kAvx2);
    }
    if (p == QPath::kAvx512) {
      EXPECT_NE(want, Isa::kPortable);
    }
    simd_dispatch_counts() = {};
    qmatmul(y, xq.data(), w.data(), t.type, nullptr, 1, 64, 4, p);
    EXPECT_EQ(simd_dispatch_counts().of(SimdKernel::kQMatmul, want), 1u) << qpath_name(p);
    std::cout << qpath_name(p) << " runs the " << isa_name(want) << " kernels\n";
  }
}

TEST(QMatmul, UnsupportedTypesAndShapesAreErrors) {
  Q8Act xq[8] = {};
  std::vector<uint8_t> w(1024);
  float y[4];
  auto error = [&](uint32_t type, int k) {
    try {
      qmatmul(y, xq, w.data(), type, nullptr, 1, k, 1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(10, 256).find("the quantized products take Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, "
                                "Q6_K, not Q2_K"),
            std::string::npos)
      << error(10, 256);
  EXPECT_NE(error(12, 96).find("Q4_K rows hold a multiple of 256 elements, not 96"),
            std::string::npos);
  EXPECT_NE(error(0, 32).find("not F32"), std::string::npos);
}

}  // namespace
}  // namespace kvb::kernels::cpu
