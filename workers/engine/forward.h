// The transformer forward pass on the CPU (f32, OpenMP): prefill of many tokens with blocked
// matrix products, decode of one, over a per-sequence KvCache. Llama-family blocks:
// RMSNorm -> QKV (+bias) -> RoPE -> GQA causal attention -> output proj -> residual ->
// RMSNorm -> SwiGLU MLP -> residual; final RMSNorm and the (possibly tied) classifier.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/comm.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "workers/engine/engine_base.h"
#include "workers/engine/model.h"

namespace kvb::engine {

class Engine : public EngineBase {
 public:
  // tp: the tensor-parallel group when `model` is this rank's shard (engine/tensor_parallel.h);
  // null (or a group of 1) for a whole model. With a group, forward() all-reduces the outputs of
  // the two row-parallel projections of every layer (attention output, MLP down), every rank of
  // the group must call forward() with the same tokens, and every rank gets the same logits.
  explicit Engine(const Model& model, kernels::Communicator* tp = nullptr);
  const Model& model() const override { return model_; }
  kernels::Communicator* tp() const override { return tp_; }
  std::string device_description() const override { return "cpu"; }
  // Milliseconds spent inside policy hooks (scoring, selection, compaction) since construction:
  // the eviction overhead, measured apart from attention. Attention statistics are not included.
  double policy_ms() const override { return policy_ms_; }

  // A fresh cache for this model, with room for `initial_capacity` tokens per head.
  // With a policy that expands GQA, the cache has one "KV head" per query head.
  kernels::KvCache new_cache(int initial_capacity = 0,
                             const policies::Policy* policy = nullptr) const override;

  // Runs `tokens` at positions cache.next_position() onwards, appending their K/V to the cache
  // and advancing its position. Writes logits per `mode` into *logits (resized).
  // Precondition: token ids in [0, vocab_size) (checked).
  // With a policy, `hook` selects which of its hooks runs after each layer's attention.
  void forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
               std::vector<float>* logits, policies::Policy* policy = nullptr,
               PolicyHook hook = PolicyHook::kNone, PrefillRecord* record = nullptr) override;

  // Applies `policy`'s oneshot compression to `cache`, a copy of the cache right after the
  // recorded prefill (no policy), layer by layer, exactly as a prefill with the policy would.
  void apply_recorded_prefill(policies::Policy& policy, kernels::KvCache& cache,
                              const PrefillRecord& record) override;

  // Prompt prefills executed (forward passes over more than one token, or a first token).
  int64_t prefills() const override { return prefills_; }

 private:
  // One layer's K/V append, attention (or the policy's replacement) and policy hook.
  void attend_layer(int layer, int n, kernels::KvCache& cache, policies::Policy* policy,
                    PolicyHook hook, const policies::StatsRequest& req, int last_w, float scale,
                    PrefillRecord* record);

  const Model& model_;
  kernels::Communicator* tp_ = nullptr;
  double policy_ms_ = 0;
  int64_t prefills_ = 0;
  std::vector<float> slice_;  // apply_recorded_prefill: last-w rows of one policy
  // Scratch, reused across calls: [n, dim], [n, q_dim], [n, kv_dim], [n, hidden_dim].
  std::vector<float> x_, xb_, q_, k_, v_, att_, proj_, gate_, up_;
  std::vector<int32_t> pos_;
  std::vector<float> col_sums_, last_probs_, pre_rope_k_;  // policy statistics
  std::vector<float> rolled_keys_;                          // rolling positions: rotated keys
  std::vector<int32_t> rolled_pos_;
};

}  // namespace kvb::engine
