// CudaPolicyOps' write_rows (a policy's fixed vectors uploaded into its rows: qfilter's filters)
// and channel_square_means (policy_ops.h; ThinK's key energy, POLICIES.md `think`):
// a thread per (head, channel) sums the squares of its channel over the head's slots in slot
// order in f64, as the CPU instance does (each square of an f32 entry is exact in f64, so the
// sums are the CPU's bits), then one copy to the host and one sync, counted in transfers().
#include <algorithm>

#include "common/error.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/graph.h"
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

void CudaPolicyOps::write_rows(ops::SlotRows& rows, int layer, std::span<const float> values,
                               int length) {
  ops_detail::CudaRows& r = ops_detail::device(rows);
  KVB_CHECK(layer >= 0 && layer < rows.layers() && rows.type() == ops::SlotType::kF32 &&
            length >= 0 && values.size() == static_cast<size_t>(rows.heads()) * length)
      << "cuda policy ops: write_rows of " << values.size() << " values for " << rows.heads()
      << " rows of " << length;
  resize(rows, layer, std::vector<int32_t>(rows.heads(), length));
  const int ld = r.ld(layer);
  std::vector<float> packed(static_cast<size_t>(rows.heads()) * ld, 0.0f);
  for (int h = 0; h < rows.heads(); ++h) {
    std::copy(values.begin() + static_cast<size_t>(h) * length,
              values.begin() + static_cast<size_t>(h + 1) * length,
              packed.begin() + static_cast<size_t>(h) * ld);
  }
  if (packed.empty()) return;
  upload_async(r.data(layer), packed.data(), packed.size() * sizeof(float), stream_);
  ++transfers_.h2d_copies;
  transfers_.h2d_bytes += packed.size() * sizeof(float);
}

void CudaPolicyOps::channel_square_means(const kernels::KvIndex& cache_index, int layer,
                                         ops::CacheRows which, std::vector<double>* out) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
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
