// The transformer forward pass written once (issue 13 "One block stack"), over a Backend
// (backend.h): Llama-family blocks RMSNorm -> QKV (+bias) -> RoPE (or rolling positions) ->
// GQA causal attention with the statistics a policy asked for (or the policy's replacement) ->
// the policy hook -> output projection -> residual -> RMSNorm -> SwiGLU MLP -> residual; final
// RMSNorm and the (possibly tied) classifier. Engine runs it over CpuBackend on the CPU and over
// CudaBackend (cuda_engine.h) on a GPU. Everything that depends on the cache index (lengths, positions,
// statistics strides, which hook runs, prefill records) is decided here, on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "workers/engine/backend.h"
#include "workers/engine/engine_types.h"
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

// The engine: the block stack over a Backend, the one engine class (issue 32 "one engine name").
// What generation, the runner and the sweep workers call; the backend decides where the maths
// runs: CpuBackend (the f32 reference, bf16 weights on request; cpu_backend.h) or CudaBackend
// (one GPU; cuda_backend.h, reached through cuda_engine.h). Every forward takes the host
// `kernels::KvCache` of a sequence: on the CPU it is the cache; on a GPU it is the sequence's
// index, which owns its K/V rows on the device.
class Engine {
 public:
  // The CPU engine. tp: the tensor-parallel group when `model` is this rank's shard
  // (engine/tensor_parallel.h); null (or a group of 1) for a whole model. With a group,
  // forward() all-reduces the outputs of the two row-parallel projections of every layer
  // (attention output, MLP down), every rank of the group must call forward() with the same
  // tokens, and every rank gets the same logits. dtype kBf16: the linear layers' weights as bf16
  // (CpuBackend); kF32 is the reference.
  // kv_rows: the CPU cache's row type (KvRows; the dtype's by default).
  explicit Engine(const Model& model, kernels::Communicator* tp = nullptr,
                  DType dtype = DType::kF32, KvRows kv_rows = KvRows::kDtypeDefault);
  // The block stack over any backend (cuda_engine.h's cuda_backend). `model` and `tp` must
  // outlive the engine; the backend is the engine's.
  Engine(const Model& model, std::unique_ptr<Backend> backend, kernels::Communicator* tp = nullptr);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return model_; }
  const ModelConfig& config() const { return model_.config; }
  // The tensor-parallel group (null on one device).
  kernels::Communicator* tp() const { return tp_; }
  // The backend (where the maths runs): its device-specific knobs are reached through it
  // (cuda_engine.h's cuda_of).
  Backend& backend() const { return *backend_; }
  // Milliseconds spent inside policy hooks (scoring, selection, compaction) and applying their
  // plans since construction: the eviction overhead, measured apart from attention. Host wall
  // time on the CPU; on a device the device time between CUDA events around the same work
  // (Backend::on_device), the copies of the statistics host-side hooks read
  // included, so the figures compare.
  double policy_ms() const { return policy_ms_; }
  // Prompt prefills executed (forward passes over more than one token, or a first token).
  int64_t prefills() const { return prefills_; }
  // Whether forward() takes a PrefillRecord with `continues` set (the CPU backend; not under
  // tensor parallelism).
  bool continues_prefill() const {
    return backend_->seeds_col_sums() && (tp_ == nullptr || tp_->size() == 1);
  }
  // "cpu", or the GPU's name ("NVIDIA H100 80GB HBM3") for the run's provenance.
  std::string device_description() const { return backend_->device_description(); }
  // Device memory high-water mark in bytes (0 on the CPU: measurements.device_peak_bytes NULL).
  size_t device_peak_bytes() const { return backend_->device_peak_bytes(); }
  // K/V memory of `cache` as this engine stores it (measurements.kv_bytes_*): logical = retained
  // slots x bytes per slot, physical = what is allocated. On the CPU the cache itself (f32); on
  // a GPU the cache's device rows (bf16 halves the K/V bytes; their capacity may differ from the
  // index's).
  // The key channels of `cache` a plan zeroed (POLICIES.md `think`), in the backend's bytes:
  // left out of kv_logical_bytes.
  size_t kv_pruned_channel_bytes(const kernels::KvCache& cache) const {
    return backend_->kv_bytes(cache).pruned_channels;
  }
  size_t kv_logical_bytes(const kernels::KvCache& cache) const {
    return backend_->kv_bytes(cache).logical;
  }
  size_t kv_physical_bytes(const kernels::KvCache& cache) const {
    return backend_->kv_bytes(cache).physical;
  }
  // Frees the storage `cache` holds beyond its longest head + `extra` slots per head, keeping
  // every row, position and length (the runner, after a unit's prompt: its decode needs no
  // more). Results do not change; kv_physical_bytes may fall. A no-op on the CPU, whose spare
  // capacity is address space that no slot has touched (KvCache's storage is calloc'd); a GPU
  // copies the device rows into an allocation of that size (a prompt-sized device cache per
  // unit would otherwise stay allocated while a bundle's units decode together).
  void trim_storage(kernels::KvCache& cache, int extra) { backend_->trim_storage(cache, extra); }
  // Host<->device copies and stream syncs since construction (zero on the CPU).
  TransferCounters transfer_counters() const { return backend_->counters(); }

  // A fresh cache for this model, with room for `initial_capacity` tokens per head.
  // With a policy that expands GQA, the cache has one "KV head" per query head.
  kernels::KvCache new_cache(int initial_capacity = 0,
                             const policies::Policy* policy = nullptr) const;
  // Runs `tokens` at positions cache.next_position() onwards, appending their K/V to the cache
  // and advancing its position. Writes logits per `mode` into *logits (resized).
  // Precondition: token ids in [0, vocab_size) (checked).
  // With a policy, `hook` selects which of its hooks runs after each layer's attention.
  void forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
               std::vector<float>* logits, policies::Policy* policy = nullptr,
               PolicyHook hook = PolicyHook::kNone, PrefillRecord* record = nullptr);

  // Context reconstruction (Policy::reconstructs_context, KVzip), after the prompt's prefill into
  // `cache`: each of the policy's passes forward()ed on top of the prompt with the prefill hook
  // (which scores its chunk and drops its slots), the next position moved back to the prompt's
  // end after each, then every global layer's plan of Policy::on_replayed_layer applied (timed
  // as the policy's). The passes' forward work is the unit's prefill work.
  void reconstruct_context(policies::Policy& policy, kernels::KvCache& cache,
                           std::span<const int32_t> prompt);

  // A check forward() calls while it is set: check(layer, layers) at the start of every pass
  // (layer 0, before anything is appended or counted) and, in a pass of more than one token,
  // before each later layer. It may throw to abandon a long pass (the runner's unit time limit
  // during a prompt's prefill, workers/unit_run.cc), which then leaves `cache` and a
  // PrefillRecord partly written: discard them. It reads, it never changes what a pass
  // computes. Not called by decode_batch or apply_recorded_prefill. On a GPU it runs on the
  // host, which may have queued earlier layers' work without waiting for it. Empty: none (the
  // default).
  using LayerCheck = std::function<void(int layer, int layers)>;
  void set_layer_check(LayerCheck check) { layer_check_ = std::move(check); }
  const LayerCheck& layer_check() const { return layer_check_; }

  // Sets `cache` to `full` (the cache right after the recorded prefill, no policy) with room for
  // `extra` more slots per head, as a copy of full and reserve_extra(extra) would, compressed by
  // `policy`'s oneshot rule layer by layer, exactly as a prefill with the policy would. Host code
  // on the cache index and the recorded statistics. Host rows: the hooks read `full` and each
  // layer of `cache` receives only the rows its plan keeps (KvCache::fill_layer), so a unit
  // neither copies nor touches the pages of the slots its policy drops. Device rows: a copy of
  // full whose plans go through the backend (compacted where they live).
  void apply_recorded_prefill(policies::Policy& policy, const kernels::KvCache& full, int extra,
                              const PrefillRecord& record, kernels::KvCache& cache);
  // One decode step of B independent sequences (issue 16 "batched decode"): tokens[b] runs at
  // caches[b]->next_position() under policies[b] (null: none) with the decode hook; *logits gets
  // [B, vocab], row b the last-token logits of sequence b. Each sequence's logits, cache and
  // policy state are bit-identical to forward() of its token alone. Where the backend batches
  // rows (Backend::batches_rows): norms, projections and the MLP over [B, dim]; per sequence
  // (select_rows), RoPE, its cache's append and attention, and its policy's decode hook.
  // Otherwise the sequences run one after another. With seq_policy_ms ([B]), each sequence's
  // time inside its policy hooks (policy_ms()'s share) is added to its entry.
  void decode_batch(std::span<const int32_t> tokens, std::span<kernels::KvCache* const> caches,
                    std::span<policies::Policy* const> policies, std::vector<float>* logits,
                    double* seq_policy_ms = nullptr);

 private:
  // Calls the layer check, if any, before `layer` of a pass.
  void check_layer(int layer) const {
    if (layer_check_) layer_check_(layer, config().num_layers);
  }
  // decode_batch without row batching: forward() of each sequence's token in turn.
  void decode_each(std::span<const int32_t> tokens, std::span<kernels::KvCache* const> caches,
                   std::span<policies::Policy* const> policies, std::vector<float>* logits,
                   double* seq_policy_ms);
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
  // `positions: rerotate` (Policy::rerotates): layer l's kept keys re-rotated after its prompt
  // plan (Backend::rerotate_keys; the caller times it), and after the prompt the next
  // position moved to the longest head's length (across the tensor-parallel group).
  void rerotate_layer(int l, kernels::KvCache& cache);
  void continue_after_rerotation(kernels::KvCache& cache);
  // The cache's next position moved by `delta`, and the backend's mirror of it.
  void move_position(kernels::KvCache& cache, int delta);
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
  std::vector<float> pre_rope_q_;      // [n, num_heads, head_dim]: StatsRequest::pre_rope_queries
  const float* pre_rope_q_dev_ = nullptr;  // the same on a device (Backend::stash), or null
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
  LayerCheck layer_check_;
};

}  // namespace kvb::engine
