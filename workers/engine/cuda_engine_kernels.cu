// Element-wise kernels of the GPU engine (cuda_engine_kernels.h).
#include <cuda_bf16.h>

#include "common/error.h"
#include "kernels/cuda/runtime.h"
#include "workers/engine/cuda_engine_kernels.h"

namespace kvb::engine::gpu {

namespace cu = kvb::kernels::cuda;

namespace {
constexpr unsigned kThreads = 256;

__global__ void embed_kernel(float* x, const float* table, const int32_t* tokens, int dim,
                             size_t total, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = i / dim, c = i % dim;
    const float v = table[static_cast<size_t>(tokens[t]) * dim + c];
    x[i] = scale == 1.0f ? v : __fmul_rn(v, scale);  // the CPU's x *= embed_scale, unfused
  }
}

__global__ void add_kernel(float* x, const float* y, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void expand_kernel(float* dst, const float* src, int kv_heads, int heads_out, int hd,
                              size_t total) {
  const int group = heads_out / kv_heads;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t d = i % hd;
    const size_t h = (i / hd) % heads_out;
    const size_t t = i / (static_cast<size_t>(hd) * heads_out);
    dst[i] = src[(t * kv_heads + h / group) * hd + d];
  }
}

template <typename T>
__global__ void widen_kernel(float* dst, const T* src, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (sizeof(T) == 4) {
      dst[i] = src[i];
    } else {
      dst[i] = __bfloat162float(src[i]);
    }
  }
}

__global__ void iota_kernel(int32_t* dst, int count) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    dst[i] = i;
  }
}

__global__ void split_kernel(const float* src, ColumnSplit split, int width, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = i / width;
    int j = static_cast<int>(i - t * width), p = 0;
    while (j >= split.width[p]) j -= split.width[p++];
    split.dst[p][t * split.width[p] + j] = src[i];
  }
}

unsigned blocks(size_t work) {
  const unsigned b = cu::grid_for(work, kThreads);
  return b > 65535u * 16u ? 65535u * 16u : b;  // grid-stride loops cover the rest
}
}  // namespace

void embed_rows(float* x, const float* table, const int32_t* tokens, int n, int dim, float scale,
                cudaStream_t stream) {
  KVB_CHECK(n >= 0 && dim > 0) << "embed_rows: n " << n << ", dim " << dim;
  const size_t total = static_cast<size_t>(n) * dim;
  if (total == 0) return;
  embed_kernel<<<blocks(total), kThreads, 0, stream>>>(x, table, tokens, dim, total, scale);
  KVB_CUDA_CHECK_LAUNCH();
}

void add_inplace(float* x, const float* y, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<blocks(count), kThreads, 0, stream>>>(x, y, count);
  KVB_CUDA_CHECK_LAUNCH();
}

void expand_gqa(float* dst, const float* src, int n, int kv_heads, int heads_out, int head_dim,
                cudaStream_t stream) {
  KVB_CHECK(n >= 0 && kv_heads > 0 && heads_out >= kv_heads && heads_out % kv_heads == 0 &&
            head_dim > 0)
      << "expand_gqa: n " << n << ", " << kv_heads << " KV heads to " << heads_out << ", head_dim "
      << head_dim;
  const size_t total = static_cast<size_t>(n) * heads_out * head_dim;
  if (total == 0) return;
  expand_kernel<<<blocks(total), kThreads, 0, stream>>>(dst, src, kv_heads, heads_out, head_dim,
                                                        total);
  KVB_CUDA_CHECK_LAUNCH();
}

void widen_to_f32(float* dst, const void* src, cu::KvDtype dtype, size_t count,
                  cudaStream_t stream) {
  if (count == 0) return;
  if (dtype == cu::KvDtype::kF32) {
    widen_kernel<<<blocks(count), kThreads, 0, stream>>>(dst, static_cast<const float*>(src),
                                                         count);
  } else {
    widen_kernel<<<blocks(count), kThreads, 0, stream>>>(
        dst, static_cast<const __nv_bfloat16*>(src), count);
  }
  KVB_CUDA_CHECK_LAUNCH();
}

void iota(int32_t* dst, int count, cudaStream_t stream) {
  if (count <= 0) return;
  iota_kernel<<<blocks(count), kThreads, 0, stream>>>(dst, count);
  KVB_CUDA_CHECK_LAUNCH();
}

void split_columns(const float* src, int n, const ColumnSplit& split, cudaStream_t stream) {
  KVB_CHECK(n >= 0 && split.parts >= 1 && split.parts <= 3)
      << "split_columns: n " << n << ", " << split.parts << " parts";
  int width = 0;
  for (int p = 0; p < split.parts; ++p) {
    KVB_CHECK(split.width[p] > 0 && split.dst[p] != nullptr)
        << "split_columns: part " << p << " of width " << split.width[p];
    width += split.width[p];
  }
  const size_t total = static_cast<size_t>(n) * width;
  if (total == 0) return;
  split_kernel<<<blocks(total), kThreads, 0, stream>>>(src, split, width, total);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvb::engine::gpu
