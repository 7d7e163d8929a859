// CudaPolicyOps' channel_square_means (policy_ops.h; ThinK's key energy, POLICIES.md `think`):
// a thread per (head, channel) sums the squares of its channel over the head's slots in slot
// order in f64, as the CPU instance does (each square of an f32 entry is exact in f64, so the
// sums are the CPU's bits), then one copy to the host and one sync, counted in transfers().
#include <algorithm>

#include "common/error.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/kv_elem.cuh"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {
namespace {

template <typename T>
__global__ void channel_square_means_kernel(const T* rows, DeviceLayerKvView v, HeadTable len,
                                            double* out) {
  const int h = blockIdx.y, d = v.head_dim;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < d; c += gridDim.x * blockDim.x) {
    double acc = 0;
    const T* x = rows + static_cast<size_t>(v.offsets[h]) * d + c;
    for (int s = 0; s < len.v[h]; ++s) {
      const double e = kv_load(x + static_cast<size_t>(s) * d);
      acc = __dadd_rn(acc, __dmul_rn(e, e));
    }
    out[static_cast<size_t>(h) * d + c] =
        len.v[h] > 0 ? __ddiv_rn(acc, static_cast<double>(len.v[h])) : 0.0;
  }
}

}  // namespace

void CudaPolicyOps::channel_square_means(const KvCache& cache, int layer, ops::CacheRows which,
                                         std::vector<double>* out) {
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "channel_square_means");
  const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
  KVB_CHECK(layer >= 0 && layer < cache.shape().num_layers && heads <= kMaxParamHeads)
      << "cuda policy ops: channel_square_means of layer " << layer << " (" << heads
      << " heads, at most " << kMaxParamHeads << ")";
  out->assign(static_cast<size_t>(heads) * d, 0.0);
  HeadTable len{};
  for (int h = 0; h < heads; ++h) len.v[h] = dev.length(layer, h);
  const DeviceLayerKvView v = dev.layer(layer);
  DeviceBuffer<double> sums(out->size());
  const dim3 grid((d + 127) / 128, heads);
  if (v.dtype == KvDtype::kF32) {
    channel_square_means_kernel<<<grid, 128, 0, stream_>>>(
        static_cast<const float*>(which == ops::CacheRows::kKeys ? v.keys : v.values), v, len,
        sums.data());
  } else {
    channel_square_means_kernel<<<grid, 128, 0, stream_>>>(
        static_cast<const __nv_bfloat16*>(which == ops::CacheRows::kKeys ? v.keys : v.values), v,
        len, sums.data());
  }
  KVB_CUDA_CHECK_LAUNCH();
  ++launches_;
  KVB_CUDA_CHECK(cudaMemcpyAsync(out->data(), sums.data(), out->size() * sizeof(double),
                                 cudaMemcpyDeviceToHost, stream_));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ++transfers_.d2h_copies;
  ++transfers_.stream_syncs;
  transfers_.d2h_bytes += out->size() * sizeof(double);
}

}  // namespace kvb::kernels::cuda
