// RoPE, CUDA twin of cpu/rope: inverse frequencies from the host (bit-identical to the CPU's),
// angle = position * inv_freq in f32, cos/sin in double rounded to f32 and times attn_factor in
// f32. The rotation is written without contraction; the CPU build may fuse one of its products
// (GCC contracts x0*c - x1*s on FMA hardware), so the two agree to an ulp or two, not bitwise.
#include "kernels/cuda/rope.h"

#include <cmath>
#include <vector>

#include "kernels/cuda/graph.h"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

// One thread per (token, head, pair).
__global__ void rope_kernel(float* x, const int32_t* pos, const float* inv_freq, int n,
                            int num_heads, int head_dim, int half, bool neox, float linear_scale,
                            float attn_factor) {
  const size_t total = static_cast<size_t>(n) * num_heads * half;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const size_t th = idx / half;  // token * num_heads + head
    const int t = static_cast<int>(th / num_heads);
    const float position = __fdiv_rn(static_cast<float>(pos[t]), linear_scale);
    const float angle = __fmul_rn(position, inv_freq[i]);
    const float c = __fmul_rn(static_cast<float>(cos(static_cast<double>(angle))), attn_factor);
    const float s = __fmul_rn(static_cast<float>(sin(static_cast<double>(angle))), attn_factor);
    float* v = x + th * head_dim;  // [head_dim]
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

// rope()'s checks of the parameters and the head_dim they rotate; returns half the rotated dims.
int check_params(const RopeParams& p, int head_dim) {
  KVB_CHECK(p.rot_dim > 0 && p.rot_dim <= head_dim && p.rot_dim % 2 == 0)
      << "cuda::rope: rot_dim " << p.rot_dim << " head_dim " << head_dim;
  const int half = p.rot_dim / 2;
  KVB_CHECK(p.freq_factors.empty() || static_cast<int>(p.freq_factors.size()) == half)
      << "cuda::rope: " << p.freq_factors.size() << " frequency factors for rot_dim " << p.rot_dim;
  KVB_CHECK(p.linear_scale > 0) << "cuda::rope: linear_scale = " << p.linear_scale;
  KVB_CHECK(std::isfinite(p.attn_factor) && p.attn_factor > 0)
      << "cuda::rope: attn_factor = " << p.attn_factor;
  return half;
}

void launch(float* x, const int32_t* pos, const float* inv_freq, int n, int num_heads, int head_dim,
            const RopeParams& p, cudaStream_t stream) {
  const int half = p.rot_dim / 2;
  const size_t total = static_cast<size_t>(n) * num_heads * half;
  const unsigned blocks = grid_for(total, 256) > 65535u ? 65535u : grid_for(total, 256);
  rope_kernel<<<blocks, 256, 0, stream>>>(x, pos, inv_freq, n, num_heads, head_dim, half,
                                          p.style == RopeStyle::kNeox, p.linear_scale,
                                          p.attn_factor);
  KVB_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope(float* x, const int32_t* pos, int n, int num_heads, int head_dim, const RopeParams& p,
          cudaStream_t stream) {
  const int half = check_params(p, head_dim);
  KVB_CHECK(n >= 0 && num_heads >= 0) << "cuda::rope: n = " << n << ", num_heads = " << num_heads;
  if (n == 0 || num_heads == 0) return;
  const std::vector<float> inv_freq = cpu::rope_inv_freqs(p);
  StreamScratch freq(half * sizeof(float), stream);
  // From pageable memory the call returns once inv_freq is staged (copied, in a captured step's
  // graph: graph.h), so it may go out of scope.
  upload_async(freq.as<float>(), inv_freq.data(), half * sizeof(float), stream);
  launch(x, pos, freq.as<float>(), n, num_heads, head_dim, p, stream);
}

RopeTable::RopeTable(const RopeParams& p, int head_dim) : params_(p), head_dim_(head_dim) {
  check_params(p, head_dim);
  const std::vector<float> inv_freq = cpu::rope_inv_freqs(p);
  inv_freq_ = DeviceBuffer<float>(inv_freq.size());
  KVB_CUDA_CHECK(cudaMemcpy(inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(float),
                            cudaMemcpyHostToDevice));
}

void rope(float* x, const int32_t* pos, int n, int num_heads, const RopeTable& table,
          cudaStream_t stream) {
  KVB_CHECK(n >= 0 && num_heads >= 0) << "cuda::rope: n = " << n << ", num_heads = " << num_heads;
  if (n == 0 || num_heads == 0) return;
  launch(x, pos, table.inv_freq(), n, num_heads, table.head_dim(), table.params(), stream);
}

}  // namespace kvb::kernels::cuda
