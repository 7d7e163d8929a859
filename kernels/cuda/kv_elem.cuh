// Element access for KV storage types (f32, bf16) shared by the kv_cache_device and attention
// kernels: loads widen to f32, stores round to nearest even.
#pragma once

#include <cuda_bf16.h>

namespace kvb::kernels::cuda {

__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ float kv_load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void kv_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

}  // namespace kvb::kernels::cuda
