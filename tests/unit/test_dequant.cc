// Tests of kernels/cpu/dequant: hand-built blocks of every supported type whose values follow
// from the block layouts of ggml-common.h (expected values written out or derived here from the
// layout, not from the kernel), and golden files from gguf-py 0.10.0's numpy reference
// (scripts/make_dequant_fixture.py) compared bit for bit, for every supported type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "dequant_fixture.h"
#include "kernels/cpu/dequant.h"

namespace kvb::kernels::cpu {
namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
                   kQ8_1 = 9, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
                   kIQ2_XXS = 16, kIQ4_NL = 20, kIQ4_XS = 23, kBF16 = 30;

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Appends the two little-endian bytes of an f16 bit pattern.
void put_f16(std::vector<uint8_t>& out, uint16_t h) {
  out.push_back(h & 0xFF);
  out.push_back(h >> 8);
}
constexpr uint16_t kHalfOne = 0x3C00, kHalfHalf = 0x3800, kHalfQuarter = 0x3400,
                   kHalfMinusOne = 0xBC00;

std::vector<float> run(uint32_t type, const std::vector<uint8_t>& raw, size_t n) {
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  dequantize(type, raw.data(), out.data(), n);
  return out;
}

void expect_bits_eq(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
        << what << " element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

TEST(Dequant, Fp16ScalarsIncludingSubnormalsInfAndNan) {
  EXPECT_EQ(fp16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.0f);                  // largest finite
  EXPECT_EQ(fp16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(fp16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_f32(0x8200), -std::ldexp(512.0f, -24));  // negative subnormal
  EXPECT_EQ(bits_of(fp16_to_f32(0x8000)), 0x80000000u);      // -0
  EXPECT_EQ(fp16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_of(fp16_to_f32(0x7E01)), 0x7FC02000u);  // quiet NaN, payload shifted by 13
}

TEST(Dequant, Bf16Scalars) {
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));  // subnormal
  EXPECT_EQ(bf16_to_f32(0xFF80), -std::numeric_limits<float>::infinity());
}

TEST(Dequant, F32F16Bf16Arrays) {
  const std::vector<float> f = {1.5f, -2.25f, 0.0f, 3e-42f, 1e30f};
  std::vector<uint8_t> raw(f.size() * 4);
  std::memcpy(raw.data(), f.data(), raw.size());
  expect_bits_eq(run(kF32, raw, f.size()), f, "F32");

  // 67 halves: one 64-element chunk plus a 3-element tail.
  std::vector<uint8_t> h;
  std::vector<float> want;
  for (int k = 0; k < 67; ++k) {
    put_f16(h, static_cast<uint16_t>(0x3C00 + k));  // 1 + k/1024
    want.push_back(1.0f + k / 1024.0f);
  }
  expect_bits_eq(run(kF16, h, 67), want, "F16");

  const std::vector<uint8_t> b = {0x80, 0x3F, 0x40, 0xC0, 0x49, 0x40};  // 1.0, -3.0, 3.140625
  expect_bits_eq(run(kBF16, b, 3), {1.0f, -3.0f, 3.140625f}, "BF16");
}

TEST(Dequant, Q4_0) {
  // d = 0.5; qs[j] = j | (15 - j) << 4: element j = (j - 8) * d, element 16 + j = (7 - j) * d.
  std::vector<uint8_t> raw;
  put_f16(raw, kHalfHalf);
  for (int j = 0; j < 16; ++j) raw.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  const std::vector<float> want = {-4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0,  0.5, 1.0,
                                   1.5,  2.0,  2.5,  3.0,  3.5,  3.5,  3.0,  2.5,  2.0,  1.5, 1.0,
                                   0.5,  0.0,  -0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0};
  expect_bits_eq(run(kQ4_0, raw, 32), want, "Q4_0");
}

TEST(Dequant, Q4_1) {
  // d = 0.25, m = -1; same nibbles: element j = j * d + m, element 16 + j = (15 - j) * d + m.
  std::vector<uint8_t> raw;
  put_f16(raw, kHalfQuarter);
  put_f16(raw, kHalfMinusOne);
  for (int j = 0; j < 16; ++j) raw.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  const std::vector<float> want = {-1.0, -0.75, -0.5, -0.25, 0.0,   0.25, 0.5,   0.75,
                                   1.0,  1.25,  1.5,  1.75,  2.0,   2.25, 2.5,   2.75,
                                   2.75, 2.5,   2.25, 2.0,   1.75,  1.5,  1.25,  1.0,
                                   0.75, 0.5,   0.25, 0.0,   -0.25, -0.5, -0.75, -1.0};
  expect_bits_eq(run(kQ4_1, raw, 32), want, "Q4_1");
}

TEST(Dequant, Q8_0TwoBlocks) {
  // Block 0: d = 0.5, qs[j] = 8j - 128 -> 4j - 64. Block 1: d = -1, qs[j] = j - 16 -> 16 - j,
  // where j = 16 gives 0 * -1 = -0 (a bit-exact comparison sees the sign).
  std::vector<uint8_t> raw;
  put_f16(raw, kHalfHalf);
  for (int j = 0; j < 32; ++j)
    raw.push_back(static_cast<uint8_t>(static_cast<int8_t>(8 * j - 128)));
  put_f16(raw, kHalfMinusOne);
  for (int j = 0; j < 32; ++j) raw.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  std::vector<float> want;
  for (int j = 0; j < 32; ++j) want.push_back(4.0f * j - 64.0f);
  for (int j = 0; j < 32; ++j) want.push_back(j == 16 ? -0.0f : 16.0f - j);
  expect_bits_eq(run(kQ8_0, raw, 64), want, "Q8_0");
  EXPECT_EQ(want[0], -128 * 0.5f);
  EXPECT_EQ(want[31], 120 * 0.5f);
}

// K-quant super-block test data: 8 sub-blocks of 32 with 6-bit scales and mins, packed into 12
// bytes as ggml-common.h describes (j < 4: low 6 bits of bytes j and j+4; j >= 4: a nibble of
// byte j+4 plus the top 2 bits of bytes j-4 and j).
const uint8_t kSc[8] = {1, 2, 3, 4, 17, 33, 63, 5};
const uint8_t kMin[8] = {0, 1, 2, 3, 20, 40, 63, 7};
std::vector<uint8_t> packed_scales() {
  std::vector<uint8_t> s(12);
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(kSc[j] | (kSc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>(kMin[j] | (kMin[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((kSc[j + 4] & 0xF) | (kMin[j + 4] & 0xF) << 4);
  }
  return s;
}
uint8_t k_qs(int i) { return static_cast<uint8_t>(i % 16 | ((i / 8) % 16) << 4); }  // i < 128
uint8_t k_qh(int l) { return static_cast<uint8_t>(0xA5 ^ (l * 7)); }                // l < 32

// Value of element e of the Q4_K/Q5_K test block by the layout's definition (d = 1, dmin = 0.5):
// sub-block sb = e / 32 takes the low (even sb) or high (odd sb) nibbles of qs[32 * (sb / 2) ..];
// Q5_K adds 16 when bit sb of qh[e % 32] is set. y = d * sc * q - dmin * min.
float k_expected(int e, bool five) {
  const int sb = e / 32, l = e % 32;
  const uint8_t byte = k_qs(32 * (sb / 2) + l);
  int q = sb % 2 == 0 ? byte & 0xF : byte >> 4;
  if (five && (k_qh(l) >> sb & 1)) q += 16;
  return (1.0f * kSc[sb]) * static_cast<float>(q) - 0.5f * kMin[sb];
}

TEST(Dequant, Q4_K) {
  std::vector<uint8_t> raw;
  put_f16(raw, kHalfOne);
  put_f16(raw, kHalfHalf);
  for (uint8_t b : packed_scales()) raw.push_back(b);
  for (int i = 0; i < 128; ++i) raw.push_back(k_qs(i));
  const std::vector<float> y = run(kQ4_K, raw, 256);
  // Worked by hand: e=45 is sub-block 1 (sc 2, min 1), high nibble of qs[13] = 1: 2*1 - 0.5.
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[33], -0.5f);
  EXPECT_EQ(y[45], 1.5f);
  EXPECT_EQ(y[140], 194.0f);  // sb 4: 17 * 12 - 0.5 * 20
  EXPECT_EQ(y[191], 343.0f);  // sb 5: 33 * 11 - 0.5 * 40
  EXPECT_EQ(y[200], 472.5f);  // sb 6: 63 * 8 - 0.5 * 63
  EXPECT_EQ(y[255], 71.5f);   // sb 7: 5 * 15 - 0.5 * 7
  for (int e = 0; e < 256; ++e) ASSERT_EQ(y[e], k_expected(e, false)) << "element " << e;
}

TEST(Dequant, Q5_K) {
  std::vector<uint8_t> raw;
  put_f16(raw, kHalfOne);
  put_f16(raw, kHalfHalf);
  for (uint8_t b : packed_scales()) raw.push_back(b);
  for (int l = 0; l < 32; ++l) raw.push_back(k_qh(l));
  for (int i = 0; i < 128; ++i) raw.push_back(k_qs(i));
  const std::vector<float> y = run(kQ5_K, raw, 256);
  EXPECT_EQ(y[0], 16.0f);     // qh[0] = 0xA5 has bit 0: (0 + 16) * 1
  EXPECT_EQ(y[140], 466.0f);  // qh[12] = 0xF1 has bit 4: 17 * (12 + 16) - 10
  EXPECT_EQ(y[200], 472.5f);  // qh[8] = 0xDD lacks bit 6: as in Q4_K
  for (int e = 0; e < 256; ++e) ASSERT_EQ(y[e], k_expected(e, true)) << "element " << e;
}

TEST(Dequant, Q6_K) {
  // d = 0.25, scales[k] = k - 8, ql[i] = i, qh[i] = 29 i. Element e: half h = e / 128, quarter
  // qd = (e % 128) / 32, l = e % 32; low 4 bits from ql[64h + 32(qd % 2) + l] (low nibble for
  // qd < 2), high 2 bits from qh[32h + l] >> 2qd; q = that - 32; scale scales[8h + 2qd + l / 16].
  std::vector<uint8_t> raw;
  for (int i = 0; i < 128; ++i) raw.push_back(static_cast<uint8_t>(i));
  for (int i = 0; i < 64; ++i) raw.push_back(static_cast<uint8_t>(29 * i));
  for (int k = 0; k < 16; ++k) raw.push_back(static_cast<uint8_t>(static_cast<int8_t>(k - 8)));
  put_f16(raw, kHalfQuarter);
  ASSERT_EQ(raw.size(), 210u);
  const std::vector<float> y = run(kQ6_K, raw, 256);
  EXPECT_EQ(y[0], 64.0f);    // q = -32, scale -8: 0.25 * -8 * -32
  EXPECT_EQ(y[17], 26.25f);  // ql 17 low 1, qh 493&255=237 bits 1: q = 17 - 32 = -15, scale -7
  EXPECT_EQ(y[70], 0.0f);    // q = 0
  EXPECT_EQ(y[255], -43.75f);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, qd = (e % 128) / 32, l = e % 32;
    const uint8_t lo = raw[64 * h + 32 * (qd % 2) + l];
    const int nib = qd < 2 ? lo & 0xF : lo >> 4;
    const int hi = (raw[128 + 32 * h + l] >> (2 * qd)) & 3;
    const int q = (nib | hi << 4) - 32;
    const int sc = static_cast<int8_t>(raw[192 + 8 * h + 2 * qd + l / 16]);
    ASSERT_EQ(y[e], (0.25f * sc) * static_cast<float>(q)) << "element " << e;
  }
}

// 32-element blocks with a 5th bit (ggml-common.h block_q5_0/_q5_1): element j < 16 takes the low
// nibble of qs[j] and bit j of the little-endian u32 qh, element 16 + j the high nibble and bit
// 16 + j. Q5_0: (q - 16) * d; Q5_1: q * d + m.
TEST(Dequant, Q5_0AndQ5_1) {
  const uint32_t qh = 0x80010003;  // bits 0, 1, 16, 31
  std::vector<uint8_t> q5_0, q5_1;
  put_f16(q5_0, kHalfHalf);
  put_f16(q5_1, kHalfHalf);
  put_f16(q5_1, kHalfMinusOne);
  for (int k = 0; k < 4; ++k) q5_0.push_back(static_cast<uint8_t>(qh >> 8 * k));
  for (int k = 0; k < 4; ++k) q5_1.push_back(static_cast<uint8_t>(qh >> 8 * k));
  for (int j = 0; j < 16; ++j) q5_0.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  for (int j = 0; j < 16; ++j) q5_1.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  const std::vector<float> y0 = run(kQ5_0, q5_0, 32), y1 = run(kQ5_1, q5_1, 32);
  EXPECT_EQ(y0[0], 0.0f);    // (0 + 16 - 16) * 0.5
  EXPECT_EQ(y0[1], 0.5f);    // (1 + 16 - 16) * 0.5
  EXPECT_EQ(y0[2], -7.0f);   // (2 - 16) * 0.5
  EXPECT_EQ(y0[16], 7.5f);   // high nibble of qs[0] = 15, bit 16: (31 - 16) * 0.5
  EXPECT_EQ(y0[31], 0.0f);   // high nibble of qs[15] = 0, bit 31
  EXPECT_EQ(y0[30], -7.5f);  // high nibble of qs[14] = 1, no bit: (1 - 16) * 0.5
  EXPECT_EQ(y1[16], 14.5f);  // 31 * 0.5 - 1
  EXPECT_EQ(y1[3], 0.5f);    // 3 * 0.5 - 1
  for (int e = 0; e < 32; ++e) {
    const int nib = e < 16 ? e : 31 - e;
    const int q = nib | static_cast<int>(qh >> e & 1) << 4;
    ASSERT_EQ(y0[e], (q - 16) * 0.5f) << e;
    ASSERT_EQ(y1[e], q * 0.5f - 1.0f) << e;
  }
}

// IQ4_NL's non-linear grid (ggml-quants.c kvalues_iq4nl), written out here.
const int kGrid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

TEST(Dequant, IQ4_NL) {
  std::vector<uint8_t> raw;
  put_f16(raw, kHalfHalf);
  for (int j = 0; j < 16; ++j) raw.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  const std::vector<float> y = run(kIQ4_NL, raw, 32);
  EXPECT_EQ(y[0], -63.5f);
  EXPECT_EQ(y[8], 0.5f);
  EXPECT_EQ(y[16], 56.5f);
  for (int j = 0; j < 16; ++j) {
    ASSERT_EQ(y[j], 0.5f * kGrid[j]) << j;
    ASSERT_EQ(y[16 + j], 0.5f * kGrid[15 - j]) << j;
  }
}

// The 2-bit K-quants (ggml-common.h block_q2_K, block_q3_K): element e lies in half h = e / 128,
// shift group r = (e % 128) / 32, at l = e % 32; its 2 bits are (qs[32 h + l] >> 2 r) & 3 and its
// 16-element sub-block is 8 h + 2 r + l / 16.
uint8_t k2_qs(int i) { return static_cast<uint8_t>(i * 37 + 11); }  // i < 64
int k2_bits(int e) { return (k2_qs(32 * (e / 128) + e % 32) >> 2 * ((e % 128) / 32)) & 3; }
int k2_sub(int e) { return 8 * (e / 128) + 2 * ((e % 128) / 32) + (e % 32) / 16; }

TEST(Dequant, Q2_K) {
  // scales[k]: scale k % 16 in the low nibble, min 15 - k in the high; d = 0.5, dmin = 0.25.
  std::vector<uint8_t> raw;
  for (int k = 0; k < 16; ++k) raw.push_back(static_cast<uint8_t>(k | (15 - k) << 4));
  for (int i = 0; i < 64; ++i) raw.push_back(k2_qs(i));
  put_f16(raw, kHalfHalf);
  put_f16(raw, kHalfQuarter);
  ASSERT_EQ(raw.size(), 84u);
  const std::vector<float> y = run(kQ2_K, raw, 256);
  EXPECT_EQ(y[0], -3.75f);   // qs[0] = 11 -> bits 3, sub-block 0: 0.5 * 0 * 3 - 0.25 * 15
  EXPECT_EQ(y[40], -3.25f);  // qs[8] = 51, r = 1 -> bits 0, sub-block 2: 0 - 0.25 * 13
  EXPECT_EQ(y[200], 5.25f);  // qs[40] = 211, r = 2 -> bits 1, sub-block 12: 0.5 * 12 - 0.25 * 3
  for (int e = 0; e < 256; ++e) {
    const int k = k2_sub(e);
    ASSERT_EQ(y[e], (0.5f * k) * static_cast<float>(k2_bits(e)) - 0.25f * (15 - k)) << e;
  }
}

TEST(Dequant, Q3_K) {
  // hmask[l] = 53 l + 7: its bit 4 h + r SET means no offset, clear means q = bits - 4. Scale k
  // is stored as k + 24 (k - 8 after the -32) and packed as ggml-common.h describes: low nibbles
  // in bytes 0..7 (k < 8 low, k >= 8 high nibble of byte k - 8), high 2 bits in byte 8 + k % 4 at
  // bit 2 (k / 4). d = 0.5.
  std::vector<uint8_t> raw;
  for (int l = 0; l < 32; ++l) raw.push_back(static_cast<uint8_t>(53 * l + 7));
  for (int i = 0; i < 64; ++i) raw.push_back(k2_qs(i));
  uint8_t sc[12] = {};
  for (int k = 0; k < 16; ++k) {
    const int stored = k + 24;
    sc[k % 8] |= static_cast<uint8_t>((stored & 0xF) << (k < 8 ? 0 : 4));
    sc[8 + k % 4] |= static_cast<uint8_t>((stored >> 4) << 2 * (k / 4));
  }
  raw.insert(raw.end(), sc, sc + 12);
  put_f16(raw, kHalfHalf);
  ASSERT_EQ(raw.size(), 110u);
  const std::vector<float> y = run(kQ3_K, raw, 256);
  EXPECT_EQ(y[0], -12.0f);   // bits 3, hmask[0] = 7 has bit 0: q = 3; scale 0 - 8: 0.5 * -8 * 3
  EXPECT_EQ(y[17], 14.0f);   // bits 0, hmask[17] = 140 lacks bit 0: q = -4; scale 1 - 8
  EXPECT_EQ(y[200], -6.0f);  // bits 1, hmask[8] = 175 lacks bit 6: q = -3; scale 12 - 8
  EXPECT_EQ(y[255], -14.0f);
  for (int e = 0; e < 256; ++e) {
    const int bit = raw[e % 32] >> (4 * (e / 128) + (e % 128) / 32) & 1;
    const int q = k2_bits(e) - (bit ? 0 : 4);
    ASSERT_EQ(y[e], (0.5f * (k2_sub(e) - 8)) * static_cast<float>(q)) << e;
  }
}

TEST(Dequant, IQ4_XS) {
  // d = 0.5; sub-block ib's 6-bit scale is stored as ib + 28 (ib - 4 after the -32): low nibble
  // in scales_l[ib / 2] (low nibble for even ib), high 2 bits at bit 2 ib of the u16 scales_h.
  // Then per sub-block 16 bytes of grid indices, low nibbles first (as IQ4_NL).
  std::vector<uint8_t> raw;
  put_f16(raw, kHalfHalf);
  uint16_t scales_h = 0;
  uint8_t scales_l[4] = {};
  for (int ib = 0; ib < 8; ++ib) {
    const int stored = ib + 28;
    scales_l[ib / 2] |= static_cast<uint8_t>((stored & 0xF) << 4 * (ib % 2));
    scales_h |= static_cast<uint16_t>((stored >> 4) << 2 * ib);
  }
  put_f16(raw, scales_h);
  raw.insert(raw.end(), scales_l, scales_l + 4);
  for (int i = 0; i < 128; ++i) raw.push_back(k_qs(i));
  ASSERT_EQ(raw.size(), 136u);
  const std::vector<float> y = run(kIQ4_XS, raw, 256);
  EXPECT_EQ(y[0], 254.0f);    // sub-block 0, scale -4: 0.5 * -4 * -127
  EXPECT_EQ(y[100], 24.5f);   // sub-block 3, scale -1, qs[52] = 0x64 low nibble 4: 0.5 * -1 * -49
  EXPECT_EQ(y[255], 169.5f);  // sub-block 7, scale 3, qs[127] = 0xFF high nibble: 0.5 * 3 * 113
  for (int e = 0; e < 256; ++e) {
    const int ib = e / 32, j = e % 32;
    const uint8_t byte = k_qs(16 * ib + j % 16);
    const int idx = j < 16 ? byte & 0xF : byte >> 4;
    ASSERT_EQ(y[e], (0.5f * (ib - 4)) * static_cast<float>(kGrid[idx])) << e;
  }
}

TEST(Dequant, RejectsUnsupportedTypesAndPartialBlocks) {
  std::vector<uint8_t> raw(256, 0);
  std::vector<float> out(64);
  try {
    dequantize(kIQ2_XXS, raw.data(), out.data(), 256);
    FAIL() << "IQ2_XXS accepted";
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("IQ4_XS"), std::string::npos) << e.what();  // the list
  }
  try {
    dequantize(99, raw.data(), out.data(), 32);
    FAIL() << "type 99 accepted";
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown (id 99)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize(kQ8_0, raw.data(), out.data(), 33), kvb::Error);
  EXPECT_THROW(dequantize(kQ3_K, raw.data(), out.data(), 32), kvb::Error);  // 256 per block
  EXPECT_EQ(std::string(ggml_type_name(kQ4_K)), "Q4_K");
  EXPECT_EQ(std::string(ggml_type_name(1000)), "unknown");
  size_t bytes = 0, elems = 0;
  EXPECT_FALSE(ggml_block_info(kIQ2_XXS, &bytes, &elems));
  EXPECT_FALSE(ggml_block_info(kQ8_1, &bytes, &elems));
}

// Block sizes: ggml-common.h's static_asserts (and gguf-py constants.py GGML_QUANT_SIZES), the
// numbers a GGUF reader multiplies a tensor's block count by to validate its byte size.
TEST(Dequant, BlockSizesMatchGgml) {
  struct Want {
    uint32_t type;
    size_t bytes, elems;
  };
  for (const Want& w :
       {Want{kQ4_0, 18, 32}, Want{kQ4_1, 20, 32}, Want{kQ5_0, 22, 32}, Want{kQ5_1, 24, 32},
        Want{kQ8_0, 34, 32}, Want{kIQ4_NL, 18, 32}, Want{kQ2_K, 84, 256}, Want{kQ3_K, 110, 256},
        Want{kQ4_K, 144, 256}, Want{kQ5_K, 176, 256}, Want{kQ6_K, 210, 256},
        Want{kIQ4_XS, 136, 256}, Want{kF16, 2, 1}, Want{kBF16, 2, 1}, Want{kF32, 4, 1}}) {
    size_t bytes = 0, elems = 0;
    ASSERT_TRUE(ggml_block_info(w.type, &bytes, &elems)) << ggml_type_name(w.type);
    EXPECT_EQ(bytes, w.bytes) << ggml_type_name(w.type);
    EXPECT_EQ(elems, w.elems) << ggml_type_name(w.type);
  }
}

// The OpenMP path (large n) must give exactly what block-by-block calls give.
TEST(Dequant, LargeInputMatchesBlockwise) {
  const size_t nb = 1100, block_bytes = 144;  // 281600 elements: above the parallel threshold
  std::mt19937_64 rng(7);
  std::vector<uint8_t> raw(nb * block_bytes);
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < nb; ++i) {  // finite scales
    raw[i * block_bytes + 1] &= 0x3B;
    raw[i * block_bytes + 3] &= 0x3B;
  }
  const std::vector<float> all = run(kQ4_K, raw, nb * 256);
  std::vector<float> one(256);
  for (size_t i = 0; i < nb; ++i) {
    dequantize(kQ4_K, raw.data() + i * block_bytes, one.data(), 256);
    ASSERT_EQ(std::memcmp(one.data(), all.data() + i * 256, 256 * sizeof(float)), 0)
        << "block " << i;
  }
}

// Golden files (tests/dequant_fixture.h): raw blocks and gguf-py 0.10.0's dequantization of
// them. Bit-exact: gguf-py computes every type in f32 with the same operations in the same order.
class DequantGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantGolden, BitExactAgainstGgufPy) {
  const testing::DequantFixture fx = testing::read_dequant_fixture(KVB_FIXTURES_DIR, GetParam());
  EXPECT_STREQ(ggml_type_name(fx.type), GetParam());
  size_t block_bytes = 0, block_elems = 0;
  ASSERT_TRUE(ggml_block_info(fx.type, &block_bytes, &block_elems));
  ASSERT_EQ(fx.raw.size(), fx.want.size() / block_elems * block_bytes);
  expect_bits_eq(run(fx.type, fx.raw, fx.want.size()), fx.want, fx.path);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantGolden,
                         ::testing::Values("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
                                           "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                                           "IQ4_XS"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvb::kernels::cpu
