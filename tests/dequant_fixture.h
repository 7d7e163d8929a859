// Test helpers for ggml block data: the golden files of scripts/make_dequant_fixture.py (raw blocks
// and gguf-py 0.10.0's dequantization of them), and where each block type keeps its f16 scales
// (ggml-common.h block structs), so that tests filling blocks with random bytes keep them finite.
// Header-only; test code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvb::testing {

// tests/fixtures/dequant/<TYPE>.bin, little-endian: u32 ggml type id, u32 n (elements),
// u32 raw_bytes, raw_bytes bytes of blocks, n f32 as gguf.quants.dequantize returned them.
struct DequantFixture {
  std::string path;
  uint32_t type = 0;
  std::vector<uint8_t> raw;
  std::vector<float> want;  // [n]
};

// Throws std::runtime_error naming the path if the file is absent or truncated.
inline DequantFixture read_dequant_fixture(const std::string& fixtures_dir,
                                           const std::string& type_name) {
  DequantFixture fx;
  fx.path = fixtures_dir + "/dequant/" + type_name + ".bin";
  std::ifstream in(fx.path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("missing fixture " + fx.path +
                             " (regenerate: see scripts/make_dequant_fixture.py)");
  }
  uint32_t head[3];
  in.read(reinterpret_cast<char*>(head), sizeof(head));
  fx.type = head[0];
  fx.raw.resize(head[2]);
  fx.want.resize(head[1]);
  in.read(reinterpret_cast<char*>(fx.raw.data()), static_cast<std::streamsize>(fx.raw.size()));
  in.read(reinterpret_cast<char*>(fx.want.data()),
          static_cast<std::streamsize>(fx.want.size() * sizeof(float)));
  if (!in) throw std::runtime_error(fx.path + " is truncated");
  return fx;
}

// Byte offsets of the f16 fields (d, and m / dmin) inside one block of a quantized ggml type;
// empty for the scalar types (F32, F16, BF16) and for types without a block layout here.
inline std::vector<size_t> f16_scale_offsets(uint32_t type) {
  switch (type) {
    case 2:   // Q4_0 {d, qs[16]}
    case 6:   // Q5_0 {d, qh[4], qs[16]}
    case 8:   // Q8_0 {d, qs[32]}
    case 20:  // IQ4_NL {d, qs[16]}
    case 23:  // IQ4_XS {d, scales_h, scales_l[4], qs[128]}
      return {0};
    case 3:   // Q4_1 {d, m, qs[16]}
    case 7:   // Q5_1 {d, m, qh[4], qs[16]}
    case 12:  // Q4_K {d, dmin, scales[12], qs[128]}
    case 13:  // Q5_K {d, dmin, scales[12], qh[32], qs[128]}
      return {0, 2};
    case 10:  // Q2_K {scales[16], qs[64], d, dmin}
      return {80, 82};
    case 11:  // Q3_K {hmask[32], qs[64], scales[12], d}
      return {108};
    case 14:  // Q6_K {ql[128], qh[64], scales[16], d}
      return {208};
    default:
      return {};
  }
}

// Makes every f16 scale of the blocks in [raw, raw + bytes) finite by clearing exponent bits of
// its high byte (exponent 31 would be inf/NaN, which tests nothing about the decoding).
inline void make_scales_finite(uint32_t type, uint8_t* raw, size_t bytes, size_t block_bytes) {
  for (size_t b = 0; b + block_bytes <= bytes; b += block_bytes) {
    for (size_t off : f16_scale_offsets(type)) raw[b + off + 1] &= 0x3B;
  }
}

}  // namespace kvb::testing
