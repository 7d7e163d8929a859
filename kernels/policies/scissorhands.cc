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
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {
namespace {

constexpr int kMaxHistory = 64;  // one uint64_t of bits per slot

class Scissorhands final : public Policy {
 public:
  bool evicts_at_decode() const override { return true; }
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
  }

  PrefillMode prefill_mode() const override {
    return streaming_ ? PrefillMode::kStreaming : PrefillMode::kOneshot;
  }
  // The last w queries' probabilities (the engine clamps w to the block; decode: the one query).
  StatsRequest prefill_request(int) const override { return {.last_w = history_}; }
  StatsRequest decode_request() const override { return {.last_w = 1}; }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    update(st, cache, plan);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
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

  // Records the bits of this block's last queries (PolicyOps::history_bits: a head with no
  // earlier slot starts fresh, as the policy may serve several sequences), then compresses each
  // over-budget head.
  void update(const LayerStats& st, const kernels::KvIndex& cache, kernels::EvictionPlan& plan) {
    const LayerRule& rule = rules_[st.layer];
    const int heads = cache.shape().num_kv_heads;
    PolicyOps& ops = ops_of(st);
    SlotRows& bits = rows_of(bits_, ops, SlotType::kU64, config().shape.num_layers, heads);
    for (int h = 0; h < heads; ++h) {
      const int before = cache.length(st.layer, h) - st.n_new;  // slots cached before this block
      KVB_ASSERT(before == 0 || bits.length(st.layer, h) == before);
    }
    ops.history_bits(bits, st, cache, history_, inv_position_);
    // Drops `drop` tokens at a time until a head is within its budget. The ranking (counter,
    // then age) of the tokens outside the recent window does not change between rounds, so the
    // rounds equal one selection of drop * ceil((len - B) / drop) tokens: keep the candidates
    // with the smallest counters (score = -counter; ties keep the higher index, so equal
    // counters drop the older token) and the recent window (counter 0).
    tops_.clear();
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(st.layer, h);
      if (len <= rule.budget) continue;
      const int rounds = (len - rule.budget + rule.drop - 1) / rule.drop;
      const int candidates = len - std::min(rule.recent, len);
      const int dropped = std::min(rounds * rule.drop, candidates);
      tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = candidates,
                       .k = candidates - dropped});
    }
    if (tops_.empty()) return;
    SlotRows& score = rows_of(counters_, ops, SlotType::kF32, 1, heads);
    negated_popcount(ops, bits, st.layer, score, 0);
    SlotRows* state[] = {&bits};
    ops.keep_top(score, 0, cache, tops_, state, plan);
  }

  int history_ = 32;
  bool inv_position_ = false;
  bool streaming_ = false;
  std::vector<LayerRule> rules_;  // [num_layers]
  SlotRowsPtr bits_;      // per slot: bit k = "below threshold" at the k-th last query
  SlotRowsPtr counters_;  // one layer's -counter per slot (scratch)
  std::vector<KeepTop> tops_;
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
