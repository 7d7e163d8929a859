// f32 matrix multiplication against a weight matrix stored [out, in] (GGUF / llama2.c layout):
// y = x * w^T (+ bias). One fixed summation order per output element (see matmul below), so the
// bits of a row of y depend only on that row of x and on w: not on the batch, the thread count
// or the code path taken (AVX-512, AVX2 or portable; KVB_ISA picks among the build's: isa.h).
#pragma once

#include <cstddef>

namespace kvb::kernels::cpu {

// y[i][j] = sum_p x[i][p] * w[j][p] (+ bias[j] when bias != nullptr), f32 accumulation.
// y: [n, m] row-major; x: [n, k] row-major; w: [m, k] row-major; bias: [m] or nullptr.
// n, m >= 0, k >= 0 (k == 0 gives bias or 0); y must not alias x, w or bias.
//
// Summation order of every dot product (all code paths, every n, every thread count):
//   16 lanes: lane l accumulates, with a fused multiply-add in increasing p, the terms
//   p = l, l + 16, l + 32, ... (< k), starting from +0.0f;
//   then a fixed tree: s8[l] = a[l] + a[l + 8] (l < 8), s4[l] = s8[l] + s8[l + 4],
//   s2[l] = s4[l] + s4[l + 2], dot = s2[0] + s2[1]; then y = dot + bias[j].
// Large calls run on OpenMP threads (over output tiles; over m when n == 1).
void matmul(float* y, const float* x, const float* w, const float* bias, int n, int k, int m);

// matmul over rows wider than their use: row i of x is x[i * ldx, i * ldx + k), row j of w is
// w[j * ldw, j * ldw + k), row i of y is y[i * ldy, i * ldy + m) (ldx, ldw >= k; ldy >= m; the
// rest of y's rows is not written). The same contract and bits as matmul on those entries.
// Operands whose rows start on 64-byte boundaries (an aligned base and a stride of a multiple of
// 16 floats) are read in place; others are copied once per call (x) or per panel (w).
void matmul_strided(float* y, size_t ldy, const float* x, size_t ldx, const float* w, size_t ldw,
                    const float* bias, int n, int k, int m);

// matmul_strided with w given transposed: b[p][j] = w[j][p], row p of b at b + p * ldb (ldb >= m),
// so y[i][j] = sum_p x[i][p] * b[p][j] with matmul's contract and bits (the 16 lanes of k and the
// tree above), every path. Computed as an outer product (matmul_wt.cc: no horizontal sums; b is
// copied 16 columns at a time into an aligned panel), which suits a short k (attention's Q K^T
// at head_dim 64, from K^T: 1.35x matmul's speed) and a b whose rows are the natural layout
// (attention's P V, from V's rows); at long k on the linear layers' shapes matmul's own tiles are
// faster (k = 576: 70 against 57 GFLOP/s). Rows of x: x + i * ldx (ldx >= k); of y: y + i * ldy
// (ldy >= m). Threads over column tiles unless called inside a parallel region.
void matmul_wt(float* y, size_t ldy, const float* x, size_t ldx, const float* b, size_t ldb, int n,
               int k, int m);

// b packed for matmul_wt_packed: panel c holds b's columns [16c, 16c + 16), its row p the 16
// floats at panels + c * panel_stride + 16 p (zeros past b's last column). panels 64-byte
// aligned; panel_stride a multiple of 16 and >= 16 k when there are several panels.
// pack_wt_panels writes them from b ([k] rows of m floats, ldb apart).
void pack_wt_panels(float* panels, size_t panel_stride, const float* b, size_t ldb, int k, int m);

// matmul_wt over a packed b, its columns [j0, j0 + m): y[i][j] = scale * sum_p x[i][p] *
// b[p][j0 + j], matmul's contract and bits for the sum, then one multiply (scale 1 is exact). For
// operands packed once and used by many calls (attention packs K and V once per call and each block
// of queries reads them; a block's keys start at any j0, its P x V at a panel row: panels + 16 *
// lo).
void matmul_wt_packed(float* y, size_t ldy, const float* x, size_t ldx, const float* panels,
                      size_t panel_stride, int n, int k, int j0, int m, float scale = 1.0f);

// The same contract and bit-identical results as matmul, computed one dot product at a time with
// scalar std::fma (no SIMD, no threads). Slow; for tests that pin matmul's bits.
void matmul_portable(float* y, const float* x, const float* w, const float* bias, int n, int k,
                     int m);

// Plain triple loop with double accumulation, rounded to f32 once: the reference for tests.
void matmul_reference(float* y, const float* x, const float* w, const float* bias, int n, int k,
                      int m);

}  // namespace kvb::kernels::cpu
