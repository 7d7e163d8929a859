// IEEE 754 binary16 (f16), the element of the CPU KV cache under --dtype native (llama.cpp's
// default cache type): f32 -> f16 rounds to nearest, ties to even, as the F16C instruction
// vcvtps2ph with _MM_FROUND_TO_NEAREST_INT does (overflow to infinity, subnormals kept, a NaN
// stays a quiet NaN with its sign and its payload's top 9 bits); f16 -> f32 is exact. Scalar
// definitions: the bulk conversions of kernels/cpu give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvb::kernels {

uint16_t f32_to_f16(float x);
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {  // infinity / NaN: the payload kept
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal mant x 2^-24: normalised so that the leading one becomes implicit
    uint32_t shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    bits = sign | ((113 - shift) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// y[i] = f32_to_f16(x[i]) / f16_to_f32(x[i]) for i < n.
void f32_to_f16(const float* x, uint16_t* y, size_t n);
void f16_to_f32(const uint16_t* x, float* y, size_t n);

}  // namespace kvb::kernels
