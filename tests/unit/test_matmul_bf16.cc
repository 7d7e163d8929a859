// Tests kvb::kernels::cpu::matmul_bf16 and the bf16 rounding: rounding against hand-computed
// cases and the law of round-to-nearest-even, and the matmul against the f32 matmul on the widened
// weights, bit for bit, on every SIMD path this CPU runs, awkward shapes, thread counts 1-3.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"
#include "float_bits.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "random_floats.h"

namespace kvb::kernels::cpu {
namespace {

using test::bits;
using test::from_bits;

TEST(Bf16Round, HandComputedCases) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (bf16 keeps 7 fraction bits): ties to even, 1.
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above the tie rounds up, just below rounds down.
  EXPECT_EQ(bf16_from_f32(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(bf16_from_f32(from_bits(0x3f807fff)), 0x3f80);
  EXPECT_EQ(bf16_from_f32(-2.5f), 0xc020);  // exact
  EXPECT_EQ(bf16_from_f32(0.0f), 0x0000);
  EXPECT_EQ(bf16_from_f32(-0.0f), 0x8000);
  // The largest finite f32 rounds up to infinity (bf16's largest finite is 0x7f7f).
  EXPECT_EQ(bf16_from_f32(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(bf16_from_f32(std::numeric_limits<float>::infinity()), 0x7f80);
  // A NaN whose payload lies in the dropped bits stays a NaN (truncation would give infinity).
  const uint16_t nan = bf16_from_f32(from_bits(0x7f800001));
  EXPECT_TRUE(std::isnan(f32_from_bf16(nan)));
  EXPECT_EQ(bits(f32_from_bf16(0x3f81)), 0x3f810000u);
}

TEST(Bf16Round, NearestEvenLaw) {
  // For random finite f32 (all exponents): the result is one of the two bf16 neighbours, the
  // nearer one, and on a tie the one with an even last bit.
  std::mt19937 gen(11);
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = gen();
    if ((b & 0x7f800000u) == 0x7f800000u) continue;  // inf / NaN
    if ((b & 0x7f800000u) == 0x7f000000u) continue;  // rounding up may overflow: case above
    const float f = from_bits(b);
    const uint32_t down = b & 0xffff0000u, up = down + 0x10000u;
    const double d_down = std::fabs(double{f} - from_bits(down));
    const double d_up = std::fabs(double{f} - from_bits(up));
    const uint32_t expect = d_down < d_up         ? down
                            : d_up < d_down       ? up
                            : ((down >> 16) & 1u) ? up
                                                  : down;
    ASSERT_EQ(static_cast<uint32_t>(bf16_from_f32(f)) << 16, expect) << std::hex << b;
  }
}

using test::random_vec;

// matmul_bf16 on path `path` vs matmul on the widened weights, bit for bit, with and without bias.
void check_shape(Bf16Path path, int n, int k, int m) {
  SCOPED_TRACE(testing::Message() << bf16_path_name(path) << " n=" << n << " k=" << k
                                  << " m=" << m);
  const uint32_t seed = static_cast<uint32_t>(n * 1000003 + k * 1009 + m);
  const std::vector<float> x = random_vec(static_cast<size_t>(n) * k, seed);  // [n, k]
  const std::vector<float> wf = random_vec(static_cast<size_t>(m) * k, seed + 1);
  std::vector<uint16_t> w(wf.size());  // [m, k]
  round_to_bf16(wf.data(), wf.size(), w.data());
  std::vector<float> widened(w.size());
  for (size_t i = 0; i < w.size(); ++i) widened[i] = f32_from_bf16(w[i]);
  const std::vector<float> bias = random_vec(m, seed + 2);
  for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
    std::vector<float> got(static_cast<size_t>(n) * m, -7.0f), want(got.size(), 3.0f);
    matmul_bf16(got.data(), x.data(), w.data(), b, n, k, m, path);
    matmul(want.data(), x.data(), widened.data(), b, n, k, m);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << (b ? "with" : "without") << " bias";
  }
}

std::vector<Bf16Path> runnable_paths() {
  std::vector<Bf16Path> paths;
  for (Bf16Path p : {Bf16Path::kAuto, Bf16Path::kAvx512, Bf16Path::kAvx2, Bf16Path::kPortable}) {
    if (bf16_path_supported(p)) paths.push_back(p);
  }
  return paths;
}

TEST(MatmulBf16, BitIdenticalToF32MatmulOnWidenedWeights) {
  std::printf("bf16 paths on this CPU: auto = %s;", bf16_path_name(bf16_auto_path()));
  for (Bf16Path p : runnable_paths()) std::printf(" %s", bf16_path_name(p));
  std::printf("\n");
  const int shapes[][3] = {{1, 1, 1},     {1, 3, 7},      {1, 17, 33},   {1, 16, 16},
                           {1, 576, 576}, {1, 1536, 577}, {1, 4097, 19}, {2, 7, 3},
                           {3, 64, 70},   {5, 33, 129},   {16, 17, 65},  {17, 576, 192},
                           {40, 100, 31}, {1, 0, 5},      {0, 5, 5}};
  for (Bf16Path p : runnable_paths()) {
    for (const auto& s : shapes) check_shape(p, s[0], s[1], s[2]);
  }
}

TEST(MatmulBf16, ThreadCountsGiveTheSameBits) {
  const int n = 1, k = 300, m = 1000;  // decode: parallel over chunks of outputs
  const std::vector<float> x = random_vec(static_cast<size_t>(6) * k, 5);
  const std::vector<float> wf = random_vec(static_cast<size_t>(m) * k, 6);
  std::vector<uint16_t> w(wf.size());
  round_to_bf16(wf.data(), wf.size(), w.data());
  const int saved = omp_get_max_threads();
  for (int rows : {n, 6}) {
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> y(static_cast<size_t>(rows) * m);
      matmul_bf16(y.data(), x.data(), w.data(), nullptr, rows, k, m);
      if (first.empty()) {
        first = y;
      } else {
        EXPECT_EQ(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)), 0)
            << rows << " rows, " << threads << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(MatmulBf16, NegativeZeroSurvivesTheTail) {
  // Every product -0 (x = -0, w = +1): the dot is +0 + -0 = +0 in every lane; with a tail of k,
  // lanes past k must not be touched. Compare a sign-sensitive case to the f32 matmul.
  const int k = 19, m = 3;
  std::vector<float> wf(static_cast<size_t>(m) * k, 1e-30f);  // products underflow to -0
  std::vector<uint16_t> w(wf.size());
  round_to_bf16(wf.data(), wf.size(), w.data());
  std::vector<float> widened(w.size());
  for (size_t i = 0; i < w.size(); ++i) widened[i] = f32_from_bf16(w[i]);
  for (Bf16Path p : runnable_paths()) {
    for (int n : {1, 3, 20}) {  // decode tile, few-row tile, widened panels
      std::vector<float> xn(static_cast<size_t>(n) * k, -1e-30f);
      std::vector<float> got(static_cast<size_t>(n) * m), want(got.size());
      matmul_bf16(got.data(), xn.data(), w.data(), nullptr, n, k, m, p);
      matmul(want.data(), xn.data(), widened.data(), nullptr, n, k, m);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << bf16_path_name(p) << " n=" << n;
      EXPECT_TRUE(std::signbit(got[0])) << "the dot of -0 products is -0";
    }
  }
}

TEST(MatmulBf16, RejectsBadArguments) {
  float y = 0;
  const float x = 1;
  const uint16_t w = 0x3f80;
  EXPECT_THROW(matmul_bf16(&y, &x, &w, nullptr, -1, 1, 1), Error);
  EXPECT_THROW(matmul_bf16(&y, nullptr, &w, nullptr, 1, 1, 1), Error);
  matmul_bf16(&y, &x, &w, nullptr, 1, 1, 1, Bf16Path::kPortable);
  EXPECT_EQ(y, 1.0f);
}

}  // namespace
}  // namespace kvb::kernels::cpu
