// Dequantization, CUDA twin of cpu/dequant: one thread per output element, decoding the same
// ggml-common.h block layouts with the formulas of ggml-quants.c dequantize_row_* (read byte by
// byte: blocks are not aligned to their f16 fields in a GGUF tensor). Products are exact in f32
// (see cpu/dequant.cc), and the one rounding step is spelled __fadd_rn / __fsub_rn, as on the CPU.
#include "kernels/cuda/dequant.h"

#include "kernels/cpu/dequant.h"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

// Exact, incl. subnormals and NaN payloads (cvt.f32.f16 may canonicalize NaNs; bits matter here).
__device__ float fp16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: shift the leading one to bit 10
    const uint32_t shift = __clz(mant) - 21;
    mant <<= shift;
    bits = sign | ((113 - shift) << 23) | ((mant & 0x3FF) << 13);
  }
  return __uint_as_float(bits);
}
__device__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}
__device__ uint32_t load_u32(const uint8_t* p) {
  return p[0] | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// ggml-quants.c kvalues_iq4nl (IQ4_NL, IQ4_XS).
__constant__ int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

// ggml-quants.c get_scale_min_k4 over the 12 packed scale bytes q.
__device__ void scale_min_k4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Element e of one block at b (layouts: ggml-common.h block_q4_0 ... block_q6_K).
__device__ float q4_0(const uint8_t* b, int e) {  // {d f16, qs[16]}
  const float d = fp16_bits_to_f32(load_u16(b));
  const uint8_t q = b[2 + (e & 15)];
  return static_cast<float>((e < 16 ? (q & 0xF) : (q >> 4)) - 8) * d;
}
__device__ float q4_1(const uint8_t* b, int e) {  // {d, m f16, qs[16]}
  const float d = fp16_bits_to_f32(load_u16(b)), m = fp16_bits_to_f32(load_u16(b + 2));
  const uint8_t q = b[4 + (e & 15)];
  return __fadd_rn(__fmul_rn(static_cast<float>(e < 16 ? (q & 0xF) : (q >> 4)), d), m);
}
__device__ float q8_0(const uint8_t* b, int e) {  // {d f16, qs[32] int8}
  return static_cast<float>(static_cast<int8_t>(b[2 + e])) * fp16_bits_to_f32(load_u16(b));
}
// Q5_0 {d f16, qh u32, qs[16]}, Q5_1 {d, m f16, qh u32, qs[16]}: Q4_0's nibbles, and element e's
// 5th bit is bit e of qh.
__device__ int q5_quant(const uint8_t* qh, const uint8_t* qs, int e) {
  const uint8_t q = qs[e & 15];
  return (e < 16 ? (q & 0xF) : (q >> 4)) | static_cast<int>((load_u32(qh) >> e) & 1) << 4;
}
__device__ float q5_0(const uint8_t* b, int e) {
  return static_cast<float>(q5_quant(b + 2, b + 6, e) - 16) * fp16_bits_to_f32(load_u16(b));
}
__device__ float q5_1(const uint8_t* b, int e) {
  const float d = fp16_bits_to_f32(load_u16(b)), m = fp16_bits_to_f32(load_u16(b + 2));
  return __fadd_rn(__fmul_rn(static_cast<float>(q5_quant(b + 4, b + 8, e)), d), m);
}
__device__ float iq4_nl(const uint8_t* b, int e) {  // {d f16, qs[16]}: grid indices as Q4_0
  const uint8_t q = b[2 + (e & 15)];
  return __fmul_rn(fp16_bits_to_f32(load_u16(b)),
                   static_cast<float>(kIQ4Values[e < 16 ? (q & 0xF) : (q >> 4)]));
}
// Q2_K {scales[16], qs[64], d, dmin f16} and Q3_K {hmask[32], qs[64], scales[12], d f16}: element
// e of half h = e / 128, shift group r = (e % 128) / 32, l = e % 32 has the 2 bits
// (qs[32 h + l] >> 2 r) & 3 and the 16-element sub-block 8 h + 2 r + l / 16.
__device__ float q2_k(const uint8_t* b, int e) {
  const int h = e / 128, r = (e % 128) / 32, l = e % 32;
  const int q = (b[16 + 32 * h + l] >> (2 * r)) & 3;
  const uint8_t sc = b[8 * h + 2 * r + l / 16];
  const float d = fp16_bits_to_f32(load_u16(b + 80)), dmin = fp16_bits_to_f32(load_u16(b + 82));
  const float dl = __fmul_rn(d, static_cast<float>(sc & 0xF));
  const float ml = __fmul_rn(dmin, static_cast<float>(sc >> 4));
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
}
// Q3_K: 6-bit scale k = low nibble of byte k % 8 (high nibble for k >= 8) | bits 2 (k / 4) of
// byte 8 + k % 4, minus 32; the quant loses 4 where hmask[l] bit 4 h + r is clear.
__device__ float q3_k(const uint8_t* b, int e) {
  const int h = e / 128, r = (e % 128) / 32, l = e % 32;
  const uint8_t* scales = b + 96;
  const int k = 8 * h + 2 * r + l / 16;
  const int low = k < 8 ? (scales[k] & 0xF) : (scales[k - 8] >> 4);
  const int sc = (low | ((scales[8 + k % 4] >> (2 * (k / 4))) & 3) << 4) - 32;
  const int q = ((b[32 + 32 * h + l] >> (2 * r)) & 3) - (((b[l] >> (4 * h + r)) & 1) ? 0 : 4);
  const float dl = __fmul_rn(fp16_bits_to_f32(load_u16(b + 108)), static_cast<float>(sc));
  return __fmul_rn(dl, static_cast<float>(q));
}
// IQ4_XS {d f16, scales_h u16, scales_l[4], qs[128]}: sub-block ib = e / 32 has the 6-bit scale
// (nibble ib % 2 of scales_l[ib / 2] | bits 2 ib of scales_h) - 32 and IQ4_NL's 16-byte layout.
__device__ float iq4_xs(const uint8_t* b, int e) {
  const int ib = e / 32, j = e % 32;
  const int ls_low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
  const int ls_high = (load_u16(b + 2) >> (2 * ib)) & 3;
  const float dl =
      __fmul_rn(fp16_bits_to_f32(load_u16(b)), static_cast<float>((ls_low | ls_high << 4) - 32));
  const uint8_t q = b[8 + 16 * ib + (j & 15)];
  return __fmul_rn(dl, static_cast<float>(kIQ4Values[j < 16 ? (q & 0xF) : (q >> 4)]));
}
// Q4_K {d, dmin f16, scales[12], qs[128]}; Q5_K adds qh[32] before qs. 64 elements share 32
// quant bytes: the first 32 take the low nibbles (scale pair 2c), the next 32 the high (2c+1).
__device__ float q45_k(const uint8_t* b, int e, bool five) {
  const float d = fp16_bits_to_f32(load_u16(b)), dmin = fp16_bits_to_f32(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  const int chunk = e / 64, within = e % 64, l = within % 32, high = within / 32;
  int sc, m;
  scale_min_k4(2 * chunk + high, scales, &sc, &m);
  const float dl = __fmul_rn(d, static_cast<float>(sc)),
              ml = __fmul_rn(dmin, static_cast<float>(m));
  const uint8_t q = qs[32 * chunk + l];
  int v = high ? (q >> 4) : (q & 0xF);
  if (five && (qh[l] & (1u << (2 * chunk + high)))) v += 16;
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(v)), ml);
}
// Q6_K {ql[128], qh[64], scales[16] int8, d f16}: per 128-element half n, element l + 32 r
// (r = 0..3) takes ql's nibble (r & 1 ? +32 : 0, r >= 2 high), qh's bit pair 2r, scale is + 2r.
__device__ float q6_k(const uint8_t* b, int e) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = fp16_bits_to_f32(load_u16(b + 208));
  const int half = e / 128, within = e % 128, r = within / 32, l = within % 32;
  const uint8_t lq = ql[64 * half + l + ((r & 1) ? 32 : 0)];
  const int low = (r >= 2) ? (lq >> 4) : (lq & 0xF);
  const int hi = (qh[32 * half + l] >> (2 * r)) & 3;
  const int q = static_cast<int8_t>(low | (hi << 4)) - 32;
  const int is = l / 16;
  return __fmul_rn(__fmul_rn(d, static_cast<float>(scales[8 * half + is + 2 * r])),
                   static_cast<float>(q));
}

__global__ void dequant_kernel(uint32_t type, const uint8_t* src, float* dst, size_t n,
                               size_t block_bytes, int block_elems) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint8_t* b = src + (i / block_elems) * block_bytes;
    const int e = static_cast<int>(i % block_elems);
    float y;
    switch (type) {
      case 1:
        y = fp16_bits_to_f32(load_u16(b));
        break;
      case 30:
        y = bf16_bits_to_f32(load_u16(b));
        break;
      case 2:
        y = q4_0(b, e);
        break;
      case 3:
        y = q4_1(b, e);
        break;
      case 6:
        y = q5_0(b, e);
        break;
      case 7:
        y = q5_1(b, e);
        break;
      case 8:
        y = q8_0(b, e);
        break;
      case 10:
        y = q2_k(b, e);
        break;
      case 11:
        y = q3_k(b, e);
        break;
      case 20:
        y = iq4_nl(b, e);
        break;
      case 23:
        y = iq4_xs(b, e);
        break;
      case 12:
        y = q45_k(b, e, false);
        break;
      case 13:
        y = q45_k(b, e, true);
        break;
      default:
        y = q6_k(b, e);
        break;  // 14; the host admits no other type
    }
    dst[i] = y;
  }
}

// The types dequant_kernel decodes (all with cpu::ggml_block_info but F32, which is a copy).
bool has_kernel(uint32_t type) {
  for (uint32_t t : {1u, 30u, 2u, 3u, 6u, 7u, 8u, 20u, 10u, 11u, 12u, 13u, 14u, 23u}) {
    if (type == t) return true;
  }
  return false;
}

}  // namespace

void dequantize(uint32_t type, const void* src, float* dst, size_t n, cudaStream_t stream) {
  size_t block_bytes = 0, block_elems = 0;
  KVB_CHECK(cpu::ggml_block_info(type, &block_bytes, &block_elems))
      << "cuda::dequantize: cannot dequantize ggml type " << cpu::ggml_type_name(type) << " (id "
      << type << "); supported: " << cpu::supported_type_names();
  KVB_CHECK(n % block_elems == 0) << "cuda::dequantize " << cpu::ggml_type_name(type) << ": n=" << n
                                  << " is not a multiple of the block size " << block_elems;
  if (n == 0) return;
  KVB_CHECK(src != nullptr && dst != nullptr) << "cuda::dequantize: null pointer";
  if (type == 0) {  // F32
    KVB_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  KVB_CHECK(has_kernel(type)) << "internal: ggml type " << cpu::ggml_type_name(type)
                              << " has block info but no kernel";
  const unsigned blocks = grid_for(n, 256) > 65535u ? 65535u : grid_for(n, 256);
  dequant_kernel<<<blocks, 256, 0, stream>>>(type, static_cast<const uint8_t*>(src), dst, n,
                                             block_bytes, static_cast<int>(block_elems));
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
