// The CUDA instance of the block stack's Backend (backend.h) on one GPU, built from the
// kernels/cuda twins. Only in builds with CUDA (KVB_WITH_CUDA).
//
// Precision (`--dtype`): f32 keeps f32 weights and f32 GEMMs (cuBLAS pedantic, no TF32), an f32
// KV cache; bf16 stores the weights in bf16, rounds each GEMM's activations to bf16 and
// accumulates in f32 (cublasGemmEx), and keeps a bf16 KV cache. Norms, RoPE, softmax, residuals
// and logits are f32 in both. The embedding table stays f32 (rows are gathered, not multiplied).
//
// KV cache: a kernels::cuda::DeviceKvCache, one flat buffer per layer with per-head offsets,
// capacities and lengths; the attention reads it directly.
//
// Policies: the host mirror (until the policies decide on the device, issue 13). Policies run
// unchanged on a host kernels::KvCache (the `cache` the stack passes) that the backend keeps
// equal to the device cache:
//  - append_kv copies the block's n new K/V rows (post-RoPE; pre-RoPE for rolling positions;
//    bf16-rounded in bf16 mode, so mirror == device) to the host and appends them to the mirror
//    exactly as the CPU backend appends them;
//  - stats_to_host copies the statistics a hook asked for (col_sums [num_heads, stride],
//    last_probs [num_heads, last_w, stride]) to the host; pre-RoPE keys come through download();
//  - apply_plan applies the hook's eviction plan to the mirror and the same keep-lists to the
//    device cache, with one DeviceKvCache::keep_slots per layer the plan changes.
// Host traffic per decode step and layer: D2H 2 * kv_dim * 4 bytes (the new K/V) + the
// statistics (decode: col_sums of num_heads * stride floats when asked, e.g. H2O, 4 * 32 * 2048
// = 256 KiB per layer at budget 2048 on Llama-3-8B), H2D the keep-lists when a head changed
// (4 bytes per kept slot); one stream sync per layer for the K/V copy, one more when a hook
// reads statistics, one when keep_slots validates its lists. counters() counts every copy and
// sync, so these costs show in tests and benchmarks.
//
// The mirror also makes device state recoverable: begin_pass checks that the host cache is the
// one the device holds (same object, position, lengths, last positions and last key rows) and
// otherwise uploads it (a copy forked for a policy, a cache compressed by
// apply_recorded_prefill, a new sequence in a reused object); it grows the device capacity by
// re-uploading when a head would overflow.
//
// Not supported on the GPU (clear usage errors): policies that replace attention (SubGen,
// weighted subgen_kcenter), tensor-parallel groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/runtime.h"
#include "workers/engine/backend.h"
#include "workers/engine/engine_base.h"
#include "workers/engine/mirror_sync.h"
#include "workers/engine/model.h"

namespace kvb::engine {

class CudaBackend final : public Backend {
 public:
  // Selects GPU `gpu` (cudaSetDevice) and uploads the weights once (converted per `dtype`).
  // Throws kvb::Error when the device is missing or memory runs out.
  CudaBackend(const Model& model, DType dtype, int gpu);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string device_description() const override { return device_name_; }
  // Max over forward passes of the device's used memory (cudaMemGetInfo total - free, sampled
  // at the end of each pass: the whole device, CUDA context and cuBLAS workspace included).
  size_t device_peak_bytes() const override { return peak_bytes_; }
  // Bytes of the device cache: slots x (2 x head_dim x 2 or 4 bytes + a 4-byte position). The
  // physical bytes are the device cache's allocation while it holds `cache` (fingerprint), else
  // the host mirror's capacity at the device's slot size (what binding it would allocate at
  // least).
  size_t kv_logical_bytes(const kernels::KvCache& cache) const override;
  size_t kv_physical_bytes(const kernels::KvCache& cache) const override;
  TransferCounters counters() const override { return counters_; }
  bool runs_replaced_attention() const override { return false; }

  DType dtype() const { return dtype_; }
  int gpu() const { return gpu_; }
  size_t weight_bytes() const { return weight_bytes_; }
  int64_t cache_uploads() const { return cache_uploads_; }
  kernels::KvCache download_device_cache() const;

  void begin_pass(std::span<const int32_t> tokens, const int32_t* positions,
                  kernels::KvCache& cache) override;
  void rmsnorm(Act out, Act in, int layer, Norm which, int row0, int rows) override;
  void linear(Act out, Act in, int layer, Mat which, int n) override;
  void reduce_add(Act x, Act y, int n) override;
  void swiglu(int n) override;
  void rope(Act a, int heads, int n) override;
  void rope_rows(Act a, const int32_t* positions, int rows) override;
  void download(Act a, size_t count, float* dst) override;
  void append_kv(int layer, int n, kernels::KvCache& cache) override;
  void roll_keys(int layer, kernels::KvCache& cache) override;
  void attention(int layer, int n, float scale, kernels::KvCache& cache, bool col_sums,
                 int last_w, int stride, policies::LayerStats* stats) override;
  double stats_to_host(policies::LayerStats* stats) override;
  void attend_replaced(policies::Policy& policy, policies::AttendArgs args,
                       const kernels::KvCache& cache, kernels::EvictionPlan* plan) override;
  void apply_plan(const kernels::EvictionPlan& plan, kernels::KvCache& cache) override;
  void end_layers(int n) override;
  void classify(int rows, std::vector<float>* logits) override;
  void end_pass(kernels::KvCache& cache) override;

 private:
  struct DeviceLayer;  // one layer's weights on the device
  struct Scratch;      // activations, sized for the largest n seen
  void upload_weights();
  void bind_cache(kernels::KvCache& cache, int n);
  float* act(Act a) const;
  // x (f32 [n, k]) times w ([m, k], dtype_) into y [n, m].
  void gemm(float* y, const float* x, const void* w, const float* bias, int n, int k, int m);
  // Counted stream-ordered copies and syncs (TransferCounters).
  void copy_d2h(void* dst, const void* src, size_t bytes);
  void copy_h2d(void* dst, const void* src, size_t bytes);
  void sync();

  const Model& model_;
  DType dtype_;
  int gpu_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceLayer> layers_;
  kernels::cuda::DeviceBuffer<float> embedding_, final_norm_, output_f32_;
  kernels::cuda::DeviceBuffer<__nv_bfloat16> output_bf16_;
  std::unique_ptr<Scratch> s_;
  std::unique_ptr<kernels::cuda::DeviceKvCache> dev_;
  int rolled_layer_ = -1;  // the layer whose next attention reads the rolled keys
  // What the device cache holds: the host cache it mirrors, as of the end of the last pass.
  CacheFingerprint bound_;
  // Host staging.
  std::vector<float> k_h_, v_h_, col_sums_, last_probs_;
  std::vector<int32_t> pos_h_, tokens_h_, slots_h_, counts_h_, keep_scratch_;
  int64_t cache_uploads_ = 0;
  size_t peak_bytes_ = 0, weight_bytes_ = 0;
  TransferCounters counters_;
};

}  // namespace kvb::engine
