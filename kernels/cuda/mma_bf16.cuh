// bf16 tensor-core helpers shared by the mma kernels (attention_prefill_mma.cu,
// attention_decode_mma.cu): mma.sync.m16n8k16 with bf16 operands and f32 accumulators (PTX ISA
// "Matrix fragments for mma.m16n8k16 with floating point type"), the operand packing, and the
// reductions over a quad (the 4 lanes that hold one accumulator row). Internal to the kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kvb::kernels::cuda::mma {

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// Two bf16 (nearest even) in one register, `lo` in the low half: the element with the smaller
// column index, as the mma fragments expect.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// d (16 x 8, f32) += a (16 x 16, bf16, row-major) * b (16 x 8, bf16, column-major). Fragments,
// with gid = lane / 4 and tig = lane % 4: a = {(gid, 2tig..+1), (gid+8, 2tig..+1), (gid,
// 2tig+8..+9), (gid+8, 2tig+8..+9)}; b = {(k 2tig..+1, n gid), (k 2tig+8..+9, n gid)}; d = {(gid,
// 2tig), (gid, 2tig+1), (gid+8, 2tig), (gid+8, 2tig+1)}. Needs compute capability 8.0 (the
// kernels' plans refuse older devices).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace kvb::kernels::cuda::mma
