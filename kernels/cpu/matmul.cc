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
  static constexpr int kRows = 1, kCols = 1, kOut = 1;
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
  static constexpr int kRows = R, kCols = C, kOut = 16;
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
// R rows of x times C rows of w, two ymm of lane sums per output; out: [R, C] row-major.
// The lane sums can also be carried across calls (Acc, run over consecutive spans of k): each
// lane still takes its products in increasing p, so the bits are those of one pass (k-blocking
// in matmul_tiled).
template <int R, int C>
struct TileAvx2 {
  static constexpr int kRows = R, kCols = C, kOut = 8;  // writes 8 values, R * C of them the tile's
  struct Acc {
    __m256 v[2][R * C];  // v[half][r * C + c]
  };
  static void zero(Acc& a) {
#pragma GCC unroll 16
    for (int t = 0; t < R * C; ++t) a.v[0][t] = a.v[1][t] = _mm256_setzero_ps();
  }
  // Adds the products of k positions [p0, p1) to a: p0 a multiple of kLanes, and p1 one too
  // unless it is k (the masked tail).
  static void run(Acc& acc_io, const float* const* xr, const float* const* wr, int p0, int p1) {
    Acc a = acc_io;  // in registers: __m256 may alias the floats read, so work on a copy
    steps(a, xr, wr, p0, p1);
    acc_io = a;
  }
  // run's and operator()'s loop, on sums the caller keeps in registers (inlined into both).
  static inline __attribute__((always_inline)) void steps(Acc& a, const float* const* xr,
                                                          const float* const* wr, int p0, int p1) {
    int p = p0;
#pragma GCC unroll 2
    for (; p + kLanes <= p1; p += kLanes) {
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
            a.v[h][r * C + c] = _mm256_fmadd_ps(xv, wv[c], a.v[h][r * C + c]);
        }
      }
    }
    if (p < p1) {
      const int rem = p1 - p;
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
            __m256& acc = a.v[h][r * C + c];
            acc = _mm256_blendv_ps(acc, _mm256_fmadd_ps(xv, wv[c], acc), mf);
          }
        }
      }
    }
  }
  // The R * C dots reduce side by side (reduce8: reduce_lanes' pairings, so each dot's bits
  // are reduce_lanes'); short tiles repeat their last dots, whose duplicate work the compiler
  // drops. out gets eight values, the tile's R * C first.
  static void reduce(const Acc& a, float* out) {
    static_assert(R * C <= 8, "reduce8 takes eight dots");
    __m256 s8[8];
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      const int u = t < R * C ? t : R * C - 1 - (7 - t) % (R * C);
      s8[t] = _mm256_add_ps(a.v[0][u], a.v[1][u]);
    }
    _mm256_storeu_ps(out, detail::reduce8(s8));
  }
  void operator()(const float* const* xr, const float* const* wr, int k, float* out) const {
    Acc a;
    zero(a);
    steps(a, xr, wr, 0, k);
    reduce(a, out);
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
// Up to k = 2 kKBlock a tile keeps its lane sums in registers over the whole of k; for the model
// sizes (k <= 1536) a 4-row tile of x is <= 24 KiB (L1). Longer k (attention's P x V over
// thousands of slots: a 2x3 AVX2 tile's five rows of 16 KiB and more are read from L2 at every
// step, which bounds it below half the core's multiply-add rate) is cut into spans of kKBlock
// where a tile can carry its lane sums (Tile::Acc: the AVX2 tile): per span, each C-row tile of
// the panel (in L1) meets every R-row tile of the x block (streamed from L2), and the lane sums
// wait in a per-thread buffer between spans. Each lane still adds its products in increasing
// k, so the bits are the unblocked ones.
// x: [n] rows of k floats, ldx apart; w: [m] rows of k, ldw apart; y: [n] rows of m, ldy apart.
constexpr int kKBlock = 512;

// GCC 12 warns that `out` may be read uninitialized once TilePortable and `store` are inlined
// together (the tile writes out[0], the only entry read): a false positive.
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <typename Tile>
void matmul_tiled(float* y, size_t ldy, const float* x, size_t ldx, const float* w, size_t ldw,
                  const float* bias, int n, int k, int m, Tile tile) {
  constexpr int R = Tile::kRows, C = Tile::kCols;
  constexpr bool kCarries = requires { typename Tile::Acc; };
  const bool k_blocked = kCarries && R > 1 && k >= 2 * kKBlock;
  const int block_rows = R * std::max(1, 64 / R);
  // n <= R: one row block, so split m finely for the threads (decode: parallel over m). Under
  // k-blocking, panels of 8 tiles keep the lane-sum buffer near 100 KiB (32 x 8 tiles).
  const int panel_cols = n <= R      ? C * std::max(1, 16 / C)
                         : k_blocked ? C * 8
                                     : C * std::max(1, 64 / C);
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
      // R pointers to rows of x ([k]) for the tile at row i0; C to rows of w for column j0.
      auto x_rows = [&](int i0, const float** xr) {
        for (int r = 0; r < R; ++r)
          xr[r] = xb.base + (std::min(i0 + r, i_end - 1) - i_begin) * xb.stride;
      };
      auto w_rows = [&](int j0, const float** wr) {
        for (int c = 0; c < C; ++c)
          wr[c] = wb.base + (std::min(j0 + c, j_end - 1) - j_begin) * wb.stride;
      };
      // out: the tile's [R, C] row-major at (i0, j0), into y.
      auto store = [&](int i0, int j0, const float* out) {
        const int rows = std::min(R, n - i0), cols = std::min(C, m - j0);
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
      };
      if constexpr (kCarries) {
        if (k_blocked) {
          using Acc = typename Tile::Acc;
          const int ti = (i_end - i_begin + R - 1) / R, tj = (j_end - j_begin + C - 1) / C;
          thread_local PackBuffer acc_buf;  // [tj][ti] lane sums
          static_assert(alignof(Acc) <= 64 && sizeof(Acc) % sizeof(float) == 0);
          Acc* acc = reinterpret_cast<Acc*>(
              acc_buf.get(static_cast<size_t>(ti) * tj * (sizeof(Acc) / sizeof(float))));
          for (int t = 0; t < ti * tj; ++t) Tile::zero(acc[t]);
          for (int p0 = 0; p0 < k; p0 += kKBlock) {
            const int p1 = std::min(k, p0 + kKBlock);
            for (int b = 0; b < tj; ++b) {
              const float* wr[C];
              w_rows(j_begin + b * C, wr);
              for (int a = 0; a < ti; ++a) {
                const float* xr[R];
                x_rows(i_begin + a * R, xr);
                Tile::run(acc[b * ti + a], xr, wr, p0, p1);
              }
            }
          }
          for (int b = 0; b < tj; ++b) {
            for (int a = 0; a < ti; ++a) {
              float out[Tile::kOut];
              Tile::reduce(acc[b * ti + a], out);
              store(i_begin + a * R, j_begin + b * C, out);
            }
          }
          continue;
        }
      }
      for (int i0 = i_begin; i0 < i_end; i0 += R) {
        const float* xr[R];
        x_rows(i0, xr);
        for (int j0 = j_begin; j0 < j_end; j0 += C) {
          const float* wr[C];
          w_rows(j0, wr);
          float out[Tile::kOut];  // [R, C] row-major, then what the tile writes beyond
          tile(xr, wr, k, out);
          store(i0, j0, out);
        }
      }
    }
  }
}

#pragma GCC diagnostic pop

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
