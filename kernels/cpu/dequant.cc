// Dequantization of ggml block formats to f32, CPU reference. Block structs follow ggml-common.h
// (block_q4_0, _q4_1, _q5_0, _q5_1, _q8_0, _iq4_nl; block_q2_K ... block_q6_K, block_iq4_xs); the
// loops follow ggml-quants.c dequantize_row_* element for element, with the same f32 operations
// in the same order. Every product here is exact in f32 (an f16 scale has 11 significant bits,
// sub-scales 4-8 and quants 2-7, at most 24 together), so only a final `+ m` / `- m` rounds and
// FMA contraction cannot change a bit.
#include "kernels/cpu/dequant.h"

#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/f16.h"

namespace kvb::kernels::cpu {
namespace {

using namespace ggml;  // the block layouts

// ggml-quants.c kvalues_iq4nl: the non-linear 4-bit grid of IQ4_NL and IQ4_XS.
constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

struct TypeInfo {
  const char* name;
  size_t block_bytes;  // 0: ggml defines the type but we cannot dequantize it
  size_t block_elems;
};

// Indexed by ggml_type id (ggml.h / gguf-py 0.10.0 constants.py); ids 4 and 5 were retired.
constexpr TypeInfo kTypes[] = {
    {"F32", 4, 1},                           // 0
    {"F16", 2, 1},                           // 1
    {"Q4_0", sizeof(BlockQ4_0), kQK},        // 2
    {"Q4_1", sizeof(BlockQ4_1), kQK},        // 3
    {"unknown", 0, 0},                       // 4
    {"unknown", 0, 0},                       // 5
    {"Q5_0", sizeof(BlockQ5_0), kQK},        // 6
    {"Q5_1", sizeof(BlockQ5_1), kQK},        // 7
    {"Q8_0", sizeof(BlockQ8_0), kQK},        // 8
    {"Q8_1", 0, 0},                          // 9
    {"Q2_K", sizeof(BlockQ2_K), kQK_K},      // 10
    {"Q3_K", sizeof(BlockQ3_K), kQK_K},      // 11
    {"Q4_K", sizeof(BlockQ4_K), kQK_K},      // 12
    {"Q5_K", sizeof(BlockQ5_K), kQK_K},      // 13
    {"Q6_K", sizeof(BlockQ6_K), kQK_K},      // 14
    {"Q8_K", 0, 0},                          // 15
    {"IQ2_XXS", 0, 0},                       // 16
    {"IQ2_XS", 0, 0},                        // 17
    {"IQ3_XXS", 0, 0},                       // 18
    {"IQ1_S", 0, 0},                         // 19
    {"IQ4_NL", sizeof(BlockIQ4_NL), kQK},    // 20
    {"IQ3_S", 0, 0},                         // 21
    {"IQ2_S", 0, 0},                         // 22
    {"IQ4_XS", sizeof(BlockIQ4_XS), kQK_K},  // 23
    {"I8", 0, 0},                            // 24
    {"I16", 0, 0},                           // 25
    {"I32", 0, 0},                           // 26
    {"I64", 0, 0},                           // 27
    {"F64", 0, 0},                           // 28
    {"IQ1_M", 0, 0},                         // 29
    {"BF16", 2, 1},                          // 30
    {"Q4_0_4_4", 0, 0},                      // 31
    {"Q4_0_4_8", 0, 0},                      // 32
    {"Q4_0_8_8", 0, 0},                      // 33
    {"TQ1_0", 0, 0},                         // 34
    {"TQ2_0", 0, 0},                         // 35
};
constexpr uint32_t kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

// Each dequantize_block_* reads one block from src (any alignment) and writes block_elems floats.
void dequantize_block_q4_0(const uint8_t* src, float* y) {  // y: [32]
  BlockQ4_0 b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  for (size_t j = 0; j < kQK / 2; ++j) {
    const int x0 = (b.qs[j] & 0x0F) - 8;
    const int x1 = (b.qs[j] >> 4) - 8;
    y[j] = x0 * d;
    y[j + kQK / 2] = x1 * d;
  }
}

void dequantize_block_q4_1(const uint8_t* src, float* y) {  // y: [32]
  BlockQ4_1 b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const float m = fp16_to_f32(b.m);
  for (size_t j = 0; j < kQK / 2; ++j) {
    const int x0 = b.qs[j] & 0x0F;
    const int x1 = b.qs[j] >> 4;
    y[j] = x0 * d + m;
    y[j + kQK / 2] = x1 * d + m;
  }
}

void dequantize_block_q8_0(const uint8_t* src, float* y) {  // y: [32]
  BlockQ8_0 b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  for (size_t j = 0; j < kQK; ++j) y[j] = b.qs[j] * d;
}

// Q5_0/Q5_1: Q4_0/Q4_1 nibbles plus a 5th bit; element j takes bit j of qh, element 16 + j
// bit 16 + j (ggml-quants.c dequantize_row_q5_0: xh_0 / xh_1).
inline uint32_t load_qh(const uint8_t* qh) {
  return qh[0] | uint32_t{qh[1]} << 8 | uint32_t{qh[2]} << 16 | uint32_t{qh[3]} << 24;
}

void dequantize_block_q5_0(const uint8_t* src, float* y) {  // y: [32]
  BlockQ5_0 b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const uint32_t qh = load_qh(b.qh);
  for (size_t j = 0; j < kQK / 2; ++j) {
    const int x0 = ((b.qs[j] & 0x0F) | ((qh >> j) & 1) << 4) - 16;
    const int x1 = ((b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16;
    y[j] = x0 * d;
    y[j + kQK / 2] = x1 * d;
  }
}

void dequantize_block_q5_1(const uint8_t* src, float* y) {  // y: [32]
  BlockQ5_1 b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const float m = fp16_to_f32(b.m);
  const uint32_t qh = load_qh(b.qh);
  for (size_t j = 0; j < kQK / 2; ++j) {
    const int x0 = (b.qs[j] & 0x0F) | ((qh >> j) & 1) << 4;
    const int x1 = (b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = x0 * d + m;
    y[j + kQK / 2] = x1 * d + m;
  }
}

void dequantize_block_iq4_nl(const uint8_t* src, float* y) {  // y: [32]
  BlockIQ4_NL b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  for (size_t j = 0; j < kQK / 2; ++j) {
    y[j] = d * kIQ4Values[b.qs[j] & 0x0F];
    y[j + kQK / 2] = d * kIQ4Values[b.qs[j] >> 4];
  }
}

// Q2_K (ggml-quants.c dequantize_row_q2_K): each 128-element half reads 32 quant bytes four
// times, shifting by 0, 2, 4, 6; every 16 elements have their own 4-bit scale and min.
void dequantize_block_q2_k(const uint8_t* src, float* y) {  // y: [256]
  BlockQ2_K b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const float min = fp16_to_f32(b.dmin);
  const uint8_t* q = b.qs;
  int is = 0;
  for (size_t n = 0; n < kQK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part) {  // bytes 0..15, then 16..31
        const uint8_t sc = b.scales[is++];
        const float dl = d * (sc & 0xF);
        const float ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * ((q[16 * part + l] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

// Q3_K's 16 6-bit scales (ggml-quants.c dequantize_row_q3_K, the kmask1/kmask2 shuffle): the low
// 4 bits of scale k are the low (k < 8) or high (k >= 8) nibble of byte k % 8, the high 2 bits
// are bits 2 (k / 4) .. +1 of byte 8 + k % 4. Stored offset by 32.
inline int q3_k_scale(const uint8_t* s, int k) {
  const int low = k < 8 ? s[k] & 0xF : s[k - 8] >> 4;
  const int high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
  return (low | high << 4) - 32;
}

// Q3_K: Q2_K's 2-bit layout with one hmask bit per element (bit 4 * (n / 128) + shift / 2 of
// hmask[l], l = 0..31); the quant is the 2 bits minus 4 where that bit is CLEAR.
void dequantize_block_q3_k(const uint8_t* src, float* y) {  // y: [256]
  BlockQ3_K b;
  std::memcpy(&b, src, sizeof(b));
  const float d_all = fp16_to_f32(b.d);
  const uint8_t* q = b.qs;
  int is = 0;
  unsigned m = 1;
  for (size_t n = 0; n < kQK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part) {  // bytes 0..15, then 16..31
        const float dl = d_all * q3_k_scale(b.scales, is++);
        for (int l = 16 * part; l < 16 * part + 16; ++l) {
          *y++ = dl * (((q[l] >> shift) & 3) - ((b.hmask[l] & m) ? 0 : 4));
        }
      }
      m <<= 1;
    }
    q += 32;
  }
}

void dequantize_block_q4_k(const uint8_t* src, float* y) {  // y: [256]
  BlockQ4_K b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const float min = fp16_to_f32(b.dmin);
  const uint8_t* q = b.qs;
  int is = 0;
  uint8_t sc, m;
  for (size_t j = 0; j < kQK_K; j += 64) {  // 64 elements share 32 bytes: low, then high nibbles
    get_scale_min_k4(is + 0, b.scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = min * m;
    get_scale_min_k4(is + 1, b.scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

void dequantize_block_q5_k(const uint8_t* src, float* y) {  // y: [256]
  BlockQ5_K b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const float min = fp16_to_f32(b.dmin);
  const uint8_t* ql = b.qs;
  const uint8_t* qh = b.qh;
  int is = 0;
  uint8_t sc, m;
  uint8_t u1 = 1, u2 = 2;
  for (size_t j = 0; j < kQK_K; j += 64) {
    get_scale_min_k4(is + 0, b.scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = min * m;
    get_scale_min_k4(is + 1, b.scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 <<= 2;
    u2 <<= 2;
  }
}

void dequantize_block_q6_k(const uint8_t* src, float* y) {  // y: [256]
  BlockQ6_K b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const uint8_t* ql = b.ql;
  const uint8_t* qh = b.qh;
  const int8_t* sc = b.scales;
  for (size_t n = 0; n < kQK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// IQ4_XS (ggml-quants.c dequantize_row_iq4_xs): 8 sub-blocks of 32, each with a 6-bit scale
// (low nibble from scales_l, high 2 bits from scales_h, offset by 32) and IQ4_NL's nibble layout.
void dequantize_block_iq4_xs(const uint8_t* src, float* y) {  // y: [256]
  BlockIQ4_XS b;
  std::memcpy(&b, src, sizeof(b));
  const float d = fp16_to_f32(b.d);
  const uint8_t* qs = b.qs;
  for (int ib = 0; ib < static_cast<int>(kQK_K / 32); ++ib) {
    const int ls = ((b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | ((b.scales_h >> 2 * ib) & 3) << 4;
    const float dl = d * (ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * kIQ4Values[qs[j] & 0xF];
      y[j + 16] = dl * kIQ4Values[qs[j] >> 4];
    }
    y += 32;
    qs += 16;
  }
}

// Scalar types, treated as blocks of 64 elements so they share the block loop below.
constexpr size_t kScalarChunk = 64;
void dequantize_chunk_f16(const uint8_t* src, float* y) {  // y: [64]
  uint16_t h[kScalarChunk];
  std::memcpy(h, src, sizeof(h));
  for (size_t j = 0; j < kScalarChunk; ++j) y[j] = fp16_to_f32(h[j]);
}
void dequantize_chunk_bf16(const uint8_t* src, float* y) {  // y: [64]
  uint16_t h[kScalarChunk];
  std::memcpy(h, src, sizeof(h));
  for (size_t j = 0; j < kScalarChunk; ++j) y[j] = bf16_to_f32(h[j]);
}

using BlockFn = void (*)(const uint8_t*, float*);

// Runs fn over nb blocks; blocks are independent, so threads split them statically.
void run_blocks(BlockFn fn, const uint8_t* src, float* dst, size_t nb, size_t block_bytes,
                size_t block_elems) {
  const long long nblocks = static_cast<long long>(nb);
  // Below ~256K elements the thread start-up costs more than the work.
  const bool parallel = nb * block_elems >= (size_t{1} << 18);
#pragma omp parallel for schedule(static) if (parallel)
  for (long long i = 0; i < nblocks; ++i) {
    fn(src + static_cast<size_t>(i) * block_bytes, dst + static_cast<size_t>(i) * block_elems);
  }
}

}  // namespace

float fp16_to_f32(uint16_t h) { return kernels::f16_to_f32(h); }

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

const char* ggml_type_name(uint32_t type) {
  return type < kNumTypes ? kTypes[type].name : "unknown";
}

const char* supported_type_names() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
         "IQ4_XS";
}

bool ggml_block_info(uint32_t type, size_t* block_bytes, size_t* block_elems) {
  if (type >= kNumTypes || kTypes[type].block_bytes == 0) return false;
  *block_bytes = kTypes[type].block_bytes;
  *block_elems = kTypes[type].block_elems;
  return true;
}

void dequantize(uint32_t type, const void* src, float* dst, size_t n) {
  size_t block_bytes = 0, block_elems = 0;
  KVB_CHECK(ggml_block_info(type, &block_bytes, &block_elems))
      << "cannot dequantize ggml type " << ggml_type_name(type) << " (id " << type
      << "); supported: " << supported_type_names();
  KVB_CHECK(n % block_elems == 0) << "dequantize " << ggml_type_name(type) << ": n=" << n
                                  << " is not a multiple of the block size " << block_elems;
  if (n == 0) return;
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case 0:  // F32
      std::memcpy(dst, s, n * sizeof(float));
      return;
    case 1:     // F16
    case 30: {  // BF16
      const BlockFn fn = type == 1 ? dequantize_chunk_f16 : dequantize_chunk_bf16;
      const size_t chunks = n / kScalarChunk;
      run_blocks(fn, s, dst, chunks, kScalarChunk * 2, kScalarChunk);
      for (size_t i = chunks * kScalarChunk; i < n; ++i) {  // tail shorter than one chunk
        uint16_t h;
        std::memcpy(&h, s + 2 * i, sizeof(h));
        dst[i] = type == 1 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    }
    case 2:
      return run_blocks(dequantize_block_q4_0, s, dst, n / kQK, block_bytes, kQK);
    case 3:
      return run_blocks(dequantize_block_q4_1, s, dst, n / kQK, block_bytes, kQK);
    case 6:
      return run_blocks(dequantize_block_q5_0, s, dst, n / kQK, block_bytes, kQK);
    case 7:
      return run_blocks(dequantize_block_q5_1, s, dst, n / kQK, block_bytes, kQK);
    case 8:
      return run_blocks(dequantize_block_q8_0, s, dst, n / kQK, block_bytes, kQK);
    case 10:
      return run_blocks(dequantize_block_q2_k, s, dst, n / kQK_K, block_bytes, kQK_K);
    case 11:
      return run_blocks(dequantize_block_q3_k, s, dst, n / kQK_K, block_bytes, kQK_K);
    case 12:
      return run_blocks(dequantize_block_q4_k, s, dst, n / kQK_K, block_bytes, kQK_K);
    case 13:
      return run_blocks(dequantize_block_q5_k, s, dst, n / kQK_K, block_bytes, kQK_K);
    case 14:
      return run_blocks(dequantize_block_q6_k, s, dst, n / kQK_K, block_bytes, kQK_K);
    case 20:
      return run_blocks(dequantize_block_iq4_nl, s, dst, n / kQK, block_bytes, kQK);
    case 23:
      return run_blocks(dequantize_block_iq4_xs, s, dst, n / kQK_K, block_bytes, kQK_K);
    default:
      KVB_FAIL() << "internal: ggml type " << ggml_type_name(type)
                 << " has block info but no kernel";
  }
}

int64_t first_nonfinite_block(uint32_t type, const void* src, size_t n) {
  size_t block_bytes = 0, block_elems = 0;
  KVB_CHECK(ggml_block_info(type, &block_bytes, &block_elems))
      << "ggml type " << type << " (" << ggml_type_name(type)
      << ") is not supported; supported: " << supported_type_names();
  KVB_CHECK(n % block_elems == 0) << n << " elements of " << ggml_type_name(type)
                                  << " are not whole blocks of " << block_elems;
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t blocks = static_cast<int64_t>(n / block_elems);
  auto f16_ok = [](uint16_t h) { return (h & 0x7C00u) != 0x7C00u; };
  auto u16 = [&](int64_t b, size_t offset) {
    uint16_t h;
    std::memcpy(&h, p + b * block_bytes + offset, 2);
    return h;
  };
  // The byte offsets of a block's f16 scales: d, then m or dmin where the type has one.
  size_t d = 0, m = 0;
  bool two = false;
  switch (type) {
    case 0:  // F32
      for (int64_t i = 0; i < blocks; ++i) {
        uint32_t bits;
        std::memcpy(&bits, p + i * 4, 4);
        if ((bits & 0x7F800000u) == 0x7F800000u) return i;
      }
      return -1;
    case 1:  // F16
      for (int64_t i = 0; i < blocks; ++i) {
        if (!f16_ok(u16(i, 0))) return i;
      }
      return -1;
    case 30:  // BF16
      for (int64_t i = 0; i < blocks; ++i) {
        if ((u16(i, 0) & 0x7F80u) == 0x7F80u) return i;
      }
      return -1;
    case 2:
      d = offsetof(BlockQ4_0, d);
      break;
    case 3:
      d = offsetof(BlockQ4_1, d), m = offsetof(BlockQ4_1, m), two = true;
      break;
    case 6:
      d = offsetof(BlockQ5_0, d);
      break;
    case 7:
      d = offsetof(BlockQ5_1, d), m = offsetof(BlockQ5_1, m), two = true;
      break;
    case 8:
      d = offsetof(BlockQ8_0, d);
      break;
    case 10:
      d = offsetof(BlockQ2_K, d), m = offsetof(BlockQ2_K, dmin), two = true;
      break;
    case 11:
      d = offsetof(BlockQ3_K, d);
      break;
    case 12:
      d = offsetof(BlockQ4_K, d), m = offsetof(BlockQ4_K, dmin), two = true;
      break;
    case 13:
      d = offsetof(BlockQ5_K, d), m = offsetof(BlockQ5_K, dmin), two = true;
      break;
    case 14:
      d = offsetof(BlockQ6_K, d);
      break;
    case 20:
      d = offsetof(BlockIQ4_NL, d);
      break;
    case 23:
      d = offsetof(BlockIQ4_XS, d);
      break;
    default:
      KVB_FAIL() << "first_nonfinite_block: no scale layout for ggml type " << type << " ("
                 << ggml_type_name(type) << ")";
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (!f16_ok(u16(b, d)) || (two && !f16_ok(u16(b, m)))) return b;
  }
  return -1;
}

}  // namespace kvb::kernels::cpu
