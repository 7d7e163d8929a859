// Products with quantized weights kept in their ggml blocks (issue 35, the CPU's `--dtype
// native`): the arithmetic family llama.cpp uses. Activations are quantized per 32 elements to
// 8 bits (Q8Act); each 32-element block of a weight row and of an activation row gives an exact
// integer dot product, and the rows' floats accumulate those in a fixed order:
//
//   acc = 0
//   for each 32-element block b of the row, in order:
//     acc = fma(c_b, float(isum_b), acc)              c_b = (weight scale) * act.d
//     acc = fma(mc_b, float(act.sum), acc)            types with a min (Q4_1, Q4_K, Q5_K)
//   y = acc (+ bias)
//
// with, per type (q: the block's unsigned quants; a: the activation's int8 quants; d, m, dmin:
// the block's f16 scales widened; sc, mn: a K-quant sub-block's 6-bit scale and min; s16: Q6_K's
// int8 scale per 16 elements):
//   Q4_0  isum = sum (q - 8) a            c = d * act.d
//   Q4_1  isum = sum q a                  c = d * act.d            mc = m * act.d
//   Q5_0  isum = sum (q - 16) a           c = d * act.d
//   Q8_0  isum = sum q a (q signed)       c = d * act.d
//   Q4_K  isum = sum q a                  c = (d * sc) * act.d     mc = -((dmin * mn) * act.d)
//   Q5_K  isum = sum q a                  c = (d * sc) * act.d     mc = -((dmin * mn) * act.d)
//   Q6_K  isum = s16_lo * sum_lo (q - 32) a + s16_hi * sum_hi (q - 32) a      c = d * act.d
// Every isum is an exact integer below 2^24 (so its float is exact), d * sc is exact in f32
// (11 + 6 significant bits), and each fma rounds once: every path (AVX-512, AVX2, portable)
// gives the same bits, for every n, m and thread count. The integers may be summed in any order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"

namespace kvb::kernels::cpu {

// 32 activations quantized to 8 bits: d = max|x| / 127, q = x / d rounded to nearest (ties to
// even), sum = sum of q. All-zero blocks have d = 0 and q = 0.
struct Q8Act {
  float d;
  int32_t sum;
  int8_t q[32];
};
static_assert(sizeof(Q8Act) == 40);

// The ggml types qmatmul multiplies: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K.
bool qmatmul_supports(uint32_t ggml_type);
// Their names, for error messages ("Q4_0, Q4_1, ...").
const char* qmatmul_type_names();

enum class QPath { kAuto, kAvx512, kAvx2, kPortable };
// Whether this build and CPU run `path` (and a forced KVB_ISA allows it); kAuto and kPortable
// always.
bool qpath_supported(QPath path);
const char* qpath_name(QPath path);
// The kernels `path` runs: kAvx512 (AVX-512 VNNI's vpdpbusd on 256-bit registers) where the
// build has AVX-512 VNNI and VL, else kAvx2 (maddubs + madd) for any SIMD path, else kPortable.
// All give the same bits. Error for a path that is not supported.
Isa qpath_kernels(QPath path);

// x: [n, k] -> xq: [n, k / 32] (k a multiple of 32). The same bits on every path.
void quantize_q8_act(const float* x, int n, int k, Q8Act* xq, QPath path = QPath::kAuto);

// y[i][j] = the contract above over row i of xq and row j of w (+ bias[j]).
// w: m rows of k elements in ggml blocks of `ggml_type` (k a multiple of the type's block size),
// row j starting at byte j * (k / block_elems * block_bytes); bias: [m] or nullptr; y: [n, m].
// Rows of w are split over OpenMP threads. An unsupported type or k is an error.
void qmatmul(float* y, const Q8Act* xq, const void* w, uint32_t ggml_type, const float* bias,
             int n, int k, int m, QPath path = QPath::kAuto);

// The bytes one row of k elements of `ggml_type` takes (k a multiple of its block size).
size_t qrow_bytes(uint32_t ggml_type, int k);

}  // namespace kvb::kernels::cpu
