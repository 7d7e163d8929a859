// The skeleton shared by `snapkv`, `pyramidkv`, `ada_snapkv` and `ada_pyramidkv` (POLICIES.md):
// after each layer's prefill, score the prefix by the observation window (window_scores, a
// composition of the ops vocabulary; options in snapkv_scores.h), let the member decide each KV
// head's prefix budget B_i, keep every head's top-B_i prefix tokens plus the w window tokens
// (keep_top). It decides through the ops table (policy_ops.h), so on a device the statistics,
// scores and keep lists stay there; only Ada-KV's per-head budgets come to the host. No decode
// eviction (each head grows by one per generated token).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops/policy_ops.h"
#include "kernels/policies/policy.h"
#include "kernels/policies/snapkv_scores.h"

namespace kvb::policies {

class SnapKvFamily : public Policy {
 public:
  // Reads window, pool_kernel, pooling, window_reduce, gqa_reduce from config.options.
  explicit SnapKvFamily(const PolicyConfig& config);

  // The effective observation window w = snapkv_window(kv_budget, window).
  int window() const { return window_; }
  StatsRequest prefill_request(int n_new) const override {
    (void)n_new;  // the engine clamps last_w to the block length
    return {.last_w = window_};
  }
  bool decides_with_ops() const override { return true; }
  bool decides_on_window_attention() const override { return true; }
  // Compresses the layer when its longest head holds more than kv_budget tokens (the prompt-cache
  // budget); otherwise keeps everything. Records the per-head budgets either way.
  void on_prefill_layer(const LayerStats& stats, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) final;
  size_t state_bytes() const override;

  // B_i per KV head of `layer` (cache_kv_heads() entries): the prefix tokens head i kept at the
  // layer's last prefill; right after it the head holds exactly B_i + w slots (without
  // compression: its whole prefix, len - min(w, len)). Empty before the layer's first prefill.
  const std::vector<int32_t>& head_budgets(int layer) const;

 protected:
  // Called only when compressing: budgets[h] = B_h for every KV head of `layer`, from the
  // layer's pooled prefix scores: row (0, h) of `scores` (made by `ops`, as long as head h's
  // prefix). prompt_len: the layer's longest head; w: the window in slots (1 <= w <=
  // window()). Values above a head's prefix length are capped by the caller.
  virtual void allocate(PolicyOps& ops, const SlotRows& scores, int layer, int prompt_len, int w,
                        const kernels::KvIndex& cache, int32_t* budgets) = 0;
  // `chunkkv: N` (snapkv only; kvpress ChunkKVPress over SnapKVPress): 0, or chunks of N slots
  // kept whole in every head instead of per-head tops (keep_chunks). A head then holds the kept
  // chunks' slots, B_i counting those of its prefix.
  int chunk_ = 0;

 private:
  void keep_chunks(PolicyOps& ops, SlotRows& scores, const kernels::KvIndex& cache, int w,
                   std::vector<int32_t>& budgets, kernels::EvictionPlan& plan);

  int window_ = 0;
  SnapKvScoreOptions scoring_;
  std::vector<std::vector<int32_t>> head_budgets_;  // [num_layers][cache_kv_heads]
  // One layer's pooled prefix scores, where the ops keep them; a scratch emptied after each
  // decision (not state: state_bytes counts the budgets).
  SlotRowsPtr scores_;
  WindowScratch window_scratch_;  // the scores' intermediate rows (scratch, like scores_)
  std::vector<KeepTop> tops_;
  std::vector<int32_t> zeros_;
};

}  // namespace kvb::policies
