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
#include "workers/engine/model.h"

namespace kvb::engine {

enum class LogitsMode {
  kNone,  // no classifier (e.g. prefilling context whose predictions are not needed)
  kLast,  // logits of the last token: [vocab]
  kAll,   // logits of every token: [n, vocab] (likelihood scoring, perplexity)
};

// Which policy hook runs after each layer's attention.
enum class PolicyHook {
  kNone,     // no hook (the policy does not see these tokens)
  kPrefill,  // Policy::on_prefill_layer with the statistics of prefill_request(n)
  kDecode,   // Policy::on_decode_layer (one token) with the statistics of decode_request()
};

// Statistics of one prompt prefill, recorded once so that several oneshot policies can compress
// copies of the same full cache without repeating the prefill (DESIGN.md "Scheduling": prefill
// sharing). The request is the union of the policies' prefill requests.
struct PrefillRecord {
  policies::StatsRequest request;  // what to record (set before the forward pass)
  int n_new = 0;
  int last_w = 0;                  // rows recorded (request.last_w clamped to n_new)
  std::vector<int> strides;                      // [layer]
  std::vector<std::vector<float>> col_sums;      // [layer][num_heads, stride]
  std::vector<std::vector<float>> last_probs;    // [layer][num_heads, last_w, stride]
  std::vector<std::vector<float>> pre_rope_keys; // [layer][n_new, num_kv_heads, head_dim]
};

// Whether a policy's prompt compression can be applied from a PrefillRecord: oneshot prefill on a
// cache of the model's own layout with the engine's own attention.
bool can_share_prefill(const policies::Policy& policy);

class Engine {
 public:
  // tp: the tensor-parallel group when `model` is this rank's shard (engine/tensor_parallel.h);
  // null (or a group of 1) for a whole model. With a group, forward() all-reduces the outputs of
  // the two row-parallel projections of every layer (attention output, MLP down), every rank of
  // the group must call forward() with the same tokens, and every rank gets the same logits.
  explicit Engine(const Model& model, kernels::Communicator* tp = nullptr);
  const Model& model() const { return model_; }
  kernels::Communicator* tp() const { return tp_; }
  const ModelConfig& config() const { return model_.config; }
  // Milliseconds spent inside policy hooks (scoring, selection, compaction) since construction:
  // the eviction overhead, measured apart from attention. Attention statistics are not included.
  double policy_ms() const { return policy_ms_; }

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

  // Applies `policy`'s oneshot compression to `cache`, a copy of the cache right after the
  // recorded prefill (no policy), layer by layer, exactly as a prefill with the policy would.
  void apply_recorded_prefill(policies::Policy& policy, kernels::KvCache& cache,
                              const PrefillRecord& record);

  // Prompt prefills executed (forward passes over more than one token, or a first token).
  int64_t prefills() const { return prefills_; }

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
