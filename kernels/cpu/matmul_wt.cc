// matmul_wt (matmul.h): matmul's contract and bits with the weight given transposed, b = w^T,
// computed as an outer product. A tile of 6 rows of x and 16 columns of b keeps, for one lane l
// at a time, its 12 vectors of lane sums in registers and adds the terms p = l, l + 16, ... with
// a broadcast of x[r][p] times the 16 columns of b's row p; the 16 lane sums of each output then
// meet in reduce_lanes' tree with vertical adds. No horizontal reduction and no transposition:
// attention's Q K^T reads K^T (d rows of the keys' columns) and its P V reads V's own rows.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_tree.h"

#if defined(__AVX2__) && defined(__FMA__)
#define KVB_MATMUL_WT_AVX2 1
#include <immintrin.h>
#endif

namespace kvb::kernels::cpu {
namespace {

using detail::kLanes;
using detail::reduce_lanes;

void check_wt(float* y, size_t ldy, const float* x, size_t ldx, const float* b, size_t ldb, int n,
              int k, int m) {
  KVB_CHECK(n >= 0 && k >= 0 && m >= 0)
      << "matmul_wt: bad shape n=" << n << " k=" << k << " m=" << m;
  KVB_CHECK(n == 0 || m == 0 || (y != nullptr && (k == 0 || (x != nullptr && b != nullptr))))
      << "matmul_wt: null pointer";
  KVB_CHECK(ldx >= static_cast<size_t>(k) && ldb >= static_cast<size_t>(m) &&
            ldy >= static_cast<size_t>(m))
      << "matmul_wt: row strides x " << ldx << " below k=" << k << ", or b " << ldb << " or y "
      << ldy << " below m=" << m;
}

// The definition with scalar fma: lane p % 16 takes x[i][p] * b[p][j] in increasing p.
void wt_portable(float* y, size_t ldy, const float* x, size_t ldx, const float* b, size_t ldb,
                 int n, int k, int m) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<size_t>(i) * ldx;  // [k]
    for (int j = 0; j < m; ++j) {
      float a[kLanes] = {};
      for (int p = 0; p < k; ++p) {
        a[p % kLanes] = std::fma(xi[p], b[static_cast<size_t>(p) * ldb + j], a[p % kLanes]);
      }
      y[static_cast<size_t>(i) * ldy + j] = reduce_lanes(a);
    }
  }
}

#if defined(KVB_MATMUL_WT_AVX2)
constexpr int kTileRows = 6;  // rows of x per tile: 12 accumulators, 2 loads of b, 1 broadcast
constexpr int kSpan = 256;    // k positions per span when k is longer (b's slice stays in L1)

// The lane sums of one tile: lane l, row r, column half h (8 columns each).
struct TileLanes {
  __m256 v[kLanes][kTileRows][2];
};

// One lane's sums of the tile, in registers (__m256 may alias the floats read, so tile_span and
// tile_whole work on such a copy rather than on TileLanes in place).
using LaneSums = __m256[kTileRows][2];

// Position p of a lane: a[r][h] += x[r][p] * the panel's row p (half h), fused.
inline __attribute__((always_inline)) void tile_step(LaneSums& a, const float* const* xr,
                                                     const float* panel, int p) {
  const __m256 b0 = _mm256_load_ps(panel + 16 * static_cast<size_t>(p));
  const __m256 b1 = _mm256_load_ps(panel + 16 * static_cast<size_t>(p) + 8);
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r) {
    const __m256 xv = _mm256_broadcast_ss(xr[r] + p);
    a[r][0] = _mm256_fmadd_ps(xv, b0, a[r][0]);
    a[r][1] = _mm256_fmadd_ps(xv, b1, a[r][1]);
  }
}

inline __attribute__((always_inline)) void lane_store(TileLanes& s, int l, const LaneSums& a) {
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r) {
    s.v[l][r][0] = a[r][0];
    s.v[l][r][1] = a[r][1];
  }
}

// Adds the terms of k positions [p0, p1) (p0 a multiple of 16) to s: for each lane l, the
// positions p = l (mod 16) in increasing order, by fused multiply-adds (kFirst: from +0, s not
// read). xr: the tile's rows of x; panel: [k][16], the tile's 16 columns of b row by row.
template <bool kFirst>
void tile_span(TileLanes& s, const float* const* xr, const float* panel, int p0, int p1) {
#pragma GCC unroll 1
  for (int l = 0; l < kLanes; ++l) {
    LaneSums a;
#pragma GCC unroll 6
    for (int r = 0; r < kTileRows; ++r) {
      a[r][0] = kFirst ? _mm256_setzero_ps() : s.v[l][r][0];
      a[r][1] = kFirst ? _mm256_setzero_ps() : s.v[l][r][1];
    }
#pragma GCC unroll 4
    for (int p = p0 + l; p < p1; p += kLanes) tile_step(a, xr, panel, p);
    lane_store(s, l, a);
  }
}

// tile_span<true> over the whole of k = 16 * kSteps (attention's Q K^T at head_dim 64, 128, 256):
// the same operations with the lane's loop unrolled whole.
template <int kSteps>
void tile_whole(TileLanes& s, const float* const* xr, const float* panel) {
#pragma GCC unroll 1
  for (int l = 0; l < kLanes; ++l) {
    LaneSums a;
#pragma GCC unroll 6
    for (int r = 0; r < kTileRows; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int t = 0; t < kSteps; ++t) tile_step(a, xr, panel, l + kLanes * t);
    lane_store(s, l, a);
  }
}

// reduce_lanes' tree over each output's 16 lane sums, eight columns at a time, for the tile's
// first `rows` rows, times scale; writes the tile's columns [a, e) to y + (column - a) (rows ldy
// apart).
void tile_reduce(const TileLanes& s, float* y, size_t ldy, int rows, int a, int e, float scale) {
  const __m256 sv = _mm256_set1_ps(scale);
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<size_t>(r) * ldy;
    alignas(32) float out[16];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 s8[8], s4[4];
      for (int l = 0; l < 8; ++l) s8[l] = _mm256_add_ps(s.v[l][r][h], s.v[l + 8][r][h]);
      for (int l = 0; l < 4; ++l) s4[l] = _mm256_add_ps(s8[l], s8[l + 4]);
      const __m256 sum = _mm256_mul_ps(
          _mm256_add_ps(_mm256_add_ps(s4[0], s4[2]), _mm256_add_ps(s4[1], s4[3])), sv);
      if (a == 0 && e == 16) {
        _mm256_storeu_ps(yr + 8 * h, sum);
      } else {
        _mm256_store_ps(out + 8 * h, sum);
      }
    }
    if (a != 0 || e != 16) std::copy(out + a, out + e, yr);
  }
}

// Columns [a, e) of one panel (16 columns of b, [k][16]) for every row of x: tiles of 6 rows,
// the last repeating its last row (those sums are dropped). Up to one span of k a tile runs whole;
// longer k runs span by span over all the row tiles, whose lane sums wait in `lanes` between
// spans (each lane still adds its terms in increasing p, so the bits are the one-pass bits).
// y: where column a of the panel goes in row 0; every sum is multiplied by scale as it is stored.
void panel_columns(float* y, size_t ldy, const float* x, size_t ldx, const float* panel, int n,
                   int k, int a, int e, float scale, AlignedScratch* lanes) {
  const int tiles = (n + kTileRows - 1) / kTileRows;
  auto rows_of = [&](int t, const float** xr) {
    for (int r = 0; r < kTileRows; ++r) {
      xr[r] = x + static_cast<size_t>(std::min(t * kTileRows + r, n - 1)) * ldx;
    }
  };
  auto y_of = [&](int t) { return y + static_cast<size_t>(t) * kTileRows * ldy; };
  if (k <= kSpan) {
    alignas(64) TileLanes s;
    for (int t = 0; t < tiles; ++t) {
      const float* xr[kTileRows];
      rows_of(t, xr);
      switch (k) {  // head_dim 64, 128, 256: the lane loops unrolled whole (3% on Q K^T at 64)
        case 64:
          tile_whole<4>(s, xr, panel);
          break;
        case 128:
          tile_whole<8>(s, xr, panel);
          break;
        case 256:
          tile_whole<16>(s, xr, panel);
          break;
        default:
          tile_span<true>(s, xr, panel, 0, k);
      }
      tile_reduce(s, y_of(t), ldy, std::min(kTileRows, n - t * kTileRows), a, e, scale);
    }
    return;
  }
  static_assert(sizeof(TileLanes) % 64 == 0);
  TileLanes* s = reinterpret_cast<TileLanes*>(
      lanes->get(static_cast<size_t>(tiles) * (sizeof(TileLanes) / sizeof(float))));
  for (int p0 = 0; p0 < k; p0 += kSpan) {
    const int p1 = std::min(k, p0 + kSpan);
    for (int t = 0; t < tiles; ++t) {
      const float* xr[kTileRows];
      rows_of(t, xr);
      if (p0 == 0) {
        tile_span<true>(s[t], xr, panel, p0, p1);
      } else {
        tile_span<false>(s[t], xr, panel, p0, p1);
      }
    }
  }
  for (int t = 0; t < tiles; ++t) {
    tile_reduce(s[t], y_of(t), ldy, std::min(kTileRows, n - t * kTileRows), a, e, scale);
  }
}

// Whether a call is worth the threads (and is not inside a parallel region already).
bool wt_parallel(int n, int k, int m) {
  return m > 16 && 2.0 * n * static_cast<double>(k) * m >= 1.0e6 && !omp_in_parallel();
}

void wt_avx2(float* y, size_t ldy, const float* x, size_t ldx, const float* b, size_t ldb, int n,
             int k, int m) {
  const int col_tiles = (m + 15) / 16;
#pragma omp parallel if (wt_parallel(n, k, m))
  {
    thread_local AlignedScratch panel_buf, lanes;
#pragma omp for schedule(static)
    for (int c = 0; c < col_tiles; ++c) {
      // b's 16 columns copied into a panel ([k][16], zeros past m): 64-byte rows, so no
      // cache-set conflicts from b's stride and one aligned load per half.
      const int j0 = 16 * c, cols = std::min(16, m - j0);
      float* panel = panel_buf.get(static_cast<size_t>(k) * 16);
      pack_wt_panels(panel, 0, b + j0, ldb, k, cols);
      panel_columns(y + j0, ldy, x, ldx, panel, n, k, 0, cols, 1.0f, &lanes);
    }
  }
}

void wt_packed_avx2(float* y, size_t ldy, const float* x, size_t ldx, const float* panels,
                    size_t panel_stride, int n, int k, int j0, int m, float scale) {
  const int c0 = j0 / 16, c1 = (j0 + m + 15) / 16;
#pragma omp parallel if (wt_parallel(n, k, m))
  {
    thread_local AlignedScratch lanes;
#pragma omp for schedule(static)
    for (int c = c0; c < c1; ++c) {
      const int a = std::max(j0, 16 * c) - 16 * c, e = std::min(j0 + m, 16 * c + 16) - 16 * c;
      panel_columns(y + (16 * c + a - j0), ldy, x, ldx, panels + c * panel_stride, n, k, a, e,
                    scale, &lanes);
    }
  }
}
#endif  // KVB_MATMUL_WT_AVX2

// matmul_wt_packed's definition: column j0 + j of b read from its panel.
void wt_packed_portable(float* y, size_t ldy, const float* x, size_t ldx, const float* panels,
                        size_t panel_stride, int n, int k, int j0, int m, float scale) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<size_t>(i) * ldx;  // [k]
    for (int j = 0; j < m; ++j) {
      const int c = j0 + j;
      const float* col = panels + (c / 16) * panel_stride + c % 16;  // row p at col[16 p]
      float a[kLanes] = {};
      for (int p = 0; p < k; ++p) {
        a[p % kLanes] = std::fma(xi[p], col[16 * static_cast<size_t>(p)], a[p % kLanes]);
      }
      y[static_cast<size_t>(i) * ldy + j] = reduce_lanes(a) * scale;
    }
  }
}

}  // namespace

void pack_wt_panels(float* panels, size_t panel_stride, const float* b, size_t ldb, int k, int m) {
  for (int c = 0; c * 16 < m; ++c) {
    const int cols = std::min(16, m - 16 * c);
    float* dst = panels + c * panel_stride;
    for (int p = 0; p < k; ++p) {
      const float* src = b + static_cast<size_t>(p) * ldb + 16 * c;
      float* row = dst + 16 * static_cast<size_t>(p);
      if (cols == 16) {
        std::copy(src, src + 16, row);  // a fixed-size copy, inlined
      } else {
        std::copy(src, src + cols, row);
        std::fill(row + cols, row + 16, 0.0f);
      }
    }
  }
}

void matmul_wt_packed(float* y, size_t ldy, const float* x, size_t ldx, const float* panels,
                      size_t panel_stride, int n, int k, int j0, int m, float scale) {
  KVB_CHECK(n >= 0 && k >= 0 && m >= 0 && j0 >= 0)
      << "matmul_wt_packed: bad shape n=" << n << " k=" << k << " j0=" << j0 << " m=" << m;
  KVB_CHECK(n == 0 || m == 0 || (y != nullptr && (k == 0 || (x != nullptr && panels != nullptr))))
      << "matmul_wt_packed: null pointer";
  KVB_CHECK(ldx >= static_cast<size_t>(k) && ldy >= static_cast<size_t>(m) &&
            panel_stride % 16 == 0 && reinterpret_cast<uintptr_t>(panels) % 64 == 0 &&
            (m + j0 <= 16 || panel_stride >= 16 * static_cast<size_t>(k)))
      << "matmul_wt_packed: strides x " << ldx << " (k=" << k << "), y " << ldy << " (m=" << m
      << "), panels " << panel_stride << " (a multiple of 16 floats, 64-byte aligned)";
  if (n == 0 || m == 0) return;
#if defined(KVB_MATMUL_WT_AVX2)
  if (active_isa() >= Isa::kAvx2) {
    count_dispatch(SimdKernel::kMatmulWt, Isa::kAvx2);
    wt_packed_avx2(y, ldy, x, ldx, panels, panel_stride, n, k, j0, m, scale);
    return;
  }
#endif
  count_dispatch(SimdKernel::kMatmulWt, Isa::kPortable);
  wt_packed_portable(y, ldy, x, ldx, panels, panel_stride, n, k, j0, m, scale);
}

void matmul_wt(float* y, size_t ldy, const float* x, size_t ldx, const float* b, size_t ldb, int n,
               int k, int m) {
  check_wt(y, ldy, x, ldx, b, ldb, n, k, m);
  if (n == 0 || m == 0) return;
#if defined(KVB_MATMUL_WT_AVX2)
  if (active_isa() >= Isa::kAvx2) {
    count_dispatch(SimdKernel::kMatmulWt, Isa::kAvx2);
    wt_avx2(y, ldy, x, ldx, b, ldb, n, k, m);
    return;
  }
#endif
  count_dispatch(SimdKernel::kMatmulWt, Isa::kPortable);
  wt_portable(y, ldy, x, ldx, b, ldb, n, k, m);
}

}  // namespace kvb::kernels::cpu
