// `prompt_heavy`: the worked example of kernels/policies/README.md, a complete policy in one file
// kept outside kvbench's tree (build it in with -DKVBENCH_EXTRA_POLICIES=<this folder>).
// Per KV head the cache holds the `recent` newest tokens plus the `heavy` prompt tokens with the
// most attention accumulated over the prompt (H2O's prefill score, POLICIES.md "h2o"). Unlike
// h2o, decode adds nothing to the scores: the prompt's ranking is frozen, a generated token
// scores 0 and goes as soon as it leaves the recent window (the older first), and decode asks the
// engine for no attention statistics at all. It is made of the ops table's accumulate and
// keep_top only (kernels/ops/policy_ops.h), so it runs on the CPU and on `--device cuda`.
#include <memory>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/budget.h"
#include "kernels/policies/policy.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {
namespace {

class PromptHeavy final : public Policy {
 public:
  // Options are read here, with their defaults; make_policy then rejects any key not read.
  explicit PromptHeavy(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    split_ = kernels::cpu::split_heavy_recent(c.kv_budget,
                                              o.get_double("heavy_fraction", 0.5, 0.0, 1.0));
    gqa_ = o.get_string("gqa_reduce", "mean", {"mean", "max"}) == "max" ? GqaReduce::kMax
                                                                        : GqaReduce::kMean;
    KVB_USAGE_CHECK(split_.recent >= 1)
        << "policy prompt_heavy: kv_budget " << c.kv_budget
        << " with heavy_fraction=1 leaves no recent window, so each new token would be evicted "
        << "at once (it scores 0); use heavy_fraction < 1";
  }

  // The prompt's column sums (attention summed over its queries); nothing at decode.
  StatsRequest prefill_request(int) const override { return {.col_sums = true}; }
  StatsRequest decode_request() const override { return {}; }
  // The hooks decide through LayerStats::ops: on a GPU the statistics, the scores and the keep
  // lists stay on the device.
  bool decides_with_ops() const override { return true; }

  // After a layer's prompt block: scores += the block's GQA-reduced column sums (a new slot
  // starts at 0; a block on top of a compressed cache adds to the survivors' scores), then every
  // head over budget keeps its last `recent` slots and the top `heavy` of the others.
  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    PolicyOps& ops = ops_of(st);
    SlotRows& score = scores(ops, st.layer, cache);
    const int group = st.num_heads / cache.shape().num_kv_heads;  // query heads per cache head
    ops.resize_and_accumulate(score, st.layer, lens_, st.col_sums,
                              static_cast<size_t>(group) * st.stride, st.stride, group, gqa_);
    evict(ops, score, st.layer, cache, plan);
  }

  // After a decode step: the new token's slot gets score 0, then a head over budget (one slot
  // over, after the append) loses the lowest-scored slot outside the recent window.
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    PolicyOps& ops = ops_of(st);
    SlotRows& score = scores(ops, st.layer, cache);
    for (size_t h = 0; h < lens_.size(); ++h) {  // the state follows the cache
      KVB_ASSERT(score.length(st.layer, static_cast<int>(h)) == lens_[h] - 1);
    }
    ops.resize(score, st.layer, lens_);
    evict(ops, score, st.layer, cache, plan);
  }

  size_t state_bytes() const override { return scores_.bytes(); }
  // A fork after a shared prefill: SlotRowsPtr copies the rows where they live.
  std::unique_ptr<Policy> clone() const override { return std::make_unique<PromptHeavy>(*this); }

 private:
  // The score rows, one f32 row per (layer, cache head), made by the ops of the first engine that
  // runs this policy; and `layer`'s head lengths into lens_.
  SlotRows& scores(PolicyOps& ops, int layer, const kernels::KvIndex& cache) {
    const int heads = cache.shape().num_kv_heads;
    lens_.resize(heads);
    for (int h = 0; h < heads; ++h) lens_[h] = cache.length(layer, h);
    return rows_of(scores_, ops, SlotType::kF32, config().shape.num_layers, heads);
  }

  // Heads holding more than kv_budget keep the top (kv_budget - recent) of their slots before
  // the recent window, by score (ties: the later slot stays), and the window; keep_top compacts
  // the score rows with the same lists, so row entry i stays slot i's score.
  void evict(PolicyOps& ops, SlotRows& score, int layer, const kernels::KvIndex& cache,
             kernels::EvictionPlan& plan) {
    tops_.clear();
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(layer, h);
      if (len <= kv_budget()) continue;           // POLICIES.md: compress only above the budget
      const int prefix = len - split_.recent;     // >= 1: len > kv_budget >= recent
      const int k = kv_budget() - split_.recent;  // the heavy share
      tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = prefix, .k = k});
    }
    SlotRows* state[] = {&score};
    if (!tops_.empty()) ops.keep_top(score, layer, cache, tops_, state, plan);
  }

  kernels::cpu::HeavyRecentSplit split_;
  GqaReduce gqa_ = GqaReduce::kMean;
  SlotRowsPtr scores_;         // per slot: attention accumulated over the prompt, where ops keep it
  std::vector<int32_t> lens_;  // scratch: the layer's head lengths
  std::vector<KeepTop> tops_;  // scratch: this hook's decisions
};

}  // namespace

// The registry function: named after the file (prompt_heavy.cc -> prompt_heavy_policy_info), in
// namespace kvb::policies; CMake lists it after the built-in policies.
PolicyInfo prompt_heavy_policy_info() {
  return {
      "prompt_heavy",
      "heavy hitters by attention accumulated over the prompt (frozen at decode) + a recent "
      "window; decode needs no attention statistics",
      {{"heavy_fraction",
        "0.5",
        "share of the budget for the prompt's heavy hitters (floor); the rest is the recent "
        "window (at least 1 token)",
        {}},
       {"gqa_reduce", "mean", "how a KV head's score combines its query heads", {"mean", "max"}}},
      [](const PolicyConfig& c) { return std::make_unique<PromptHeavy>(c); }};
}

}  // namespace kvb::policies
