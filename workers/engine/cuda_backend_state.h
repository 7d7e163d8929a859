// CudaBackend's private state shared by its files (cuda_backend.cc, cuda_backend_dense.cc,
// cuda_backend_attention.cc): the per-layer weights, the activation scratch and three helpers.
// Compiled only with KVB_WITH_CUDA.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kv_cache.h"
#include "workers/engine/cuda_backend.h"

namespace kvb::engine {

namespace cu = kvb::kernels::cuda;

namespace cuda_backend_detail {

// b holds at least count elements (grown 1.5x; contents not kept).
template <typename T>
void ensure(cu::DeviceBuffer<T>& b, size_t count) {
  if (b.size() < count) b = cu::DeviceBuffer<T>(std::max<size_t>(count, b.size() * 3 / 2));
}
// The device rows of a cache (null before its first pass on a GPU). DeviceKvCache is the one
// DeviceRows implementation.
inline cu::DeviceKvCache* rows_of(const kernels::KvCache& cache) {
  return static_cast<cu::DeviceKvCache*>(cache.device_rows());
}

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace cuda_backend_detail

// One layer's weights: matrices in the engine's dtype (one of the two buffers is used).
struct CudaBackend::DeviceLayer {
  // bqkv: the q, k and v biases back to back [QD + 2 KVD] (zeros for a missing one: adding 0
  // changes no bit), empty when the model has none.
  cu::DeviceBuffer<float> attn_norm, ffn_norm, bqkv;
  cu::DeviceBuffer<float> q_norm, k_norm;  // [head_dim] (Qwen3, Gemma 3), else empty
  cu::DeviceBuffer<float> post_attn_norm, post_ffn_norm;  // [dim] (Gemma 3), else empty
  struct Matrix {
    cu::DeviceBuffer<float> f32;
    cu::DeviceBuffer<__nv_bfloat16> bf16;
    const void* ptr(DType t) const {
      return t == DType::kBf16 ? static_cast<const void*>(bf16.data()) : f32.data();
    }
  };
  // wqkv: wq, wk and wv stacked [QD + 2 KVD, dim]; w_gu: w_gate and w_up [2 hidden, dim]. One
  // product each (linear_qkv, linear_gate_up); a single matrix is a block of rows.
  Matrix wqkv, wo, w_gu, w_down;
};

struct CudaBackend::Scratch {
  cu::DeviceBuffer<float> x, xb, q, k, v, kx, vx, att, proj, gate, up, logits;
  cu::DeviceBuffer<float> fused;  // [n, QD + 2 KVD] or [n, 2 hidden]: a stacked product
  cu::DeviceBuffer<__nv_bfloat16> x16;
  cu::DeviceBuffer<int32_t> tokens, pos, qpos, slots, iota;
  cu::DeviceBuffer<float> col_sums, last_probs, rolled, stash, stash_q, pre_k, pre_q;
  cu::DeviceBuffer<unsigned char> rolled_kv;  // rolled keys in the cache dtype
};

}  // namespace kvb::engine
