// Tests kvb::kernels::cpu::matmul: accuracy against the double-accumulating reference over awkward
// shapes, bit-identity with the scalar emulation of its summation order, and determinism across
// batch groupings and OpenMP thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/matmul.h"
#include "random_floats.h"

namespace kvb::kernels::cpu {
namespace {

using test::random_vec;

bool same_bits(const float* a, const float* b, size_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

struct Shape {
  int n, k, m;
};

// Checks one shape with and without bias.
void check_shape(int n, int k, int m) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k << " m=" << m);
  const uint32_t seed = static_cast<uint32_t>(n * 1000003 + k * 1009 + m);
  const std::vector<float> x = random_vec(static_cast<size_t>(n) * k, seed);      // [n, k]
  const std::vector<float> w = random_vec(static_cast<size_t>(m) * k, seed + 1);  // [m, k]
  const std::vector<float> b = random_vec(static_cast<size_t>(m), seed + 2);      // [m]
  for (const float* bias : {static_cast<const float*>(nullptr), b.data()}) {
    SCOPED_TRACE(bias != nullptr ? "with bias" : "no bias");
    std::vector<float> y(static_cast<size_t>(n) * m, NAN);  // [n, m]
    std::vector<float> ref(y.size()), emu(y.size());        // [n, m]
    matmul(y.data(), x.data(), w.data(), bias, n, k, m);
    matmul_reference(ref.data(), x.data(), w.data(), bias, n, k, m);
    matmul_portable(emu.data(), x.data(), w.data(), bias, n, k, m);
    // The SIMD paths and the scalar emulation follow the same order: identical bits.
    ASSERT_TRUE(same_bits(y.data(), emu.data(), y.size()));
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < m; ++j) {
        // Error bound: an output is a chain of at most ceil(k/16) fused multiply-adds, 4 tree
        // additions and the bias addition, each rounding once with relative error <= 2^-24
        // (= FLT_EPSILON / 2) of a partial sum of magnitude <= S = sum_p |x_p w_p| + |bias|; the
        // reference adds one more rounding (double -> float). So |y - ref| <= (k + 7) / 2 *
        // FLT_EPSILON * S. We assert 4 * (k + 1) * FLT_EPSILON * S + 1e-30 (the k + 1 covers the
        // bias add at k = 1; the tiny absolute term covers S == 0). Bits are pinned separately by
        // the comparison with matmul_portable above.
        double abs_sum = bias != nullptr ? std::fabs(bias[j]) : 0.0;
        for (int p = 0; p < k; ++p) {
          abs_sum += std::fabs(static_cast<double>(x[static_cast<size_t>(i) * k + p]) *
                               w[static_cast<size_t>(j) * k + p]);
        }
        const double tol = 4.0 * (k + 1) * FLT_EPSILON * abs_sum + 1e-30;
        const size_t at = static_cast<size_t>(i) * m + j;
        ASSERT_LE(std::fabs(static_cast<double>(y[at]) - ref[at]), tol)
            << "at (" << i << ", " << j << ") y=" << y[at] << " ref=" << ref[at];
      }
    }
  }
}

TEST(Matmul, MatchesReferenceOnAwkwardShapes) {
  for (int n : {1, 2, 3, 7, 17, 64, 129}) {
    for (int k : {1, 3, 8, 64, 172, 576, 1000}) {
      for (int m : {1, 5, 32, 192, 577}) check_shape(n, k, m);
    }
  }
}

// k of 1,024 and more: the AVX2 path cuts k into spans of 512 that carry each tile's lane sums
// (attention's P x V over thousands of slots); the bits stay those of one pass (the scalar
// emulation), with k a multiple of 16 or not (the masked tail in the last span), a span boundary
// just past k, edge tiles in both directions, and bias.
TEST(Matmul, LongKGivesTheOnePassBits) {
  for (const Shape& s : {Shape{96, 4096, 64}, Shape{40, 1100, 50}, Shape{3, 2049, 7},
                         Shape{2, 1024, 3}, Shape{65, 1536, 25}, Shape{7, 1023, 9}}) {
    check_shape(s.n, s.k, s.m);
  }
}

TEST(Matmul, ModelShapes) {
  // stories260K and SmolLM2-135M projections, decode and a short prefill.
  for (const Shape& s : {Shape{1, 64, 172}, Shape{5, 172, 64}, Shape{3, 64, 512},
                         Shape{1, 576, 192}, Shape{9, 1536, 576}, Shape{4, 576, 1536}}) {
    check_shape(s.n, s.k, s.m);
  }
}

TEST(Matmul, ZeroSizes) {
  const std::vector<float> w = random_vec(5 * 3, 7), b = random_vec(5, 8);
  std::vector<float> y(2 * 5, NAN);
  matmul(y.data(), nullptr, w.data(), b.data(), 2, 0, 5);  // k == 0: y = bias
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 5; ++j) EXPECT_EQ(y[i * 5 + j], b[j]);
  }
  matmul(y.data(), nullptr, w.data(), nullptr, 2, 0, 5);  // k == 0, no bias: y = +0
  for (float v : y) EXPECT_EQ(v, 0.0f);
  matmul(nullptr, nullptr, nullptr, nullptr, 0, 3, 5);  // n == 0: nothing to do
  matmul(nullptr, nullptr, nullptr, nullptr, 2, 3, 0);  // m == 0: nothing to do
  EXPECT_THROW(matmul(y.data(), nullptr, w.data(), nullptr, -1, 3, 5), kvb::Error);
}

// Copies v to a 64-byte aligned address plus `offset` floats inside storage; returns the copy.
float* place(const std::vector<float>& v, int offset, std::vector<float>* storage) {
  storage->assign(v.size() + 16 + offset, 0.0f);
  float* p = storage->data();
  while (reinterpret_cast<uintptr_t>(p) % 64 != 0) ++p;
  std::memcpy(p + offset, v.data(), v.size() * sizeof(float));
  return p + offset;
}

// Aligned operands with k % 16 == 0 take the in-place path, misaligned ones are packed first
// (and w only for n >= 16): all must give the bits of the scalar emulation.
TEST(Matmul, AlignedAndMisalignedOperands) {
  for (const Shape& s : {Shape{1, 576, 200}, Shape{8, 576, 100}, Shape{40, 576, 70},
                         Shape{40, 64, 33}, Shape{40, 172, 70}}) {
    SCOPED_TRACE(testing::Message() << "n=" << s.n << " k=" << s.k << " m=" << s.m);
    const std::vector<float> x = random_vec(static_cast<size_t>(s.n) * s.k, 21);  // [n, k]
    const std::vector<float> w = random_vec(static_cast<size_t>(s.m) * s.k, 22);  // [m, k]
    std::vector<float> emu(static_cast<size_t>(s.n) * s.m);                       // [n, m]
    matmul_portable(emu.data(), x.data(), w.data(), nullptr, s.n, s.k, s.m);
    for (int x_off : {0, 1, 5}) {
      for (int w_off : {0, 3, 8}) {
        std::vector<float> xs, ws;
        std::vector<float> y(emu.size());  // [n, m]
        matmul(y.data(), place(x, x_off, &xs), place(w, w_off, &ws), nullptr, s.n, s.k, s.m);
        ASSERT_TRUE(same_bits(y.data(), emu.data(), y.size()))
            << "x offset " << x_off << " w offset " << w_off;
      }
    }
  }
}

// matmul_strided reads rows of k from wider rows (aligned strides read in place, others
// copied) and writes rows of m into wider rows, leaving the rest of them alone: the bits of
// matmul on the packed operands.
TEST(Matmul, StridedRowsGiveTheSameBits) {
  for (const Shape& s :
       {Shape{1, 64, 300}, Shape{3, 40, 17}, Shape{40, 64, 70}, Shape{96, 33, 129}}) {
    for (const size_t pad : {size_t{0}, size_t{7}, size_t{16}, size_t{24}}) {
      SCOPED_TRACE(testing::Message()
                   << "n=" << s.n << " k=" << s.k << " m=" << s.m << " pad=" << pad);
      const size_t ldx = s.k + pad, ldw = s.k + pad + (pad == 16 ? 0 : 3), ldy = s.m + pad + 1;
      const std::vector<float> x = random_vec(static_cast<size_t>(s.n) * ldx, 31);  // [n, ldx]
      const std::vector<float> w = random_vec(static_cast<size_t>(s.m) * ldw, 32);  // [m, ldw]
      std::vector<float> xp(static_cast<size_t>(s.n) * s.k), wp(static_cast<size_t>(s.m) * s.k);
      for (int i = 0; i < s.n; ++i) {
        std::memcpy(&xp[static_cast<size_t>(i) * s.k], &x[i * ldx], s.k * sizeof(float));
      }
      for (int j = 0; j < s.m; ++j) {
        std::memcpy(&wp[static_cast<size_t>(j) * s.k], &w[j * ldw], s.k * sizeof(float));
      }
      std::vector<float> emu(static_cast<size_t>(s.n) * s.m);  // [n, m]
      matmul_portable(emu.data(), xp.data(), wp.data(), nullptr, s.n, s.k, s.m);
      // On 64-byte boundaries (pad 16: rows of whole vectors) and off them.
      for (const int off : {0, 3}) {
        std::vector<float> xs, ws;
        std::vector<float> y(static_cast<size_t>(s.n) * ldy, -5.0f);  // [n, ldy]
        matmul_strided(y.data(), ldy, place(x, off, &xs), ldx, place(w, off, &ws), ldw, nullptr,
                       s.n, s.k, s.m);
        for (int i = 0; i < s.n; ++i) {
          ASSERT_TRUE(same_bits(&y[i * ldy], &emu[static_cast<size_t>(i) * s.m], s.m))
              << "row " << i << " offset " << off;
          for (size_t j = s.m; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], -5.0f) << "row " << i;
        }
      }
    }
  }
  std::vector<float> y(8), x(8), w(8);
  EXPECT_THROW(matmul_strided(y.data(), 2, x.data(), 1, w.data(), 2, nullptr, 1, 2, 2), kvb::Error);
}

// Row i of y depends only on row i of x and on w: same bits alone (n = 1, the decode kernel),
// inside a batch of 37 (the tiled kernel, rows at every position of a tile and edge tiles),
// and with 1, 2 or 3 OpenMP threads.
TEST(Matmul, BatchAndThreadInvariantBits) {
  const int n = 37;
  for (const Shape& s : {Shape{n, 576, 576}, Shape{n, 172, 64}, Shape{n, 1000, 577},
                         Shape{n, 1536, 192}, Shape{n, 13, 37}, Shape{n, 2100, 29}}) {
    SCOPED_TRACE(testing::Message() << "k=" << s.k << " m=" << s.m);
    const std::vector<float> x = random_vec(static_cast<size_t>(n) * s.k, 11);    // [n, k]
    const std::vector<float> w = random_vec(static_cast<size_t>(s.m) * s.k, 12);  // [m, k]
    const std::vector<float> b = random_vec(static_cast<size_t>(s.m), 13);        // [m]
    const int saved_threads = omp_get_max_threads();
    std::vector<std::vector<float>> by_threads;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> batch(static_cast<size_t>(n) * s.m);  // [n, m]
      matmul(batch.data(), x.data(), w.data(), b.data(), n, s.k, s.m);
      for (int i = 0; i < n; ++i) {
        std::vector<float> alone(s.m);  // [1, m]
        matmul(alone.data(), x.data() + static_cast<size_t>(i) * s.k, w.data(), b.data(), 1, s.k,
               s.m);
        ASSERT_TRUE(same_bits(alone.data(), batch.data() + static_cast<size_t>(i) * s.m, s.m))
            << "row " << i << " threads " << threads;
      }
      // Other groupings: rows [start, n) as a batch of their own (shifts tile boundaries).
      for (int start : {1, 2, 3, 5, 30}) {
        std::vector<float> part(static_cast<size_t>(n - start) * s.m);  // [n - start, m]
        matmul(part.data(), x.data() + static_cast<size_t>(start) * s.k, w.data(), b.data(),
               n - start, s.k, s.m);
        ASSERT_TRUE(
            same_bits(part.data(), batch.data() + static_cast<size_t>(start) * s.m, part.size()))
            << "rows from " << start;
      }
      by_threads.push_back(std::move(batch));
    }
    omp_set_num_threads(saved_threads);
    for (size_t t = 1; t < by_threads.size(); ++t) {
      ASSERT_TRUE(same_bits(by_threads[0].data(), by_threads[t].data(), by_threads[0].size()))
          << "threads " << t + 1 << " vs 1";
    }
  }
}

}  // namespace
}  // namespace kvb::kernels::cpu
