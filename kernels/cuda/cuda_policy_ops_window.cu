// CudaPolicyOps' window_attention (policy_ops.h): a window of the block's queries attending a
// cache layer's device rows, softmax in f64, the probabilities left on the device where
// window_sum reads them (a SnapKV-family scorer over a cache that is not the prompt's). Each
// logit is the CPU instance's f64 sum of exact f32 x f32 products in index order (explicit
// round-to-nearest adds, so no contraction), times the CPU's 1 / sqrt(head_dim); the normaliser
// sums in slot order. The entries are the CPU's bits except where the device's f64 exp differs
// from glibc's in the last bit and the f32 rounding does not absorb it. The window's queries are
// one counted upload; nothing waits.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

constexpr int kThreads = 128;

// window_attention's rows on the device: [heads][w][stride] f32, grown as calls need (a
// stream-ordered allocation; freed as CudaRows frees its buffers).
class CudaWindowProbs final : public ops::WindowProbs {
 public:
  explicit CudaWindowProbs(cudaStream_t stream) : stream_(stream) {}
  ~CudaWindowProbs() override {
    if (!buf_) return;
    if (capturing(stream_)) {
      free_async(buf_, stream_);
    } else {
      cudaFreeAsync(buf_, 0);
    }
  }
  CudaWindowProbs(const CudaWindowProbs&) = delete;
  CudaWindowProbs& operator=(const CudaWindowProbs&) = delete;

  float* reset(int heads, int w, int stride) {
    const size_t need = std::max<size_t>(1, static_cast<size_t>(heads) * w * stride);
    if (need > cap_) {
      const size_t want = std::max(need, cap_ + cap_ / 2);
      free_async(buf_, stream_);
      buf_ = nullptr;
      cap_ = 0;
      buf_ = static_cast<float*>(malloc_async(want * sizeof(float), stream_));
      cap_ = want;
    }
    data_ = buf_;
    heads_ = heads;
    w_ = w;
    stride_ = stride;
    return buf_;
  }

 private:
  cudaStream_t stream_;
  float* buf_ = nullptr;
  size_t cap_ = 0;
};

// A block per (window query i = blockIdx.x, query head q = blockIdx.y): the head's visible slots
// (positions <= at + i), their f64 logits into `logit` ([heads][w][stride]), the row's maximum,
// exp, the normaliser in slot order (one thread), then the f32 probabilities; entries from the
// visible count on are 0.
template <typename T>
__global__ void window_attention_kernel(const float* y, const T* keys, DeviceLayerKvView v,
                                        HeadTable len, int w, int heads, int group, int32_t at,
                                        double scale, int stride, double* logit, float* out) {
  const int i = blockIdx.x, q = blockIdx.y, h = q / group, d = v.head_dim;
  const T* base = keys + static_cast<size_t>(v.offsets[h]) * d;
  const int32_t* pos = v.positions + v.offsets[h];
  const float* yq = y + (static_cast<size_t>(i) * heads + q) * d;
  const size_t row = static_cast<size_t>(q) * w + i;
  double* lg = logit + row * stride;
  float* o = out + row * stride;
  __shared__ int visible;
  __shared__ double part[kThreads];
  __shared__ double total;
  if (threadIdx.x == 0) {
    // upper_bound of the query's position in the head's increasing positions
    int lo = 0, hi = len.v[h];
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (pos[mid] <= at + i) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    visible = lo;
  }
  __syncthreads();
  const int n = visible;
  double top = -INFINITY;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const T* k = base + static_cast<size_t>(s) * d;
    double dot = 0.0;
    for (int c = 0; c < d; ++c) {
      dot = __dadd_rn(dot,
                      __dmul_rn(static_cast<double>(yq[c]), static_cast<double>(kv_load(k + c))));
    }
    const double l = __dmul_rn(dot, scale);
    lg[s] = l;
    top = fmax(top, l);  // order-free: the row's maximum is the same in any order
  }
  part[threadIdx.x] = top;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) part[threadIdx.x] = fmax(part[threadIdx.x], part[threadIdx.x + step]);
    __syncthreads();
  }
  const double m = part[0];
  for (int s = threadIdx.x; s < n; s += blockDim.x) lg[s] = exp(__dadd_rn(lg[s], -m));
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int s = 0; s < n; ++s) sum = __dadd_rn(sum, lg[s]);  // the CPU's slot order
    total = sum;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < stride; s += blockDim.x) {
    o[s] = s < n ? static_cast<float>(__ddiv_rn(lg[s], total)) : 0.0f;
  }
}

}  // namespace

std::unique_ptr<ops::WindowProbs> CudaPolicyOps::make_window_probs() {
  return std::make_unique<CudaWindowProbs>(stream_);
}

void CudaPolicyOps::window_attention(ops::WindowProbs& out, const kernels::KvIndex& cache_index,
                                     int layer, const ops::LayerStats& st, int w) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  auto* probs = dynamic_cast<CudaWindowProbs*>(&out);
  KVB_CHECK(probs != nullptr)
      << "cuda policy ops: window_attention: probabilities made by another ops instance";
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "window_attention");
  const int kv = cache.shape().num_kv_heads, qh = st.num_heads;
  KVB_USAGE_CHECK(qh <= kMaxOpsHeads)
      << "--device cuda decides for at most " << kMaxOpsHeads << " heads per layer; this model "
      << "has " << qh << " query heads";
  KVB_CHECK(layer >= 0 && layer < cache.shape().num_layers && st.last_queries != nullptr &&
            w >= 1 && w <= st.n_queries && kv >= 1 && qh % kv == 0)
      << "cuda policy ops: window_attention: layer " << layer << ", a window of " << w << " of "
      << st.n_queries << " queries, " << qh << " query heads over " << kv << " cache heads";
  HeadTable len{};
  int longest = 0;
  for (int h = 0; h < kv; ++h) {
    len.v[h] = dev.length(layer, h);
    longest = std::max(longest, len.v[h]);
  }
  float* o = probs->reset(qh, w, longest);
  if (longest == 0) return;
  const DeviceLayerKvView v = dev.layer(layer);
  const int d = v.head_dim, group = qh / kv;
  // Scratch: the rows' f64 logits [qh][w][longest], then the window's queries [w][qh][d] as
  // floats.
  const size_t rows_n = static_cast<size_t>(qh) * w * longest;
  const size_t q_n = static_cast<size_t>(w) * qh * d;
  double* logit = f64_scratch(rows_n + (q_n + 1) / 2);
  float* y = reinterpret_cast<float*>(logit + rows_n);
  upload_async(y, st.last_queries + static_cast<size_t>(st.n_queries - w) * qh * d,
               q_n * sizeof(float), stream_);
  ++transfers_.h2d_copies;
  transfers_.h2d_bytes += q_n * sizeof(float);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const int32_t at = st.block_end - w;
  const dim3 grid(w, qh);
  if (v.dtype == KvDtype::kBf16) {
    window_attention_kernel<<<grid, kThreads, 0, stream_>>>(
        y, static_cast<const __nv_bfloat16*>(v.keys), v, len, w, qh, group, at, scale, longest,
        logit, o);
  } else {
    window_attention_kernel<<<grid, kThreads, 0, stream_>>>(
        y, static_cast<const float*>(v.keys), v, len, w, qh, group, at, scale, longest, logit, o);
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
}

}  // namespace kvb::kernels::cuda
