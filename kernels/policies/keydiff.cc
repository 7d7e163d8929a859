// `keydiff` (kvpress KeyDiffPress; Park et al. 2025, "KeyDiff: Key similarity-based KV cache
// eviction for long-context LLM inference"; POLICIES.md "kvpress's presses"): after prefill
// each KV head keeps the kv_budget tokens whose keys are least similar to the head's mean key
// direction (the anchor: the mean of the unit-normalised keys), i.e. the highest negated cosine
// similarity. Keys as cached (post-RoPE), as kvpress scores them. No decode eviction (kvpress
// compresses the prompt only; the paper's block-wise variant is kvpress's BlockPress).
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class KeyDiff final : public CacheScorer {
 public:
  explicit KeyDiff(const PolicyConfig& c) : CacheScorer(c, /*chunks=*/true) {}

  std::unique_ptr<Policy> clone() const override { return std::make_unique<KeyDiff>(*this); }

 protected:
  // One key's cosine with its own direction is 1 (up to rounding: kvpress's f32 may land an ulp
  // off).
  float lone_score() const override { return -1.0f; }
  SlotRows& score(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache) override {
    const int heads = cache.shape().num_kv_heads;
    // This layer's scores: scratch, nothing is kept after the decision.
    SlotRows& score = rows_of(score_.rows, ops, SlotType::kF32, 1, heads);
    ops.cosine_to_mean(score, 0, cache, st.layer, CacheRows::kKeys, chunk());
    first_.assign(heads, 0);
    ops.scale(score, 0, first_, -1.0f);  // least similar first
    return score;
  }

 private:
  ScratchRows score_;
  std::vector<int32_t> first_;
};

}  // namespace

PolicyInfo keydiff_policy_info() {
  return {"keydiff",
          "keep the kv_budget tokens whose keys differ most from the head's mean key direction "
          "(KeyDiffPress)",
          with_wrappers({}), [](const PolicyConfig& c) { return std::make_unique<KeyDiff>(c); }};
}

}  // namespace kvb::policies
