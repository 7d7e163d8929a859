// f32 y = x * w^T (+ bias) with one fixed summation order per dot product (matmul.h): a 16-lane
// split of k with fused multiply-adds, then a fixed reduction tree. Register tiles of R rows of x
// times C rows of w (AVX-512: 4x4, one zmm accumulator per output; AVX2: 2x3, two ymm per output;
// portable: 1x1 emulating the lanes with std::fma), cache blocks of x rows and w panels, OpenMP.
// Every path the build targets is compiled; the active one (isa.h, KVB_ISA) is chosen per call.
#include "kernels/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

// The SIMD paths this build can hold (isa.cc's conditions); which one runs is active_isa()'s.
#if defined(__AVX512F__)
#define KVB_MATMUL_AVX512 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define KVB_MATMUL_AVX2 1
#endif
#if defined(KVB_MATMUL_AVX512) || defined(KVB_MATMUL_AVX2)
#include <immintrin.h>
#endif

#include "common/error.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul_tree.h"

namespace kvb::kernels::cpu {
namespace {

using detail::kLanes;        // the lane split of k (matmul_tree.h)
using detail::reduce_lanes;  // the fixed tree over the 16 lane sums

// One dot product in the contract's order with scalar fma; x, w: [k].
float dot_portable(const float* x, const float* w, int k) {
  float a[kLanes] = {};
  int p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    for (int l = 0; l < kLanes; ++l) a[l] = std::fma(x[p + l], w[p + l], a[l]);
  }
  for (int l = 0; p + l < k; ++l) a[l] = std::fma(x[p + l], w[p + l], a[l]);
  return reduce_lanes(a);
}

// 1x1 tile for the portable path: out[0] = dot(x row, w row).
struct TilePortable {
  static constexpr int kRows = 1, kCols = 1;
  void operator()(const float* const* xr, const float* const* wr, int k, float* out) const {
    out[0] = dot_portable(xr[0], wr[0], k);
  }
};

#if defined(KVB_MATMUL_AVX512)
// GCC 12 warns that _mm512_undefined_ps (inside _mm512_shuffle_f32x4 and _mm512_permutexvar_ps)
// is uninitialized once inlined: a false positive (GCC PR 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

using detail::reduce16;  // the tree over 16 lane vectors, 16 outputs side by side

// R rows of x times C rows of w with one zmm of lane sums per output (R * C == 16).
// xr: R pointers to [k]; wr: C pointers to [k]; out: [R, C] row-major.
template <int R, int C>
struct TileAvx512 {
  static_assert(R * C == 16, "reduce16 takes 16 accumulators");
  static constexpr int kRows = R, kCols = C;
  void operator()(const float* const* xr, const float* const* wr, int k, float* out) const {
    __m512 acc[16];  // acc[r + R * c]: lane sums of output (r, c)
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
    int p = 0;
#pragma GCC unroll 2  // +25% on the 4x4 tile (Zen 5)
    for (; p + kLanes <= k; p += kLanes) {
      if constexpr (R == 1) {
        // Decode: each w vector is used once; w streams from memory, so fetch the same columns
        // of the next tile's rows (consecutive rows, stride k: w is never packed when R == 1).
        const __m512 xv = _mm512_loadu_ps(xr[0] + p);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
          _mm_prefetch(reinterpret_cast<const char*>(wr[c] + p + static_cast<size_t>(C) * k),
                       _MM_HINT_T0);
          acc[c] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(wr[c] + p), acc[c]);
        }
      } else {
        __m512 wv[C];
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
          wv[c] = _mm512_loadu_ps(wr[c] + p);
          asm("" : "+v"(wv[c]));  // keep wv in a register: GCC would fold it into R operands
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_loadu_ps(xr[r] + p);
#pragma GCC unroll 16
          for (int c = 0; c < C; ++c) acc[r + R * c] = _mm512_fmadd_ps(xv, wv[c], acc[r + R * c]);
        }
      }
    }
    if (p < k) {  // lanes past k keep their sums (not +0*0: that would turn -0 into +0)
      const __mmask16 mask = static_cast<__mmask16>((1u << (k - p)) - 1u);
      __m512 wv[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_ps(mask, wr[c] + p);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 xv = _mm512_maskz_loadu_ps(mask, xr[r] + p);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
          acc[r + R * c] = _mm512_mask3_fmadd_ps(xv, wv[c], acc[r + R * c], mask);
        }
      }
    }
    const __m512 s = reduce16(acc);  // position 4 * L + q holds acc[L + 4 * q]
    if constexpr (R == 4) {
      _mm512_storeu_ps(out, s);  // acc[r + 4c] at 4r + c: already [R, C] row-major
    } else {
      static_assert(R == 1, "only 4x4 and 1x16 tiles");
      // out[j] = acc[j] = position 4 * (j % 4) + j / 4
      const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
      _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, s));
    }
  }
};
#pragma GCC diagnostic pop
#endif  // KVB_MATMUL_AVX512

#if defined(KVB_MATMUL_AVX2)
// The 16 lanes as two ymm: lo = lanes 0..7, hi = lanes 8..15; reduced with the same tree.
inline float reduce_pair(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // [s4[0]+s4[2], s4[1]+s4[3], ..]
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// R rows of x times C rows of w, two ymm of lane sums per output; out: [R, C] row-major.
template <int R, int C>
struct TileAvx2 {
  static constexpr int kRows = R, kCols = C;
  void operator()(const float* const* xr, const float* const* wr, int k, float* out) const {
    __m256 acc[2][R * C];  // acc[half][r * C + c]
#pragma GCC unroll 16
    for (int t = 0; t < R * C; ++t) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    int p = 0;
#pragma GCC unroll 2
    for (; p + kLanes <= k; p += kLanes) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256 wv[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(wr[c] + p + 8 * h);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_loadu_ps(xr[r] + p + 8 * h);
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c)
            acc[h][r * C + c] = _mm256_fmadd_ps(xv, wv[c], acc[h][r * C + c]);
        }
      }
    }
    if (p < k) {
      const int rem = k - p;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int cnt = std::clamp(rem - 8 * h, 0, 8);
        const __m256i mi =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 mf = _mm256_castsi256_ps(mi);
        __m256 wv[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) wv[c] = _mm256_maskload_ps(wr[c] + p + 8 * h, mi);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_maskload_ps(xr[r] + p + 8 * h, mi);
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c) {
            __m256& a = acc[h][r * C + c];
            a = _mm256_blendv_ps(a, _mm256_fmadd_ps(xv, wv[c], a), mf);
          }
        }
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < R * C; ++t) out[t] = reduce_pair(acc[0][t], acc[1][t]);
  }
};
#endif  // KVB_MATMUL_AVX2

using PackBuffer = AlignedScratch;  // aligned_scratch.h

// Rows [r0, r1) of a [*, k] matrix src, either in place or copied into buf with a 64-byte aligned
// row stride, so that the kernels' 64-byte loads do not straddle cache lines (a misaligned
// operand halves the tile throughput). Copying does not change any value, hence no bits.
struct RowBlock {
  const float* base;  // [r1 - r0, stride]: row r0 of the block
  size_t stride;      // floats between rows
};
// src: rows of k floats, `ld` floats apart.
RowBlock pack_rows(const float* src, size_t ld, int k, int r0, int r1, bool pack, PackBuffer* buf) {
  if (!pack) return {src + static_cast<size_t>(r0) * ld, ld};
  const size_t stride = (static_cast<size_t>(k) + kLanes - 1) / kLanes * kLanes;
  float* dst = buf->get(stride * (r1 - r0));  // [r1 - r0, stride]
  for (int r = r0; r < r1; ++r) {
    std::memcpy(dst + (r - r0) * stride, src + static_cast<size_t>(r) * ld, k * sizeof(float));
  }
  return {dst, stride};
}

// Rows that start on 64-byte boundaries: the base aligned and the row stride a whole number of
// 16-float vectors.
bool aligned64(const float* p, size_t ld) {
  return reinterpret_cast<uintptr_t>(p) % 64 == 0 && ld % kLanes == 0;
}

// Runs Tile over all outputs. Work units are (x row block, w panel) pairs: inside one, each R-row
// tile of x (L1) meets every C-row tile of the panel (L2). Edge tiles repeat the last valid row
// of x / w and drop those outputs; every output is computed by the same Tile in the same order.
// No k-blocking: a tile keeps its lane sums in registers over the whole of k (splitting k would
// spill 16 zmm per tile); for the model sizes (k <= 1536) a 4-row tile of x is <= 24 KiB (L1).
// x: [n] rows of k floats, ldx apart; w: [m] rows of k, ldw apart; y: [n] rows of m, ldy apart.
template <typename Tile>
void matmul_tiled(float* y, size_t ldy, const float* x, size_t ldx, const float* w, size_t ldw,
                  const float* bias, int n, int k, int m, Tile tile) {
  constexpr int R = Tile::kRows, C = Tile::kCols;
  const int block_rows = R * std::max(1, 64 / R);
  // n <= R: one row block, so split m finely for the threads (decode: parallel over m).
  const int panel_cols = n <= R ? C * std::max(1, 16 / C) : C * std::max(1, 64 / C);
  const int64_t nbi = (n + block_rows - 1) / block_rows;
  const int64_t nbj = (m + panel_cols - 1) / panel_cols;
  const int64_t units = nbi * nbj;
  // Pack misaligned operands of multi-row tiles; w only when a panel meets enough rows of x to
  // pay for the copy (decode-sized calls stream w once and stay unpacked). x is packed once for
  // the call (every unit reads its rows from that copy) and a w panel once per thread: a
  // thread's units are consecutive and run over the x row blocks of a panel first, so it keeps
  // its last panel for the next unit of the same call (before: both were copied again for
  // every unit, e.g. each weight 32 times in a 2,048-token prefill).
  const bool pack_x = R > 1 && !aligned64(x, ldx);
  const bool pack_w = R > 1 && n >= 16 && !aligned64(w, ldw);
  const double flops = 2.0 * n * static_cast<double>(k) * m;
  const bool parallel = units > 1 && flops >= 1.0e5 && !omp_in_parallel();
  thread_local PackBuffer x_buf;  // the calling thread's; the team reads it
  const RowBlock xs = pack_rows(x, ldx, k, 0, n, pack_x, &x_buf);
  // A call id for the threads' kept w panels, drawn only when w is packed (decode-sized calls,
  // made concurrently by attention's threads, touch no shared counter).
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = pack_w ? ++calls : 0;
#pragma omp parallel if (parallel)
  {
    thread_local PackBuffer w_buf;
    thread_local uint64_t w_call = 0;  // the call and panel w_buf holds
    thread_local int w_panel = -1;
    thread_local RowBlock w_kept{nullptr, 0};
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int i_begin = static_cast<int>(u % nbi) * block_rows;
      const int j_begin = static_cast<int>(u / nbi) * panel_cols;
      const int i_end = std::min(n, i_begin + block_rows);
      const int j_end = std::min(m, j_begin + panel_cols);
      const RowBlock xb{xs.base + static_cast<size_t>(i_begin) * xs.stride, xs.stride};
      RowBlock wb{w + static_cast<size_t>(j_begin) * ldw, ldw};
      if (pack_w) {
        if (w_call != call || w_panel != j_begin) {
          w_kept = pack_rows(w, ldw, k, j_begin, j_end, true, &w_buf);
          w_call = call;
          w_panel = j_begin;
        }
        wb = w_kept;
      }
      for (int i0 = i_begin; i0 < i_end; i0 += R) {
        const float* xr[R];  // R pointers to rows of x: [k]
        for (int r = 0; r < R; ++r)
          xr[r] = xb.base + (std::min(i0 + r, i_end - 1) - i_begin) * xb.stride;
        const int rows = std::min(R, n - i0);
        for (int j0 = j_begin; j0 < j_end; j0 += C) {
          const float* wr[C];  // C pointers to rows of w: [k]
          for (int c = 0; c < C; ++c)
            wr[c] = wb.base + (std::min(j0 + c, j_end - 1) - j_begin) * wb.stride;
          float out[R * C];  // [R, C] row-major
          tile(xr, wr, k, out);
          const int cols = std::min(C, m - j0);
          for (int r = 0; r < rows; ++r) {
            float* yr = y + static_cast<size_t>(i0 + r) * ldy + j0;  // [cols]
            if (bias != nullptr) {
              for (int c = 0; c < cols; ++c) yr[c] = out[r * C + c] + bias[j0 + c];
            } else if (cols == C) {
              // A whole tile row: a fixed-size copy the compiler inlines (the variable-length
              // loop below became a memcpy call per row of every tile).
              std::memcpy(yr, &out[r * C], C * sizeof(float));
            } else {
              for (int c = 0; c < cols; ++c) yr[c] = out[r * C + c];
            }
          }
        }
      }
    }
  }
}

void check_args(float* y, const float* x, const float* w, int n, int k, int m) {
  KVB_CHECK(n >= 0 && k >= 0 && m >= 0) << "matmul: bad shape n=" << n << " k=" << k << " m=" << m;
  KVB_CHECK(n == 0 || m == 0 || (y != nullptr && (k == 0 || (x != nullptr && w != nullptr))))
      << "matmul: null pointer";
}

}  // namespace

void matmul_strided(float* y, size_t ldy, const float* x, size_t ldx, const float* w, size_t ldw,
                    const float* bias, int n, int k, int m) {
  check_args(y, x, w, n, k, m);
  KVB_CHECK(ldx >= static_cast<size_t>(k) && ldw >= static_cast<size_t>(k) &&
            ldy >= static_cast<size_t>(m))
      << "matmul_strided: row strides x " << ldx << ", w " << ldw << " below k=" << k << " or y "
      << ldy << " below m=" << m;
  if (n == 0 || m == 0) return;
  const Isa isa = active_isa();
#if defined(KVB_MATMUL_AVX512)
  if (isa == Isa::kAvx512) {
    count_dispatch(SimdKernel::kMatmul, Isa::kAvx512);
    if (n == 1) {
      matmul_tiled(y, ldy, x, ldx, w, ldw, bias, n, k, m, TileAvx512<1, 16>{});
    } else {
      matmul_tiled(y, ldy, x, ldx, w, ldw, bias, n, k, m, TileAvx512<4, 4>{});
    }
    return;
  }
#endif
#if defined(KVB_MATMUL_AVX2)
  if (isa >= Isa::kAvx2) {
    count_dispatch(SimdKernel::kMatmul, Isa::kAvx2);
    if (n == 1) {
      matmul_tiled(y, ldy, x, ldx, w, ldw, bias, n, k, m, TileAvx2<1, 4>{});
    } else {
      matmul_tiled(y, ldy, x, ldx, w, ldw, bias, n, k, m, TileAvx2<2, 3>{});
    }
    return;
  }
#endif
  count_dispatch(SimdKernel::kMatmul, Isa::kPortable);
  matmul_tiled(y, ldy, x, ldx, w, ldw, bias, n, k, m, TilePortable{});
}

void matmul(float* y, const float* x, const float* w, const float* bias, int n, int k, int m) {
  matmul_strided(y, static_cast<size_t>(m), x, static_cast<size_t>(k), w, static_cast<size_t>(k),
                 bias, n, k, m);
}

void matmul_portable(float* y, const float* x, const float* w, const float* bias, int n, int k,
                     int m) {
  check_args(y, x, w, n, k, m);
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<size_t>(i) * k;  // [k]
    float* yi = y + static_cast<size_t>(i) * m;        // [m]
    for (int j = 0; j < m; ++j) {
      const float d = dot_portable(xi, w + static_cast<size_t>(j) * k, k);
      yi[j] = bias != nullptr ? d + bias[j] : d;
    }
  }
}

void matmul_reference(float* y, const float* x, const float* w, const float* bias, int n, int k,
                      int m) {
  check_args(y, x, w, n, k, m);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < m; ++j) {
      double acc = bias != nullptr ? static_cast<double>(bias[j]) : 0.0;
      for (int p = 0; p < k; ++p) {
        acc += static_cast<double>(x[static_cast<size_t>(i) * k + p]) *
               static_cast<double>(w[static_cast<size_t>(j) * k + p]);
      }
      y[static_cast<size_t>(i) * m + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace kvb::kernels::cpu
