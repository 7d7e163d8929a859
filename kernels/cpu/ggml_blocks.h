// The ggml block layouts (ggml-common.h) that the CPU reads quantized weights in: dequantization
// to f32 (dequant.cc) and the native quantized products (qmatmul.cc). f16 fields are raw bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvb::kernels::cpu::ggml {

constexpr size_t kQK = 32;     // elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL
constexpr size_t kQK_K = 256;  // elements per K-quant super-block
constexpr size_t kScaleBytesK = 12;

// ggml-common.h layouts; f16 fields are kept as raw uint16_t bits.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];  // nibbles: low half = elements 0..15, high half = 16..31
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];        // 5th bit of element j is bit j of this little-endian u32
  uint8_t qs[kQK / 2];  // low 4 bits, nibbles as in Q4_0
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];  // 4-bit indices into kIQ4Values, nibbles as in Q4_0
};
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // per 16 elements: scale in the low nibble, min in the high
  uint8_t qs[kQK_K / 4];       // 2-bit quants, four per byte
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // 3rd bit of each element, SET meaning "no -4 offset"
  uint8_t qs[kQK_K / 4];     // low 2 bits, four per byte
  uint8_t scales[12];        // 16 x 6-bit scales (offset by 32), packed
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kScaleBytesK];  // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kScaleBytesK];
  uint8_t qh[kQK_K / 8];  // 5th bit of each element, bit j for sub-block j
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // one per 16 elements
  uint16_t d;
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;             // high 2 bits of the 8 sub-block scales, 2 bits each
  uint8_t scales_l[kQK_K / 64];  // low 4 bits of the 8 sub-block scales, nibbles
  uint8_t qs[kQK_K / 2];         // per 32 elements 16 bytes of kIQ4Values indices, as IQ4_NL
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// ggml-quants.c get_scale_min_k4: the j-th (scale, min) pair of the 12 packed bytes q.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

}  // namespace kvb::kernels::cpu::ggml
