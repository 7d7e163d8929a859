// Tests kvb::kernels::cpu::matmul_wt, matmul_wt_packed and pack_wt_panels (matmul.h): matmul's
// contract with the weight given transposed, so every output must be matmul_portable's bits on
// w = b^T (the scalar emulation of the 16-lane order and its tree), on every path (the `.avx2`
// and `.portable` copies of this test), every thread count and every grouping of rows; and
// matmul_reference's value within the usual bound.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "random_floats.h"

namespace kvb::kernels::cpu {
namespace {

using test::random_vec;

// w [m, k] -> b = w^T [k, ldb] (ldb >= m; the columns past m hold junk that must not be read
// into any output).
std::vector<float> transpose(const std::vector<float>& w, int m, int k, size_t ldb) {
  std::vector<float> b(static_cast<size_t>(k) * ldb, 1.0e30f);
  for (int j = 0; j < m; ++j) {
    for (int p = 0; p < k; ++p)
      b[static_cast<size_t>(p) * ldb + j] = w[static_cast<size_t>(j) * k + p];
  }
  return b;
}

// First index where a and b differ in bits, or -1.
long first_difference(const float* a, const float* b, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return static_cast<long>(i);
  }
  return -1;
}

struct Shape {
  int n, k, m;
};

// Shapes: k short (attention's Q K^T at head_dim 16-256; 64, 128 and 256 have unrolled lanes), k
// long (its P V over thousands of slots, the span-blocked path past 256), k not a multiple of 16
// (lanes with fewer terms), m not a multiple of 16 (masked columns) and below 8, n not a multiple
// of the 6-row tile, k = 0.
const Shape kShapes[] = {
    {1, 1, 1},      {1, 64, 1},     {5, 7, 3},     {6, 16, 16},   {7, 17, 17},   {13, 64, 40},
    {96, 64, 4096}, {96, 40, 301},  {11, 255, 9},  {12, 256, 33}, {8, 128, 50},  {13, 257, 48},
    {37, 1000, 64}, {96, 4097, 64}, {5, 3000, 23}, {3, 0, 20},    {30, 200, 256}};

TEST(MatmulWt, EveryShapeIsMatmulsBitsOnTheTransposedWeight) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << s.n << " k=" << s.k << " m=" << s.m);
    const uint32_t seed = static_cast<uint32_t>(s.n * 1000003 + s.k * 1009 + s.m);
    const std::vector<float> x = random_vec(static_cast<size_t>(s.n) * s.k, seed);      // [n, k]
    const std::vector<float> w = random_vec(static_cast<size_t>(s.m) * s.k, seed + 1);  // [m, k]
    const size_t ldb = s.m + 5;  // b's rows wider than m: the kernel must stop at m
    const std::vector<float> b = transpose(w, s.m, s.k, ldb);
    std::vector<float> want(static_cast<size_t>(s.n) * s.m), got(want.size(), -7.0f);
    std::vector<float> ref(want.size());
    matmul_portable(want.data(), x.data(), w.data(), nullptr, s.n, s.k, s.m);
    matmul_reference(ref.data(), x.data(), w.data(), nullptr, s.n, s.k, s.m);
    matmul_wt(got.data(), s.m, x.data(), s.k, b.data(), ldb, s.n, s.k, s.m);
    ASSERT_EQ(first_difference(want.data(), got.data(), want.size()), -1);
    // The value: within matmul's bound of the double reference (so the bits above are a sum).
    for (int i = 0; i < s.n; ++i) {
      for (int j = 0; j < s.m; ++j) {
        double abs_sum = 0;
        for (int p = 0; p < s.k; ++p) {
          abs_sum += std::fabs(double{x[static_cast<size_t>(i) * s.k + p]} *
                               w[static_cast<size_t>(j) * s.k + p]);
        }
        const size_t at = static_cast<size_t>(i) * s.m + j;
        ASSERT_LE(std::fabs(double{got[at]} - ref[at]), 4.0 * (s.k + 1) * FLT_EPSILON * abs_sum)
            << i << "," << j;
      }
    }
  }
}

// Packed panels: the same bits as matmul_wt for every window of columns [j0, j0 + m) and every
// first row of b (panels + 16 * p0: attention's P x V from slot lo), with panels wider apart
// than needed and y rows wider than m (what lies past a row's m columns is left alone); and with
// a scale, the sum's bits times it (attention's Q K^T).
TEST(MatmulWt, PackedPanelsGiveTheSameBitsForEveryColumnWindow) {
  const int n = 14, k_all = 300, m_all = 77;
  const std::vector<float> x = random_vec(static_cast<size_t>(n) * k_all, 3);      // [n, k_all]
  const std::vector<float> b = random_vec(static_cast<size_t>(k_all) * m_all, 4);  // [k_all, m_all]
  const size_t stride = 16 * static_cast<size_t>(k_all) + 48;
  const int panels = (m_all + 15) / 16;
  AlignedScratch buf;
  float* pan = buf.get(panels * stride);
  pack_wt_panels(pan, stride, b.data(), m_all, k_all, m_all);
  // The layout, by hand: b[p][j] at panel j / 16, row p, place j % 16; zeros past m_all.
  for (int p : {0, 1, 150, k_all - 1}) {
    for (int j : {0, 15, 16, 63, 64, m_all - 1}) {
      ASSERT_EQ(pan[(j / 16) * stride + 16 * p + j % 16], b[static_cast<size_t>(p) * m_all + j]);
    }
    for (int j = m_all; j < panels * 16; ++j)
      ASSERT_EQ(pan[(j / 16) * stride + 16 * p + j % 16], 0.0f);
  }
  const struct {
    int p0, k, j0, m;
  } cases[] = {{0, 64, 0, 77}, {0, 64, 5, 9},    {0, 300, 16, 32}, {44, 256, 3, 70},
               {16, 1, 76, 1}, {7, 200, 20, 13}, {0, 17, 31, 2},   {299, 1, 0, 77}};
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << "p0=" << c.p0 << " k=" << c.k << " j0=" << c.j0 << " m=" << c.m);
    const size_t ldy = c.m + 3;
    std::vector<float> want(static_cast<size_t>(n) * c.m), got(n * ldy, -3.0f);
    // x's columns [p0, p0 + k) against b's rows [p0, p0 + k) and columns [j0, j0 + m).
    matmul_wt(want.data(), c.m, x.data() + c.p0, k_all,
              b.data() + static_cast<size_t>(c.p0) * m_all + c.j0, m_all, n, c.k, c.m);
    matmul_wt_packed(got.data(), ldy, x.data() + c.p0, k_all, pan + 16 * static_cast<size_t>(c.p0),
                     stride, n, c.k, c.j0, c.m);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(
          first_difference(want.data() + static_cast<size_t>(i) * c.m, got.data() + i * ldy, c.m),
          -1)
          << "row " << i;
      for (size_t j = c.m; j < ldy; ++j) ASSERT_EQ(got[i * ldy + j], -3.0f) << "row " << i;
    }
    // With a scale: the sum's bits, then one multiply.
    const float scale = 0.37f;
    matmul_wt_packed(got.data(), ldy, x.data() + c.p0, k_all, pan + 16 * static_cast<size_t>(c.p0),
                     stride, n, c.k, c.j0, c.m, scale);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < c.m; ++j) {
        const float w = want[static_cast<size_t>(i) * c.m + j] * scale;
        ASSERT_EQ(first_difference(&w, &got[i * ldy + j], 1), -1) << "scaled, " << i << "," << j;
      }
    }
  }
}

// A row's bits depend only on that row of x and on b: not on the rows beside it (tile
// boundaries), nor on the thread count.
TEST(MatmulWt, BatchAndThreadInvariantBits) {
  for (const Shape& s : {Shape{40, 64, 300}, Shape{25, 700, 40}}) {
    SCOPED_TRACE(testing::Message() << "k=" << s.k << " m=" << s.m);
    const std::vector<float> x = random_vec(static_cast<size_t>(s.n) * s.k, 21);
    const std::vector<float> b = random_vec(static_cast<size_t>(s.k) * s.m, 22);
    const int saved = omp_get_max_threads();
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> all(static_cast<size_t>(s.n) * s.m);
      matmul_wt(all.data(), s.m, x.data(), s.k, b.data(), s.m, s.n, s.k, s.m);
      for (int start : {1, 5, 7, s.n - 1}) {
        std::vector<float> part(static_cast<size_t>(s.n - start) * s.m);
        matmul_wt(part.data(), s.m, x.data() + static_cast<size_t>(start) * s.k, s.k, b.data(), s.m,
                  s.n - start, s.k, s.m);
        ASSERT_EQ(first_difference(part.data(), all.data() + static_cast<size_t>(start) * s.m,
                                   part.size()),
                  -1)
            << "rows from " << start << ", threads " << threads;
      }
      if (first.empty()) first = all;
      ASSERT_EQ(first_difference(first.data(), all.data(), all.size()), -1) << threads;
    }
    omp_set_num_threads(saved);
  }
}

TEST(MatmulWt, BadArgumentsAreRefused) {
  std::vector<float> y(16), x(16), b(16);
  EXPECT_THROW(matmul_wt(y.data(), 4, x.data(), 4, b.data(), 3, 4, 4, 4), Error);  // ldb < m
  EXPECT_THROW(matmul_wt(y.data(), 4, x.data(), 3, b.data(), 4, 4, 4, 4), Error);  // ldx < k
  EXPECT_THROW(matmul_wt(y.data(), 4, x.data(), 4, b.data(), 4, -1, 4, 4), Error);
  AlignedScratch buf;
  float* pan = buf.get(64);
  EXPECT_THROW(matmul_wt_packed(y.data(), 4, x.data(), 4, pan, 8, 1, 4, 0, 4), Error);  // stride
  EXPECT_THROW(matmul_wt_packed(y.data(), 4, x.data(), 4, pan + 1, 16, 1, 4, 0, 4), Error);
  EXPECT_THROW(matmul_wt_packed(y.data(), 4, x.data(), 4, pan, 16, 1, 4, 14, 4),
               Error);  // 2 panels, stride < 16 k
  EXPECT_THROW(matmul_wt_packed(y.data(), 4, x.data(), 4, pan, 64, 1, 4, -1, 4), Error);
}

// The active path is the one that ran (the `.portable` copy runs the scalar definition).
TEST(MatmulWt, RunsTheActivePath) {
  std::vector<float> y(8 * 20), x(8 * 9, 0.5f), b(9 * 20, 0.25f);
  simd_dispatch_counts() = {};
  matmul_wt(y.data(), 20, x.data(), 9, b.data(), 20, 8, 9, 20);
  const Isa want = active_isa() >= Isa::kAvx2 ? Isa::kAvx2 : Isa::kPortable;
  EXPECT_EQ(simd_dispatch_counts().of(SimdKernel::kMatmulWt, want), 1u);
  for (float v : y) EXPECT_EQ(v, 9 * 0.125f);
}

}  // namespace
}  // namespace kvb::kernels::cpu
