// `cur` (kvpress CURPress; CurDKV, Sengupta et al. 2025, arXiv 2509.15038; POLICIES.md
// "kvpress's presses"): after prefill each KV head keeps the kv_budget tokens with the highest
// approximate leverage scores of its cached keys and values. Per head: k2 and v2 are the
// squared L2 norms of each slot's key (as cached, post-RoPE) and value; with `local_window: w`
// (default 16) each is divided by its sum over aligned windows of w slots; the score is k2, v2,
// (k2 + v2) / 2 or k2 * v2 (`leverage`, default kv_product), divided by its sum over the head;
// the first `sinks` slots (default 4) score 1.0, above every other (protected). kvpress's
// `use_random_leverage` (a random projection first) is not offered: its draw is torch's.
// No decode eviction.
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class Cur final : public CacheScorer {
 public:
  explicit Cur(const PolicyConfig& c) : CacheScorer(c) {
    const PolicyOptions& o = c.options;
    sinks_ = static_cast<int>(o.get_int("sinks", 4, 0, 1 << 20));
    window_ = static_cast<int>(o.get_int("local_window", 16, 0, 1 << 20));
    leverage_ = o.get_string("leverage", "kv_product", {"key", "value", "kv_avg", "kv_product"});
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<Cur>(*this); }

 protected:
  // One slot: a sink, or the whole of its normalised row (a key or value of zeros: 0).
  float lone_score() const override { return 1.0f; }
  SlotRows& score(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache) override {
    const int heads = cache.shape().num_kv_heads;
    // Scratch: layer 0 the score, layer 1 the values' norms (nothing is kept).
    SlotRows& rows = rows_of(rows_.rows, ops, SlotType::kF32, 2, heads);
    const bool keys = leverage_ != "value";
    const bool values = leverage_ != "key";
    if (keys) leverage_of(ops, rows, 0, cache, st.layer, CacheRows::kKeys);
    if (values) leverage_of(ops, rows, keys ? 1 : 0, cache, st.layer, CacheRows::kValues);
    if (leverage_ == "kv_product") ops.combine(rows, 0, rows, 1, Combine::kMul);
    if (leverage_ == "kv_avg") {
      ops.combine(rows, 0, rows, 1, Combine::kAdd);
      first_.assign(heads, 0);
      ops.scale(rows, 0, first_, 0.5f);  // exactly / 2
    }
    ops.normalize_chunks(rows, 0, 0);
    ops.fill_prefix(rows, 0, sinks_, 1.0f);
    return rows;
  }

 private:
  // Row (layer, h) = the squared norms of the head's keys or values, window-normalised.
  void leverage_of(PolicyOps& ops, SlotRows& rows, int layer, const kernels::KvIndex& cache,
                   int cache_layer, CacheRows which) const {
    ops.cache_norms(rows, layer, cache, cache_layer, which, /*squared=*/true);
    if (window_ > 0) ops.normalize_chunks(rows, layer, window_);
  }

  int sinks_ = 4;
  int window_ = 16;
  std::string leverage_;
  ScratchRows rows_;
  std::vector<int32_t> first_;
};

}  // namespace

PolicyInfo cur_policy_info() {
  return {"cur",
          "keep the kv_budget tokens with the highest approximate leverage of their keys and "
          "values, after `sinks` protected tokens (CURPress, CurDKV)",
          with_wrappers({{"sinks", "4", "first tokens always kept (score 1.0)", {}},
                         {"local_window",
                          "16",
                          "squared norms divided by their sum over windows of this many "
                          "tokens (0: off)",
                          {}},
                         {"leverage",
                          "kv_product",
                          "score: key, value, their mean or their product",
                          {"key", "value", "kv_avg", "kv_product"}}}),
          [](const PolicyConfig& c) { return std::make_unique<Cur>(c); }};
}

}  // namespace kvb::policies
