// The transformer forward pass written once (issue 13 "One block stack"), over a Backend
// (backend.h): Llama-family blocks RMSNorm -> QKV (+bias) -> RoPE (or rolling positions) ->
// GQA causal attention with the statistics a policy asked for (or the policy's replacement) ->
// the policy hook -> output projection -> residual -> RMSNorm -> SwiGLU MLP -> residual; final
// RMSNorm and the (possibly tied) classifier. Engine (forward.h) runs it on the CPU, CudaEngine
// (cuda_engine.h) on a GPU. Everything that depends on the cache index (lengths, positions,
// statistics strides, which hook runs, prefill records) is decided here, on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "workers/engine/backend.h"
#include "workers/engine/engine_base.h"
#include "workers/engine/model.h"

namespace kvb::engine {

// Whether a decode step of one sequence can run as a captured CUDA graph (Backend::begin_graph,
// kernels/cuda/graph.h): its host code must never wait for the device before the step ends, so
// its decisions may only depend on what the host knows (the index, the policy's own host state)
// and the ops it launches. `policy` may be null (no policy); `req` is the step's statistics
// request (forward_stats_request); `host_rows`: the cache keeps K/V rows on the host;
// `device_ops`: the backend's policy ops work on the device. Not capturable: a cache with host
// rows (every layer's new rows come down), a policy that replaces attention (SubGen's first
// compression reads keys back; a host attend() reads the queries), and a policy that decides on
// the host from statistics or pre-RoPE keys it asked for (they come down per layer).
bool decode_step_capturable(const policies::Policy* policy, const policies::StatsRequest& req,
                            bool host_rows, bool device_ops);

class StackEngine : public EngineBase {
 public:
  const Model& model() const override { return model_; }
  kernels::Communicator* tp() const override { return tp_; }
  // Milliseconds spent inside policy hooks (scoring, selection, compaction) and applying their
  // plans since construction: host wall time on the CPU; on a device the device time between
  // CUDA events around the same work (Backend::times_policy_on_device), the copies of the
  // statistics host-side hooks read included, so the figures compare.
  double policy_ms() const override { return policy_ms_; }
  int64_t prefills() const override { return prefills_; }
  bool continues_prefill() const override {
    return backend_->seeds_col_sums() && (tp_ == nullptr || tp_->size() == 1);
  }
  std::string device_description() const override { return backend_->device_description(); }
  size_t device_peak_bytes() const override { return backend_->device_peak_bytes(); }
  size_t kv_logical_bytes(const kernels::KvCache& cache) const override {
    return backend_->kv_logical_bytes(cache);
  }
  size_t kv_physical_bytes(const kernels::KvCache& cache) const override {
    return backend_->kv_physical_bytes(cache);
  }
  void trim_storage(kernels::KvCache& cache, int extra) override {
    backend_->trim_storage(cache, extra);
  }
  // Host<->device copies and stream syncs since construction (zero on the CPU).
  TransferCounters transfer_counters() const { return backend_->counters(); }

  kernels::KvCache new_cache(int initial_capacity = 0,
                             const policies::Policy* policy = nullptr) const override;
  void forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
               std::vector<float>* logits, policies::Policy* policy = nullptr,
               PolicyHook hook = PolicyHook::kNone, PrefillRecord* record = nullptr) override;
  // Host code on the cache index and the recorded statistics. Host rows: the hooks read `full`
  // and each layer of `cache` receives only the rows its plan keeps (KvCache::fill_layer), so a
  // unit neither copies nor touches the pages of the slots its policy drops. Device rows: a
  // copy of full whose plans go through the backend (compacted where they live).
  void apply_recorded_prefill(policies::Policy& policy, const kernels::KvCache& full, int extra,
                              const PrefillRecord& record, kernels::KvCache& cache) override;
  // One pass over the B sequences' tokens where the backend batches rows (Backend::batches_rows):
  // norms, projections and the MLP over [B, dim]; per sequence (select_rows), RoPE, its cache's
  // append and attention, and its policy's decode hook. Otherwise EngineBase's one-by-one loop.
  void decode_batch(std::span<const int32_t> tokens, std::span<kernels::KvCache* const> caches,
                    std::span<policies::Policy* const> policies, std::vector<float>* logits,
                    double* seq_policy_ms = nullptr) override;

 protected:
  // `model` and `tp` must outlive the engine; the backend is the engine's.
  StackEngine(const Model& model, std::unique_ptr<Backend> backend, kernels::Communicator* tp);
  Backend& backend() const { return *backend_; }

 private:
  // A layer's attention norm and Q/K/V projections (+ q/k norms) over n rows.
  void project_qkv(int layer, int n);
  // A layer's output projection, residual (post-norm), MLP and residual over n rows.
  void finish_layer(int layer, int n);
  // One layer's K/V append, attention (or the policy's replacement) and policy hook.
  void attend_layer(int layer, int n, kernels::KvCache& cache, policies::Policy* policy,
                    PolicyHook hook, const policies::StatsRequest& req, int last_w, float scale,
                    PrefillRecord* record);
  // A cache of the model's KV heads, or of its query heads (GQA expanded); else throws.
  void check_cache_heads(const kernels::KvCache& cache) const;
  // attend_layer's parts. Before attention: RoPE of the keys (when rope_keys and the policy
  // does not roll positions), the append, the layer's statistics header, and a policy's
  // before-attention hook (after which *hook is kNone).
  policies::LayerStats prepare_layer(int layer, int n, kernels::KvCache& cache,
                                     policies::Policy* policy, PolicyHook* hook,
                                     const policies::StatsRequest& req, bool rope_keys);
  // The statistics attention is asked for (none without a hook or a record) and their stride
  // (the longest head), also set in stats.
  struct StatsShape {
    bool col_sums = false;
    int last_w = 0;
    int stride = 0;
  };
  StatsShape stats_shape(int layer, const kernels::KvCache& cache, PolicyHook hook,
                         const policies::StatsRequest& req, int last_w, bool record,
                         policies::LayerStats* stats) const;
  // After attention: the statistics to the host where the policy reads them there, the record,
  // and the policy's prefill or decode hook.
  void after_attention(int layer, kernels::KvCache& cache, policies::Policy* policy,
                       PolicyHook hook, const policies::StatsRequest& req, PrefillRecord* record,
                       policies::LayerStats stats);
  // decode_batch: whether layer `layer` attends for all sequences at once (the backend batches
  // attention, a global layer, caches of one shape, and no sequence whose policy rolls
  // positions, replaces attention or reads pre-RoPE keys); then attend_layer_batch runs it.
  bool attention_batches(int layer, std::span<kernels::KvCache* const> caches,
                         std::span<policies::Policy* const> policies) const;
  void attend_layer_batch(int layer, std::span<kernels::KvCache* const> caches,
                          std::span<policies::Policy* const> policies, float scale,
                          double* seq_policy_ms);
  // Runs `hook(plan)` to fill the layer's plan and applies it (timed as policy_ms). A template,
  // not std::function: it runs per layer per decode step, and a capturing lambda would allocate.
  template <typename Hook>
  void run_hook(int layer, kernels::KvCache& cache, Hook&& hook);
  // Backend::begin_policy_span, remembering the sequence of a decode batch it belongs to.
  void begin_span();
  // A sliding-window layer (ModelConfig::window): RoPE with the layer's base, append, windowed
  // attention, then the cache keeps the last window - 1 rows per head. No policy hook, no
  // statistics, true positions (POLICIES.md "Sliding-window layers").
  void sliding_layer(int layer, int n, float scale, kernels::KvCache& cache);

  const Model& model_;
  std::unique_ptr<Backend> backend_;
  kernels::Communicator* tp_ = nullptr;
  double policy_ms_ = 0;
  int64_t prefills_ = 0;
  std::vector<int32_t> pos_, qpos_;    // [n] positions of the pass; [n, num_heads] rolling
  std::vector<float> pre_rope_k_;      // [n, kv_dim] when a policy asked for pre-RoPE keys
  std::vector<float> last_q_;          // [q, num_heads, head_dim]: StatsRequest::last_queries
  const float* pre_rope_dev_ = nullptr;  // the same on a device (Backend::stash), or null
  std::vector<float> slice_;           // apply_recorded_prefill: last-w rows of one policy
  kernels::EvictionPlan plan_;         // the current hook's decision
  std::vector<int32_t> window_keep_;   // sliding_layer: the slots a head keeps
  std::vector<PolicyHook> hooks_;             // decode_batch: per sequence
  std::vector<policies::StatsRequest> reqs_;  // decode_batch: per sequence
  int span_seq_ = -1;              // decode_batch: the sequence whose hooks run, else -1
  std::vector<int> span_owner_;    // decode_batch: the sequence of each device policy span
  std::vector<double> span_ms_;
  std::vector<policies::LayerStats> batch_stats_;  // attend_layer_batch: per sequence
  std::vector<PolicyHook> batch_hooks_;
  std::vector<BatchAttention> batch_items_;
};

}  // namespace kvb::engine
