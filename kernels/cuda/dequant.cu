// Dequantization, CUDA twin of cpu/dequant: one thread per output element, decoding the same
// ggml-common.h block layouts with the formulas of ggml-quants.c dequantize_row_* (read byte by
// byte: blocks are not aligned to their f16 fields in a GGUF tensor).
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
      case 8:
        y = q8_0(b, e);
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
  KVB_CHECK(type == 1 || type == 30 || type == 2 || type == 3 || type == 8 || type == 12 ||
            type == 13 || type == 14)
      << "internal: ggml type " << cpu::ggml_type_name(type) << " has block info but no kernel";
  const unsigned blocks = grid_for(n, 256) > 65535u ? 65535u : grid_for(n, 256);
  dequant_kernel<<<blocks, 256, 0, stream>>>(type, static_cast<const uint8_t*>(src), dst, n,
                                             block_bytes, static_cast<int>(block_elems));
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::kernels::cuda
