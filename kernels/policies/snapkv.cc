// `snapkv` (POLICIES.md; SnapKV, the baseline Ada-KV builds on) and the family skeleton of
// snapkv_family.h: per layer, after prefill, every KV head keeps its top (kv_budget - w) prefix
// tokens by pooled observation-window score plus the w window tokens. A prompt of at most
// kv_budget tokens is not compressed; decode never evicts.
#include <algorithm>
#include <cfloat>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/budget.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"
#include "kernels/policies/snapkv_family.h"

namespace kvb::policies {

SnapKvFamily::SnapKvFamily(const PolicyConfig& c) : Policy(c) {
  const int window = c.options.get_int("window", 32, 1, 1 << 20);
  window_ = kernels::cpu::snapkv_window(c.kv_budget, window);
  scoring_ = read_snapkv_score_options(c.options);
  head_budgets_.resize(c.shape.num_layers);
}

const std::vector<int32_t>& SnapKvFamily::head_budgets(int layer) const {
  KVB_CHECK(layer >= 0 && layer < static_cast<int>(head_budgets_.size()))
      << "layer " << layer << " outside [0, " << head_budgets_.size() << ")";
  return head_budgets_[layer];
}

size_t SnapKvFamily::state_bytes() const {
  size_t b = 0;
  for (const auto& layer : head_budgets_) b += layer.size() * sizeof(int32_t);
  return b;
}

// kvpress's ChunkKVPress over SnapKVPress: SnapKV's scores of the prefix with the window padded
// by their maximum over the layer + 1 (kvpress's pad), summed over the heads (f32, head order),
// and the best chunks kept whole in every head (chunk_keep_list).
void SnapKvFamily::keep_chunks(PolicyOps& ops, SlotRows& scores, const kernels::KvIndex& cache,
                               int w, std::vector<int32_t>& budgets, kernels::EvictionPlan& plan) {
  const int heads = cache.shape().num_kv_heads, layer = plan.layer();
  const int n = cache.length(layer, 0), prefix = n - w;
  std::vector<std::vector<float>> rows(heads);
  float top = -FLT_MAX;
  for (int h = 0; h < heads; ++h) {
    KVB_CHECK(cache.length(layer, h) == n)
        << "snapkv chunkkv: the heads of layer " << layer << " hold " << n << " and "
        << cache.length(layer, h) << " slots (its chunks are the same in every head)";
    rows[h] = ops.read_f32(scores, 0, h);
    KVB_CHECK(static_cast<int>(rows[h].size()) == prefix)
        << "snapkv chunkkv: a score row is not as long as the prefix";
    for (float x : rows[h]) top = std::max(top, x);
  }
  const float pad = top + 1.0f;
  std::vector<float> sum(n, 0.0f);
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < prefix; ++j) sum[j] += rows[h][j];
    for (int j = prefix; j < n; ++j) sum[j] += pad;
  }
  const std::vector<int32_t> slots = chunk_keep_list(sum, chunk_, kv_budget());
  const int kept_prefix =
      static_cast<int>(std::lower_bound(slots.begin(), slots.end(), prefix) - slots.begin());
  for (int h = 0; h < heads; ++h) {
    budgets[h] = kept_prefix;
    plan.keep(h, slots);
  }
  zeros_.assign(heads, 0);
  ops.resize(scores, 0, zeros_);  // the scratch holds nothing between layers
}

void SnapKvFamily::on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                                    kernels::EvictionPlan& plan) {
  KVB_CHECK(st.layer >= 0 && st.layer < static_cast<int>(head_budgets_.size()))
      << "layer " << st.layer << " outside the policy's " << head_budgets_.size() << " layers";
  const int heads = cache.shape().num_kv_heads;
  int prompt_len = 0;
  for (int h = 0; h < heads; ++h) prompt_len = std::max(prompt_len, cache.length(st.layer, h));
  // The layer's longest head over every rank of a tensor-parallel group (equal after a fresh
  // prefill; a cache compressed before may differ per head).
  if (config_.tp) prompt_len = kernels::all_max(*config_.tp, prompt_len);
  std::vector<int32_t>& budgets = head_budgets_[st.layer];
  budgets.assign(heads, 0);

  if (prompt_len <= kv_budget()) {
    // POLICIES.md: no compression when the prompt has at most kv_budget tokens ("Compression
    // threshold": strictly more than the budget compresses). Every head keeps its prefix.
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(st.layer, h);
      budgets[h] = len - std::min(window_, len);
    }
    return;
  }
  // The window is the block's last w queries: w = window() for a prompt (which is longer than
  // kv_budget >= window()); a shorter block on top of a cache gets what the engine had.
  const int w = st.last_w;
  KVB_CHECK(st.last_probs != nullptr && w >= 1 && w <= window_)
      << "snapkv family: prefill statistics carry last_w = " << w << ", expected 1.." << window_;
  PolicyOps& ops = ops_of(st);
  SlotRows& scores = rows_of(scores_, ops, SlotType::kF32, 1, heads);
  window_scores(ops, scores, 0, window_scratch_, st, cache, scoring_);
  if (chunk_ > 0 && prompt_len >= chunk_) {
    keep_chunks(ops, scores, cache, w, budgets, plan);
    return;
  }
  allocate(ops, scores, st.layer, prompt_len, w, cache, budgets.data());

  // Per-head top-B_h of the prefix (ties: the more recent slot), then the window slots.
  tops_.clear();
  for (int h = 0; h < heads; ++h) {
    const int len = cache.length(st.layer, h);
    const int prefix = scores.length(0, h);
    budgets[h] = std::clamp(budgets[h], 0, prefix);  // B_h capped by the head's prefix
    if (budgets[h] < prefix) {
      tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = prefix, .k = budgets[h]});
    }
  }
  if (!tops_.empty()) ops.keep_top(scores, 0, cache, tops_, {}, plan);
  zeros_.assign(heads, 0);
  ops.resize(scores, 0, zeros_);  // the scratch holds nothing between layers (forks copy it)
}

namespace {

// Uniform split: every head of every layer selects kv_budget - w prefix tokens.
class SnapKv final : public SnapKvFamily {
 public:
  explicit SnapKv(const PolicyConfig& c) : SnapKvFamily(c) {
    chunk_ = c.options.get_int("chunkkv", 0, 0, 1 << 30);
    KVB_USAGE_CHECK(chunk_ == 0 || !c.tp)
        << "policy snapkv: chunkkv ranks chunks by every head's scores, which tensor "
           "parallelism splits across ranks; run it without --gpus-per-worker";
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<SnapKv>(*this); }

 protected:
  void allocate(PolicyOps&, const SlotRows& s, int, int, int w, const kernels::KvIndex&,
                int32_t* budgets) override {
    for (int h = 0; h < s.heads(); ++h) budgets[h] = kv_budget() - w;
  }
};

}  // namespace

PolicyInfo snapkv_policy_info() {
  return {"snapkv",
          "SnapKV: per KV head, top prefix tokens by pooled observation-window attention + the "
          "window; prompt cache only (no decode eviction)",
          with_chunkkv(snapkv_score_params()),
          [](const PolicyConfig& c) { return std::make_unique<SnapKv>(c); }};
}

}  // namespace kvb::policies
