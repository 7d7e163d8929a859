// The transformer forward pass on one GPU (DESIGN.md "Backends and builds"): the CPU Engine's
// block stack (forward.cc) built from the kernels/cuda twins. Only in builds with CUDA
// (KVB_WITH_CUDA). Compiled, not yet run on a GPU: tests/cuda/test_cuda_engine.cc is the check.
//
// Precision (`--dtype`): f32 keeps f32 weights and f32 GEMMs (cuBLAS pedantic, no TF32), an f32
// KV cache; bf16 stores the weights in bf16, rounds each GEMM's activations to bf16 and
// accumulates in f32 (cublasGemmEx), and keeps a bf16 KV cache. Norms, RoPE, softmax, residuals
// and logits are f32 in both. The embedding table stays f32 (rows are gathered, not multiplied).
//
// KV cache: a kernels::cuda::DeviceKvCache, one flat buffer per layer with per-head offsets,
// capacities and lengths; the attention reads it directly.
//
// Policies: the host mirror. Policies run UNCHANGED on a host kernels::KvCache (the `cache`
// argument of forward) that the engine keeps equal to the device cache:
//  - after each layer's QKV, the block's n new K/V rows (post-RoPE; pre-RoPE for rolling
//    positions; bf16-rounded in bf16 mode, so mirror == device) are copied to the host and
//    appended to the mirror exactly as the CPU engine appends them;
//  - with a hook, the statistics it asked for (col_sums [num_heads, stride], last_probs
//    [num_heads, last_w, stride], pre-RoPE keys [n, kv_dim]) are copied to the host;
//  - the hook edits the mirror (keep_slots); the engine diffs each head's positions before and
//    after (slots stay in position order, so kept slots are a merge) and applies the same
//    keep-lists to the device cache with one DeviceKvCache::keep_slots per changed layer.
// Host traffic per decode step and layer: D2H 2 * kv_dim * 4 bytes (the new K/V) + the
// statistics (decode: col_sums of num_heads * stride floats when asked, e.g. H2O, 4 * 32 * 2048
// = 256 KiB per layer at budget 2048 on Llama-3-8B), H2D the keep-lists when a head changed
// (4 bytes per kept slot); one stream sync per layer when a hook runs (the policy must see the
// statistics), plus one when keep_slots validates its lists. Without a policy (full) there is
// no sync inside the step but the K/V copy (the mirror still needs it). This is policy_ms's
// share: the time of the copies of statistics, the hook and the device compaction.
// Device-native policy paths (select/score twins deciding on the GPU, no mirror) are future work.
//
// The mirror also makes device state recoverable: forward() checks that the host cache is the
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
#include "workers/engine/engine_base.h"
#include "workers/engine/forward.h"
#include "workers/engine/mirror_sync.h"

namespace kvb::engine {

class CudaEngine : public EngineBase {
 public:
  // Selects GPU `gpu` (cudaSetDevice) and uploads the weights once (converted per `dtype`).
  // Throws kvb::Error when the device is missing or memory runs out.
  CudaEngine(const Model& model, DType dtype, int gpu = 0);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const Model& model() const override { return model_; }
  double policy_ms() const override { return policy_ms_ + host_.policy_ms(); }
  int64_t prefills() const override { return prefills_; }
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
  DType dtype() const { return dtype_; }
  int gpu() const { return gpu_; }
  // Bytes of the uploaded weights (both copies where bf16 keeps an f32 embedding).
  size_t weight_bytes() const { return weight_bytes_; }
  // Host<->device bytes moved for the mirror and statistics since construction.
  size_t mirror_bytes() const { return mirror_bytes_; }
  // Full uploads of a host cache to the device (a switch of sequence or a capacity growth).
  int64_t cache_uploads() const { return cache_uploads_; }
  // The device cache as a host KvCache (synchronous; tests compare it with the mirror). Empty
  // shape before the first forward().
  kernels::KvCache download_device_cache() const;

  kernels::KvCache new_cache(int initial_capacity = 0,
                             const policies::Policy* policy = nullptr) const override;
  void forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
               std::vector<float>* logits, policies::Policy* policy = nullptr,
               PolicyHook hook = PolicyHook::kNone, PrefillRecord* record = nullptr) override;
  // Runs on the host mirror (the CPU engine's code); the next forward() re-uploads the cache.
  void apply_recorded_prefill(policies::Policy& policy, kernels::KvCache& cache,
                              const PrefillRecord& record) override;

 private:
  struct DeviceLayer;  // one layer's weights on the device
  struct Scratch;      // activations, sized for the largest n seen
  void upload_weights();
  void bind_cache(kernels::KvCache& cache, int n);
  // x (f32 [n, k]) times w ([m, k], dtype_) into y [n, m].
  void gemm(float* y, const float* x, const void* w, const float* bias, int n, int k, int m);
  void attend_layer(int layer, int n, kernels::KvCache& cache, policies::Policy* policy,
                    PolicyHook hook, const policies::StatsRequest& req, int last_w, float scale,
                    PrefillRecord* record);
  // Appends the block's K/V (device k_, v_) to the mirror, as the CPU engine does.
  void mirror_append(int layer, int n, kernels::KvCache& cache);
  // Runs `hook_fn` on the mirror and applies its keep-lists to the device cache.
  template <typename F>
  void run_hook(int layer, kernels::KvCache& cache, F&& hook_fn);

  const Model& model_;
  DType dtype_;
  int gpu_ = 0;
  std::string device_name_;
  Engine host_;  // apply_recorded_prefill on the mirror
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceLayer> layers_;
  kernels::cuda::DeviceBuffer<float> embedding_, final_norm_, output_f32_;
  kernels::cuda::DeviceBuffer<__nv_bfloat16> output_bf16_;
  std::unique_ptr<Scratch> s_;
  std::unique_ptr<kernels::cuda::DeviceKvCache> dev_;
  // What the device cache holds: the host cache it mirrors, as of the end of the last pass.
  CacheFingerprint bound_;
  // Host staging.
  std::vector<float> k_h_, v_h_, pre_rope_k_, col_sums_, last_probs_;
  std::vector<int32_t> pos_h_, tokens_h_, slots_h_, counts_h_;
  LayerPositions before_;
  double policy_ms_ = 0;
  int64_t prefills_ = 0, cache_uploads_ = 0;
  size_t peak_bytes_ = 0, weight_bytes_ = 0, mirror_bytes_ = 0;
};

}  // namespace kvb::engine
