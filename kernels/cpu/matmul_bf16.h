// Matrix multiplication against bf16 weights (the CPU's opt-in `--dtype bf16`): the weights are
// stored as the upper 16 bits of an f32, widened exactly (a 16-bit shift) and multiplied in f32
// in matmul's summation order (matmul.h). So matmul_bf16(x, w16) is bit-identical to
// matmul(x, widen(w16)): the bf16 path differs from the f32 reference only by the rounding of the
// weights, never by the arithmetic. The SIMD path is chosen at run time from the CPU's features
// (AVX-512, AVX2 + FMA, or portable), none wider than a path KVB_ISA forces (isa.h); all give
// the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/bf16.h"  // bf16_from_f32, f32_from_bf16

namespace kvb::kernels::cpu {

// dst[i] = bf16_from_f32(src[i]) for i < count.
void round_to_bf16(const float* src, size_t count, uint16_t* dst);

enum class Bf16Path { kAuto, kAvx512, kAvx2, kPortable };
// Whether this CPU (and this compiler) runs `path`, and a forced KVB_ISA allows it (no path wider
// than the forced one); kAuto and kPortable always.
bool bf16_path_supported(Bf16Path path);
// The path kAuto takes here; its name ("avx512", "avx2", "portable").
Bf16Path bf16_auto_path();
const char* bf16_path_name(Bf16Path path);

// y[i][j] = sum_p x[i][p] * f32_from_bf16(w[j][p]) (+ bias[j]), bit-identical to
// matmul(y, x, widened w, bias, n, k, m) on every path, for every n and thread count.
// y: [n, m]; x: [n, k]; w: [m, k] bf16 row-major; bias: [m] or nullptr; y must not alias x, bias.
// n == 1 (decode) streams w once through a register tile; n > 1 widens panels of w into a
// thread's f32 scratch and runs matmul on them. `path` other than kAuto is for tests and benches
// (an unsupported one is an error).
void matmul_bf16(float* y, const float* x, const uint16_t* w, const float* bias, int n, int k,
                 int m, Bf16Path path = Bf16Path::kAuto);

}  // namespace kvb::kernels::cpu
