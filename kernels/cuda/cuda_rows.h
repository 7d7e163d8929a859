// CudaPolicyOps' device rows (cuda_policy_ops.h): the SlotRows its ops make, shared by the
// files that implement the ops (cuda_policy_ops*.cu). Per layer one stream-ordered buffer of
// [heads, ld] entries; copying deep-copies every layer on the device (Policy::clone). And the
// lookup of a cache's device rows.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::kernels::cuda::ops_detail {

inline size_t entry_bytes(ops::SlotType t) {
  return t == ops::SlotType::kF32 ? sizeof(float) : sizeof(uint64_t);
}

class CudaRows final : public ops::SlotRows {
 public:
  CudaRows(ops::SlotType type, int layers, int heads, cudaStream_t stream)
      : SlotRows(type, layers, heads), stream_(stream), bufs_(layers, nullptr), ld_(layers, 0) {}
  CudaRows(const CudaRows& o)
      : SlotRows(o), stream_(o.stream_), bufs_(o.layers(), nullptr), ld_(o.ld_) {
    for (int l = 0; l < layers(); ++l) {
      const size_t bytes = layer_bytes(l);
      if (bytes == 0) continue;
      KVB_CUDA_CHECK(cudaMallocAsync(&bufs_[l], bytes, stream_));
      KVB_CUDA_CHECK(
          cudaMemcpyAsync(bufs_[l], o.bufs_[l], bytes, cudaMemcpyDeviceToDevice, stream_));
    }
  }
  CudaRows& operator=(const CudaRows&) = delete;
  // Freed on the legacy default stream, which waits for the engine's (blocking) stream: a
  // policy may outlive the engine that made its state. Teardown errors cannot be reported.
  // Inside a captured step (graph.h) a legacy-stream op would invalidate the capture, and the
  // captured work may still read the rows: freed after the graph's launch instead.
  ~CudaRows() override {
    const bool captured = capturing(stream_);
    for (void* b : bufs_) {
      if (!b) continue;
      if (captured) {
        free_async(b, stream_);
      } else {
        cudaFreeAsync(b, 0);
      }
    }
  }
  std::unique_ptr<ops::SlotRows> clone() const override {
    return std::make_unique<CudaRows>(*this);
  }

  void* data(int layer) const { return bufs_[layer]; }
  int ld(int layer) const { return ld_[layer]; }
  void set_len(int layer, int head, int len) { set_length(layer, head, len); }
  // Room for `need` entries per head in `layer`, rows kept (1.5x growth; a stream-ordered copy,
  // so nothing waits).
  void reserve(int layer, int need) {
    if (need <= ld_[layer]) return;
    const int ld = std::max(need, ld_[layer] + ld_[layer] / 2);
    const size_t eb = entry_bytes(type());
    // Capture-aware (graph.h): a captured decode step may grow the rows.
    void* fresh = malloc_async(static_cast<size_t>(heads()) * ld * eb, stream_);
    if (bufs_[layer]) {
      KVB_CUDA_CHECK(cudaMemcpy2DAsync(fresh, ld * eb, bufs_[layer], ld_[layer] * eb,
                                       ld_[layer] * eb, heads(), cudaMemcpyDeviceToDevice,
                                       stream_));
      free_async(bufs_[layer], stream_);
    }
    bufs_[layer] = fresh;
    ld_[layer] = ld;
  }

 private:
  size_t layer_bytes(int l) const {
    return static_cast<size_t>(heads()) * ld_[l] * entry_bytes(type());
  }
  cudaStream_t stream_;
  std::vector<void*> bufs_;
  std::vector<int> ld_;
};

inline CudaRows& device(ops::SlotRows& rows) {
  auto* r = dynamic_cast<CudaRows*>(&rows);
  KVB_CHECK(r != nullptr) << "policy state made by another ops instance reached the CUDA ops";
  return *r;
}
inline const CudaRows& device(const ops::SlotRows& rows) {
  return device(const_cast<ops::SlotRows&>(rows));
}

// Blocks along a row of `longest` entries for the ops' one-thread-per-entry kernels (256 threads a
// block, at most 64 blocks: each thread strides over the rest).
inline unsigned blocks_for(int longest) {
  const unsigned b = grid_for(static_cast<size_t>(std::max(longest, 1)), 256);
  return b > 64u ? 64u : b;
}

// The lengths of rows' heads in `layer` into len, and the longest.
inline int row_lengths(const ops::SlotRows& rows, int layer, HeadTable* len) {
  int longest = 0;
  for (int h = 0; h < rows.heads(); ++h) {
    len->v[h] = rows.length(layer, h);
    longest = std::max(longest, static_cast<int>(len->v[h]));
  }
  return longest;
}

// The device rows of the cache an op was given (what `op` reads).
inline DeviceKvCache& cache_rows(const KvCache& cache, const char* op) {
  auto* dev = dynamic_cast<DeviceKvCache*>(cache.device_rows());
  KVB_CHECK(dev != nullptr) << "cuda policy ops: " << op << " on a cache without device rows";
  return *dev;
}

}  // namespace kvb::kernels::cuda::ops_detail
