// CudaPolicyOps' leverage_scores (policy_ops.h; kvpress LeverageScorePress). Five launches: the
// keys' means, the sketched rows x_t (a thread per entry), the Gram matrix (a thread per entry,
// t in order), the Cholesky factor (one thread per head: kernels/cpu/leverage.h, the host's
// code) and the scores (a thread per token, the same header's solve). Every sum is the CPU
// instance's f64 fused multiply-add chain in its order, so the scores are its bits. The sketch is
// the one upload (counted in transfers()); nothing is copied back and nothing waits.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/leverage.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

using ops::SlotRows;
using ops::SlotType;
using ops_detail::CudaRows;
using ops_detail::device;

// Block h, a thread per dimension: the mean of the head's keys over the tokens, t in order.
__global__ void key_means_kernel(const float* keys, int key_heads, int d, int first, int count,
                                 double* mean) {
  const int h = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    double acc = 0;
    for (int t = 0; t < count; ++t) {
      acc = __dadd_rn(
          acc, static_cast<double>(keys[(static_cast<size_t>(first + t) * key_heads + h) * d + i]));
    }
    mean[static_cast<size_t>(h) * d + i] = __ddiv_rn(acc, static_cast<double>(count));
  }
}

// A thread per (t, c) of head blockIdx.y: x_t[c] = sum_i (K_t[i] - mean[i]) Phi[i][c].
__global__ void sketch_rows_kernel(const float* keys, int key_heads, int d, int first, int count,
                                   const double* mean, const float* sketch, int k, double* x) {
  const int h = blockIdx.y;
  const float* phi = sketch + static_cast<size_t>(h) * d * k;
  const double* mu = mean + static_cast<size_t>(h) * d;
  double* xh = x + static_cast<size_t>(h) * count * k;
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       e < static_cast<size_t>(count) * k; e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(e / k), c = static_cast<int>(e % k);
    const float* kt = keys + (static_cast<size_t>(first + t) * key_heads + h) * d;
    double acc = 0;
    for (int i = 0; i < d; ++i) {
      acc = fma(__dsub_rn(static_cast<double>(kt[i]), mu[i]),
                static_cast<double>(phi[static_cast<size_t>(i) * k + c]), acc);
    }
    xh[e] = acc;
  }
}

// A thread per (a, b), b >= a, of head blockIdx.y: sum_t x_t[a] x_t[b], written to both halves.
__global__ void gram_kernel(const double* x, int count, int k, double* g) {
  const int h = blockIdx.y;
  const double* xh = x + static_cast<size_t>(h) * count * k;
  double* gh = g + static_cast<size_t>(h) * k * k;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < k * k; e += gridDim.x * blockDim.x) {
    const int a = e / k, b = e % k;
    if (b < a) continue;
    double acc = 0;
    for (int t = 0; t < count; ++t) {
      acc = fma(xh[static_cast<size_t>(t) * k + a], xh[static_cast<size_t>(t) * k + b], acc);
    }
    gh[a * k + b] = acc;
    gh[b * k + a] = acc;
  }
}

// One thread per head: the Cholesky factor with kvpress's jitters; a head with none gets NaN in
// its factor's first entry (its scores become NaN).
__global__ void cholesky_kernel(const double* g, int k, int heads, double* l) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  double* lh = l + static_cast<size_t>(h) * k * k;
  if (!cpu::cholesky_with_jitter(g + static_cast<size_t>(h) * k * k, k, lh)) lh[0] = nan("");
}

// A thread per token of head blockIdx.y: float(max(0, |L^{-1} x_t|^2)).
__global__ void leverage_kernel(const double* x, const double* l, int count, int k, float* out,
                                int ld) {
  const int h = blockIdx.y;
  const double* lh = l + static_cast<size_t>(h) * k * k;
  double y[ops::kMaxSketch];
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < count; t += gridDim.x * blockDim.x) {
    const double* xt = x + (static_cast<size_t>(h) * count + t) * k;
    const float s = static_cast<float>(cpu::solve_sq_norm(lh, xt, k, y));
    out[static_cast<size_t>(h) * ld + t] = isnan(lh[0]) ? nanf("") : s;
  }
}

}  // namespace

void CudaPolicyOps::leverage_scores(SlotRows& out, int out_layer, const ops::LayerStats& st,
                                    int key_heads, int head_dim, int first, int count,
                                    const float* sketch, int k) {
  CudaRows& r = device(out);
  KVB_CHECK(out_layer >= 0 && out_layer < out.layers() && out.type() == SlotType::kF32)
      << "cuda policy ops: leverage_scores on layer " << out_layer << " of rows for "
      << out.layers() << " layers";
  const int heads = out.heads(), d = head_dim;
  KVB_USAGE_CHECK(heads <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " heads per layer; this "
      << "policy's rows have " << heads;
  KVB_CHECK(heads <= key_heads && st.pre_rope_keys != nullptr && sketch != nullptr && k >= 1 &&
            k <= ops::kMaxSketch && first >= 0 && count >= 1 && first + count <= st.n_new && d >= 1)
      << "cuda policy ops: leverage_scores: " << heads << " rows of " << key_heads
      << " key heads, tokens [" << first << ", " << first + count << ") of " << st.n_new
      << ", a sketch of " << k << " columns (at most " << ops::kMaxSketch << ")";
  r.reserve(out_layer, count);
  for (int h = 0; h < heads; ++h) r.set_len(out_layer, h, count);
  if (heads == 0) return;
  // Scratch (f64): the means [heads, d], the sketched rows [heads, count, k], the Gram matrices
  // and the factors [heads, k, k] each, then the sketch as floats [heads, d, k].
  const size_t kk = static_cast<size_t>(k) * k;
  const size_t rows = static_cast<size_t>(heads) * count * k;
  const size_t sketch_floats = static_cast<size_t>(heads) * d * k;
  double* mean =
      f64_scratch(static_cast<size_t>(heads) * d + rows + 2 * heads * kk + (sketch_floats + 1) / 2);
  double* x = mean + static_cast<size_t>(heads) * d;
  double* g = x + rows;
  double* l = g + heads * kk;
  float* phi = reinterpret_cast<float*>(l + heads * kk);
  upload_async(phi, sketch, sketch_floats * sizeof(float), stream_);
  ++transfers_.h2d_copies;
  transfers_.h2d_bytes += sketch_floats * sizeof(float);
  key_means_kernel<<<heads, std::min(256, std::max(32, d)), 0, stream_>>>(
      st.pre_rope_keys, key_heads, d, first, count, mean);
  KVB_CUDA_CHECK_LAUNCH();
  sketch_rows_kernel<<<dim3(std::min(256u, grid_for(static_cast<size_t>(count) * k, 256)), heads),
                       256, 0, stream_>>>(st.pre_rope_keys, key_heads, d, first, count, mean, phi,
                                          k, x);
  KVB_CUDA_CHECK_LAUNCH();
  gram_kernel<<<dim3(grid_for(kk, 256), heads), 256, 0, stream_>>>(x, count, k, g);
  KVB_CUDA_CHECK_LAUNCH();
  cholesky_kernel<<<grid_for(static_cast<size_t>(heads), 32), 32, 0, stream_>>>(g, k, heads, l);
  KVB_CUDA_CHECK_LAUNCH();
  leverage_kernel<<<dim3(std::min(64u, grid_for(static_cast<size_t>(count), 128)), heads), 128, 0,
                    stream_>>>(x, l, count, k, static_cast<float*>(r.data(out_layer)),
                               r.ld(out_layer));
  KVB_CUDA_CHECK_LAUNCH();
  launches_ += 5;
}

}  // namespace kvb::kernels::cuda
