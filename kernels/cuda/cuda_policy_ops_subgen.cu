// CudaPolicyOps' SubGen ops (cuda_policy_ops.h): the policy's sketches in device memory
// (kernels/cuda/subgen_sketch.h), absorbed and queried over the cache's device rows.
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/cuda_rows.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/subgen_sketch.h"

namespace kvb::kernels::cuda {
namespace {

class CudaSubgenState final : public ops::SubgenState {
 public:
  CudaSubgenState(const cpu::SubgenParams& p, int layers, int heads, cudaStream_t stream)
      : sketches(p, layers, heads, stream) {}
  std::unique_ptr<ops::SubgenState> clone() const override {
    return std::make_unique<CudaSubgenState>(*this);  // deep: DeviceSubgenSketches' copy
  }
  size_t bytes() const override { return sketches.sketch_bytes(); }

  DeviceSubgenSketches sketches;
};

CudaSubgenState& device(ops::SubgenState& s) {
  auto* d = dynamic_cast<CudaSubgenState*>(&s);
  KVB_CHECK(d != nullptr) << "SubGen state made by another ops instance reached the CUDA ops";
  return *d;
}
const CudaSubgenState& device(const ops::SubgenState& s) {
  return device(const_cast<ops::SubgenState&>(s));
}

}  // namespace

std::unique_ptr<ops::SubgenState> CudaPolicyOps::make_subgen_state(const cpu::SubgenParams& p,
                                                                        int layers, int heads) {
  return std::make_unique<CudaSubgenState>(p, layers, heads, stream_);
}

void CudaPolicyOps::subgen_query(const ops::SubgenState* state, const ops::SubgenAttend& a,
                                 const kernels::KvIndex& cache_index) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "subgen_query");
  const int ckv = cache.shape().num_kv_heads;
  std::vector<int32_t> lengths(ckv);
  for (int h = 0; h < ckv; ++h) lengths[h] = cache.length(a.layer, h);
  bool any = false;
  for (uint8_t c : a.compressed) any |= c != 0;
  KVB_CHECK(state != nullptr || !any)
      << "cuda policy ops: subgen_query with a compressed head and no SubGen state";
  SubgenQueryHeadsArgs q;
  q.q = a.q;
  q.out = a.out;
  q.n = a.n;
  q.num_heads = a.num_heads;
  q.head_dim = a.head_dim;
  q.scale = a.scale;
  if (state != nullptr) {
    // The layer's arrays are allocated on first use: a const state may hand them out because
    // no head reads an array it has not absorbed into (compressed heads were absorbed first).
    auto& sk = const_cast<DeviceSubgenSketches&>(device(*state).sketches);
    q.s = sk.params().s;
    q.t = sk.params().t;
    q.max_clusters = sk.params().max_clusters;
    if (any) q.sketches = sk.layer(a.layer);
  }
  if (a.exact_bias != nullptr) {
    const ops_detail::CudaRows& b = ops_detail::device(*a.exact_bias);
    KVB_CHECK(b.type() == ops::SlotType::kF32 && a.layer >= 0 && a.layer < b.layers() &&
              b.heads() == ckv)
        << "cuda policy ops: subgen_query's bias rows (" << b.layers() << " x " << b.heads()
        << ") for layer " << a.layer << " of a cache of " << ckv << " heads";
    for (int h = 0; h < ckv; ++h) {
      KVB_CHECK(b.length(a.layer, h) == lengths[h])
          << "cuda policy ops: subgen_query's bias row (" << a.layer << ", " << h << ") holds "
          << b.length(a.layer, h) << " entries for " << lengths[h] << " slots";
    }
    q.exact_bias = static_cast<const float*>(b.data(a.layer));
    q.bias_ld = b.ld(a.layer);
  }
  q.kv = dev.layer(a.layer);
  q.compressed = a.compressed;
  q.lengths = lengths;
  cuda::subgen_query_heads(q, stream_);
  ++launches_;  // the row chunks of one call count as one
}

void CudaPolicyOps::subgen_absorb(ops::SubgenState& state, int layer,
                                  const kernels::KvIndex& cache_index,
                                  std::span<const ops::SubgenAbsorb> heads, uint64_t seed) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  if (heads.empty()) return;
  DeviceSubgenSketches& sk = device(state).sketches;
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "subgen_absorb");
  std::vector<SubgenAbsorbHead> table(heads.size());
  for (size_t i = 0; i < heads.size(); ++i) {
    const ops::SubgenAbsorb& h = heads[i];
    table[i] = {h.head, h.first, h.end, h.counter_head, h.fresh ? 1 : 0, h.delta2};
  }
  cuda::subgen_absorb(sk.params(), sk.layer(layer), dev.layer(layer), table, seed,
                      static_cast<uint32_t>(layer), cpu::subgen_distance_fuses(), stream_);
  launches_ +=
      (static_cast<int64_t>(heads.size()) + kMaxSubgenAbsorbHeads - 1) / kMaxSubgenAbsorbHeads;
}

std::vector<float> CudaPolicyOps::read_keys(const kernels::KvIndex& cache_index, int layer,
                                            int head, int first, int count) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  return read_cache_rows(cache, layer, head, first, count, ops::CacheRows::kKeys);
}

std::vector<float> CudaPolicyOps::read_cache_rows(const kernels::KvIndex& cache_index, int layer,
                                                  int head, int first, int count,
                                                  ops::CacheRows which) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  DeviceKvCache& dev = ops_detail::cache_rows(cache, "read_cache_rows");
  KVB_CHECK(head >= 0 && head < cache.shape().num_kv_heads && first >= 0 && count >= 0 &&
            first + count <= dev.length(layer, head))
      << "cuda policy ops: read_cache_rows of slots [" << first << ", " << first + count
      << ") of layer "
      << layer << " head " << head << ", which holds "
      << (head >= 0 && head < cache.shape().num_kv_heads ? dev.length(layer, head) : -1);
  const int d = cache.shape().head_dim;
  const size_t elems = static_cast<size_t>(count) * d;
  std::vector<float> out(elems);
  if (elems == 0) return out;
  const DeviceLayerKvView v = dev.layer(layer);
  const size_t at = (static_cast<size_t>(dev.offset(layer, head)) + first) * d;
  const size_t eb = kv_dtype_bytes(v.dtype);
  std::vector<unsigned char> raw(elems * eb);
  const void* rows = which == ops::CacheRows::kKeys ? v.keys : v.values;
  KVB_CUDA_CHECK(cudaMemcpyAsync(raw.data(), static_cast<const unsigned char*>(rows) + at * eb,
                                 raw.size(), cudaMemcpyDeviceToHost, stream_));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ++transfers_.d2h_copies;
  ++transfers_.stream_syncs;
  transfers_.d2h_bytes += raw.size();
  if (v.dtype == KvDtype::kF32) {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    const auto* b = reinterpret_cast<const uint16_t*>(raw.data());
    for (size_t i = 0; i < elems; ++i) out[i] = cpu::f32_from_bf16(b[i]);  // exact widening
  }
  return out;
}

cpu::SubgenSketch CudaPolicyOps::read_subgen(const ops::SubgenState& state, int layer,
                                             int head) {
  return device(state).sketches.download(layer, head);
}

}  // namespace kvb::kernels::cuda
