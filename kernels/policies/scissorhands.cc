// `scissorhands`: persistence of importance (seed 002, Alg. 1-2; POLICIES.md "scissorhands").
// Each retained token keeps one bit per query of the last `history` queries: was its (GQA-mean)
// probability below the threshold. When a head holds more than its budget B, counter = number of
// such bits, the `recent` newest tokens are protected (the paper's `I[:-r]` is a typo for
// `I[-r:]`), and the `drop` tokens with the largest counters go (ties: the older goes).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/budget.h"
#include "kernels/cpu/select.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/slot_state.h"

namespace kvb::policies {
namespace {

constexpr int kMaxHistory = 64;  // one uint64_t of bits per slot

class Scissorhands final : public Policy {
 public:
  explicit Scissorhands(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    history_ = o.get_int("history", 32, 1, kMaxHistory);
    const int recent = o.get_int("recent", -1, 0, c.kv_budget);  // -1: per-layer default
    const int drop = o.get_int("drop", -1, 1, c.kv_budget);
    inv_position_ =
        o.get_string("threshold", "inv_cache", {"inv_cache", "inv_position"}) == "inv_position";
    streaming_ = o.get_string("prefill", "oneshot", {"oneshot", "streaming"}) == "streaming";
    const bool linear = o.get_string("layer_budget", "uniform", {"uniform", "linear_increase"}) ==
                        "linear_increase";
    // Without a model shape (options validated before a model is loaded) check one layer.
    const int layers = std::max(1, c.shape.num_layers);
    for (int l = 0; l < layers; ++l) {
      LayerRule r;
      r.budget = linear ? linear_budget(c.kv_budget, l, layers) : c.kv_budget;
      KVB_USAGE_CHECK(r.budget >= 2)
          << "policy scissorhands: layer " << l << " gets a budget of " << r.budget
          << " (kv_budget " << c.kv_budget
          << ", layer_budget=" << (linear ? "linear_increase" : "uniform")
          << "); every layer needs >= 2 so that drop >= 1";
      const kernels::cpu::ScissorhandsSplit def = kernels::cpu::scissorhands_split(r.budget);
      r.recent = recent >= 0 ? recent : def.recent;
      r.drop = drop >= 1 ? drop : def.drop;
      // With r + m <= B an over-budget head always has m droppable tokens outside the window.
      KVB_USAGE_CHECK(r.recent + r.drop <= r.budget)
          << "policy scissorhands: recent=" << r.recent << " + drop=" << r.drop << " exceed layer "
          << l << "'s budget " << r.budget;
      rules_.push_back(r);
    }
    bits_ = SlotState<uint64_t>(layers, cache_kv_heads());
  }

  PrefillMode prefill_mode() const override {
    return streaming_ ? PrefillMode::kStreaming : PrefillMode::kOneshot;
  }
  // The last w queries' probabilities (the engine clamps w to the block; decode: the one query).
  StatsRequest prefill_request(int) const override { return {.last_w = history_}; }
  StatsRequest decode_request() const override { return {.last_w = 1}; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvCache& cache,
                        kernels::EvictionPlan& plan) override {
    update(st, cache, plan);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvCache& cache,
                       kernels::EvictionPlan& plan) override {
    update(st, cache, plan);
  }

  size_t state_bytes() const override { return bits_.bytes(); }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Scissorhands>(*this); }

 private:
  struct LayerRule {
    int budget = 0;  // B of this layer
    int recent = 0;  // r
    int drop = 0;    // m
  };

  // linear_increase: layer l of L gets B * (0.5 + l / (L-1)), i.e. B (L-1+2l) / (2(L-1)), from
  // 0.5 B to 1.5 B. Rounding: layers below the middle round down, layers above it round up, the
  // middle layer (odd L) is exactly B. Layers l and L-1-l sum to exactly 2B before rounding, so
  // floor + ceil keeps the total at L*B (the average is exactly B) and the budgets non-decreasing.
  static int linear_budget(int b, int l, int layers) {
    if (layers == 1) return b;
    const int64_t num = static_cast<int64_t>(b) * (layers - 1 + 2 * l);
    const int64_t den = 2 * static_cast<int64_t>(layers - 1);
    if (2 * l < layers - 1) return static_cast<int>(num / den);
    if (2 * l > layers - 1) return static_cast<int>((num + den - 1) / den);
    return b;
  }

  // Records the bits of this block's last queries, then compresses each over-budget head.
  void update(const LayerStats& st, const kernels::KvCache& cache, kernels::EvictionPlan& plan) {
    const LayerRule& rule = rules_[st.layer];
    const int heads = cache.shape().num_kv_heads;
    const int group = st.num_heads / heads;
    const uint64_t window = history_ == 64 ? ~uint64_t{0} : (uint64_t{1} << history_) - 1;
    const kernels::LayerKvView view = cache.layer(st.layer);
    std::vector<float> p;
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(st.layer, h);
      const int before = len - st.n_new;  // slots cached before this block
      std::vector<uint64_t>& bits = bits_.at(st.layer, h);
      if (before == 0) bits.clear();  // a fresh cache (the policy may serve several sequences)
      KVB_ASSERT(static_cast<int>(bits.size()) == before);
      bits.resize(len, 0);  // new tokens: "not below" for the queries before they existed
      // Queries of the block older than the recorded ones only shift bits out of the window.
      const int unrecorded = st.n_new - st.last_w;
      for (auto& b : bits) b = unrecorded >= history_ ? 0 : (b << unrecorded) & window;
      p.resize(len);
      for (int j = 0; j < st.last_w; ++j) {
        const int i = unrecorded + j;        // query index in the block
        const int visible = before + i + 1;  // keys it attended over, itself included
        const float* row =
            st.last_probs + (static_cast<size_t>(h) * group * st.last_w + j) * st.stride;
        reduce_gqa(row, static_cast<size_t>(st.last_w) * st.stride, group, visible,
                   GqaReduce::kMean, p.data());
        const int32_t pos = view.position(h)[before + i];
        const float threshold = 1.0f / static_cast<float>(inv_position_ ? pos + 1 : visible);
        for (int s = 0; s < len; ++s) {
          const uint64_t below = s < visible && p[s] < threshold ? 1 : 0;
          bits[s] = ((bits[s] << 1) | below) & window;
        }
      }
      if (len <= rule.budget) continue;
      compress(st.layer, h, rule, cache, plan);
    }
  }

  // Drops `drop` tokens at a time until the head is within its budget. The ranking (counter,
  // then age) of the tokens outside the recent window does not change between rounds, so the
  // rounds equal one selection of drop * ceil((len - B) / drop) tokens.
  void compress(int layer, int h, const LayerRule& rule, const kernels::KvCache& cache,
                kernels::EvictionPlan& plan) {
    std::vector<uint64_t>& bits = bits_.at(layer, h);
    const int len = cache.length(layer, h);
    const int rounds = (len - rule.budget + rule.drop - 1) / rule.drop;
    const int candidates = len - std::min(rule.recent, len);
    const int dropped = std::min(rounds * rule.drop, candidates);
    // Keep the candidates with the smallest counters: score = -counter; select_topk keeps the
    // higher score and, on ties, the higher index, so equal counters drop the older token.
    std::vector<float> score(candidates);
    for (int s = 0; s < candidates; ++s) score[s] = -static_cast<float>(std::popcount(bits[s]));
    std::vector<int32_t> keep(len);
    const int got =
        kernels::cpu::select_topk(score.data(), candidates, candidates - dropped, keep.data());
    keep.resize(got);
    for (int s = candidates; s < len; ++s) keep.push_back(s);  // the recent window (counter 0)
    compact(bits, keep);
    plan.keep(h, std::move(keep));
  }

  int history_ = 32;
  bool inv_position_ = false;
  bool streaming_ = false;
  std::vector<LayerRule> rules_;  // [num_layers]
  SlotState<uint64_t> bits_;      // per slot: bit k = "below threshold" at the k-th last query
};

}  // namespace

PolicyInfo scissorhands_policy_info() {
  return {
      "scissorhands",
      "persistence of importance: drop the tokens most often below the attention threshold",
      {{"history", "32", "history window w: the last w queries vote (1..64)", {}},
       {"recent", "min(32, B/4)", "recent window r protected from dropping (B: layer budget)", {}},
       {"drop", "B/2", "tokens dropped per compression m (B: layer budget)", {}},
       {"threshold",
        "inv_cache",
        "below-threshold test: 1 / keys the query attended over, or the paper's 1 / t",
        {"inv_cache", "inv_position"}},
       {"prefill",
        "oneshot",
        "bits of the last w prompt queries then compress, or stream the prompt",
        {"oneshot", "streaming"}},
       {"layer_budget",
        "uniform",
        "same budget per layer, or 0.5x..1.5x of kv_budget from first to last layer (mean kept)",
        {"uniform", "linear_increase"}}},
      [](const PolicyConfig& c) { return std::make_unique<Scissorhands>(c); }};
}

}  // namespace kvb::policies
