// The transformer forward pass on the CPU (f32, OpenMP): prefill of many tokens with blocked
// matrix products, decode of one, over a per-sequence KvCache. Llama-family blocks:
// RMSNorm -> QKV (+bias) -> RoPE -> GQA causal attention -> output proj -> residual ->
// RMSNorm -> SwiGLU MLP -> residual; final RMSNorm and the (possibly tied) classifier.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kv_cache.h"
#include "workers/engine/model.h"

namespace kvb::engine {

enum class LogitsMode {
  kNone,  // no classifier (e.g. prefilling context whose predictions are not needed)
  kLast,  // logits of the last token: [vocab]
  kAll,   // logits of every token: [n, vocab] (likelihood scoring, perplexity)
};

class Engine {
 public:
  explicit Engine(const Model& model);
  const Model& model() const { return model_; }
  const ModelConfig& config() const { return model_.config; }

  // A fresh cache for this model, with room for `initial_capacity` tokens per head.
  kernels::KvCache new_cache(int initial_capacity = 0) const;

  // Runs `tokens` at positions cache.next_position() onwards, appending their K/V to the cache
  // and advancing its position. Writes logits per `mode` into *logits (resized).
  // Precondition: token ids in [0, vocab_size) (checked).
  void forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
               std::vector<float>* logits);

 private:
  const Model& model_;
  // Scratch, reused across calls: [n, dim], [n, q_dim], [n, kv_dim], [n, hidden_dim].
  std::vector<float> x_, xb_, q_, k_, v_, att_, proj_, gate_, up_;
  std::vector<int32_t> pos_;
};

}  // namespace kvb::engine
