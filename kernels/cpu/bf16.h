// bf16 <-> f32 on the host, one definition for every user: the CPU's bf16 weights
// (matmul_bf16.h), the device cache's upload/download (kernels/cuda/kv_cache_device.cu) and the
// GPU engine's host copies of bf16 rows (workers/engine/cuda_backend.cc).
#pragma once

#include <cstdint>
#include <cstring>

namespace kvb::kernels::cpu {

// f32 -> bf16, rounding to nearest with ties to even (as CUDA's __float2bfloat16); infinities
// stay infinite, NaN stays NaN (quieted).
inline uint16_t bf16_from_f32(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // NaN
  b += 0x7fffu + ((b >> 16) & 1u);  // ties to even; overflow rounds to infinity
  return static_cast<uint16_t>(b >> 16);
}

// bf16 -> f32, exact.
inline float f32_from_bf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// f rounded to bf16 and widened back, as a bf16 cache stores it; NaN is returned unchanged.
inline float bf16_round(float f) { return f != f ? f : f32_from_bf16(bf16_from_f32(f)); }

}  // namespace kvb::kernels::cpu
