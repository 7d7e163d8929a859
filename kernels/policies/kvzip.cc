// `kvzip` (kvpress KVzipPress; Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with
// Context Reconstruction"): a slot's importance is the attention it gets while the model repeats
// the context. After the prompt's prefill (which compresses nothing), the context (the prompt
// after its chat-template head) is fed again in chunks of chunk_size tokens, each after an
// instruction to repeat it and the template's tail (engine::reconstruct_context; the runner hands
// the tokens, Policy::set_replay_prompt). In each pass and layer, a chunk slot scores the largest
// probability any of the pass's queries (and any query head of the KV head's group) gives it,
// the softmax over the sinks, the chunk and the pass's own earlier tokens alone
// (PolicyOps::replay_attention_max); the pass's slots leave after its layer. Then the lowest
// scores across every layer and head go (layerwise: per layer), the first n_sink slots never, so
// heads and layers keep different shares of the budget, as kvpress's masks do.
#include <algorithm>
#include <numeric>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "kernels/policies/policies.h"

namespace kvb::policies {
namespace {

class KvZip final : public Policy {
 public:
  explicit KvZip(const PolicyConfig& c) : Policy(c) {
    n_sink_ = c.options.get_int("n_sink", 4, 1, 1 << 20);
    chunk_size_ = c.options.get_int("chunk_size", 2048, 1, 1 << 30);
    layerwise_ = c.options.get_bool("layerwise", false);
    KVB_USAGE_CHECK(!c.tp)
        << "policy kvzip: its budget spans every layer's heads, which tensor parallelism splits "
           "across ranks; run it without --gpus-per-worker";
    KVB_USAGE_CHECK(!c.shape.sliding_layers)
        << "policy kvzip on a model with sliding-window layers: its reconstruction passes would "
           "pass through their windows (kvpress refuses Gemma 3 too); choose another policy";
    KVB_USAGE_CHECK(!rerotates() && !prunes_key_channels())
        << "policy kvzip decides after its reconstruction passes, which positions: rerotate and "
           "think do not follow; drop that option";
  }

  bool reconstructs_context() const override { return true; }
  bool decides_with_ops() const override { return true; }
  void begin_sequence(int prompt_len) override {
    (void)prompt_len;
    replaying_ = false;
    ctx_len_ = 0;
    scores_.clear();
    keep_.clear();
  }
  void set_replay_prompt(ReplayPrompt prompt) override { prompt_ = std::move(prompt); }
  StatsRequest prefill_request(int n_new) const override {
    // A pass's queries, all of them; the prompt's own prefill needs nothing.
    return replaying_ ? StatsRequest{.last_queries = n_new} : StatsRequest{};
  }

  std::vector<ReplayPass> replay_passes(std::span<const int32_t> prompt) const override {
    const int n = static_cast<int>(prompt.size());
    std::vector<ReplayPass> passes;
    if (pruned_total(n) == 0) return passes;  // nothing leaves: no pass is worth its cost
    // kvpress KVzipPress.prepare: chunks of chunk_size context tokens; the first after "Repeat the
    // previous context exactly.", each later one after "... starting with" and the previous
    // chunk's last 8 tokens; then the template's tail and the chunk.
    const int prefix = std::min(prompt_.prefix, n);
    for (int start = prefix; start < n; start += chunk_size_) {
      ReplayPass p;
      p.first = start;
      p.count = std::min(chunk_size_, n - start);
      if (start == prefix) {
        p.tokens = prompt_.first;
      } else {
        p.tokens = prompt_.next;
        const int from = std::max(start - chunk_size_, start - 8);
        p.tokens.insert(p.tokens.end(), prompt.begin() + from, prompt.begin() + start);
      }
      p.tokens.insert(p.tokens.end(), prompt_.suffix.begin(), prompt_.suffix.end());
      p.tokens.insert(p.tokens.end(), prompt.begin() + start, prompt.begin() + start + p.count);
      passes.push_back(std::move(p));
    }
    return passes;
  }

  void begin_replay(const ReplayPass& pass) override {
    replaying_ = true;
    pass_first_ = pass.first;
    pass_count_ = pass.count;
  }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int heads = cache.shape().num_kv_heads;
    if (!replaying_) {  // the prompt's own prefill: every slot stays, scored 0 until a pass
      ctx_len_ = cache.length(st.layer, 0);
      if (scores_.empty()) scores_.assign(config_.shape.num_layers, {});
      scores_[st.layer].assign(static_cast<size_t>(heads) * ctx_len_, 0.0f);
      return;
    }
    KVB_CHECK(st.last_queries != nullptr && st.n_queries == st.n_new &&
              static_cast<int>(scores_.size()) == config_.shape.num_layers)
        << "kvzip: a reconstruction pass without its queries (" << st.n_queries << " of "
        << st.n_new << ")";
    PolicyOps& ops = ops_of(st);
    SlotRows& rows = rows_of(rows_.rows, ops, SlotType::kF32, 1, heads);
    const int sinks = std::min(n_sink_, pass_first_);  // kvpress: min(n_sink, start_idx)
    ops.replay_attention_max(rows, 0, cache, st.layer, st, sinks, pass_first_, pass_count_);
    for (int h = 0; h < heads; ++h) {
      const std::vector<float> row = ops.read_f32(rows, 0, h);
      std::copy(row.begin(), row.end(),
                scores_[st.layer].begin() + static_cast<size_t>(h) * ctx_len_ + pass_first_);
    }
    // The pass's slots leave: the layer holds the prompt again.
    prompt_slots_.resize(ctx_len_);
    std::iota(prompt_slots_.begin(), prompt_slots_.end(), 0);
    for (int h = 0; h < heads; ++h) plan.keep(h, prompt_slots_);
  }

  void end_replay() override {
    replaying_ = false;
    decide();
  }

  void on_replayed_layer(int layer, const kernels::KvIndex& cache,
                         kernels::EvictionPlan& plan) override {
    if (keep_.empty()) return;  // nothing left
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const std::vector<int32_t>& k = keep_[layer][h];
      if (static_cast<int>(k.size()) < cache.length(layer, h)) plan.keep(h, k);
    }
  }

  size_t state_bytes() const override {
    size_t b = 0;
    for (const auto& s : scores_) b += s.size() * sizeof(float);
    for (const auto& layer : keep_) {
      for (const auto& k : layer) b += k.size() * sizeof(int32_t);
    }
    return b;
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<KvZip>(*this); }

 private:
  // The slots that leave, over the whole model (layerwise: each layer's) for a prompt of n: with a
  // compression ratio c (kvpress's), int(numel x c) of numel = layers x heads x n (per layer:
  // heads x n); with a token budget B, what exceeds B per head (none when n <= B, POLICIES.md
  // "Compression threshold").
  int64_t pruned_total(int n) const {
    const int64_t heads = cache_kv_heads();
    const int64_t per_layer = heads * n;
    const int64_t layers = layerwise_ ? 1 : config_.shape.num_layers;
    if (config_.budget_fraction > 0) {
      return static_cast<int64_t>(static_cast<double>(layers * per_layer) *
                                  (1.0 - config_.budget_fraction));
    }
    return n <= kv_budget() ? 0 : layers * heads * (n - kv_budget());
  }

  // The keep lists from the scores: the sinks stay; of the rest, the lowest scores leave first
  // (equal scores: the older slot, then the lower layer, then the lower head).
  void decide() {
    keep_.clear();
    const int layers = config_.shape.num_layers, heads = cache_kv_heads(), n = ctx_len_;
    const int64_t pruned = pruned_total(n);
    if (pruned == 0 || n == 0) return;
    const int sinks = std::min(n_sink_, n);
    std::vector<std::vector<char>> gone(layers, std::vector<char>(static_cast<size_t>(heads) * n));
    using Entry = std::tuple<float, int, int, int>;  // score, slot, layer, head
    auto prune = [&](int l0, int l1, int64_t count) {
      std::vector<Entry> e;
      for (int l = l0; l < l1; ++l) {
        for (int h = 0; h < heads; ++h) {
          for (int s = sinks; s < n; ++s) {
            e.emplace_back(scores_[l][static_cast<size_t>(h) * n + s], s, l, h);
          }
        }
      }
      count = std::min<int64_t>(count, static_cast<int64_t>(e.size()));
      std::partial_sort(e.begin(), e.begin() + count, e.end());
      for (int64_t i = 0; i < count; ++i) {
        const auto& [score, s, l, h] = e[i];
        gone[l][static_cast<size_t>(h) * n + s] = 1;
      }
    };
    if (layerwise_) {
      for (int l = 0; l < layers; ++l) prune(l, l + 1, pruned);
    } else {
      prune(0, layers, pruned);
    }
    keep_.assign(layers, std::vector<std::vector<int32_t>>(heads));
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        for (int s = 0; s < n; ++s) {
          if (!gone[l][static_cast<size_t>(h) * n + s]) keep_[l][h].push_back(s);
        }
      }
    }
  }

  int n_sink_ = 4;
  int chunk_size_ = 2048;
  bool layerwise_ = false;
  // The runner's and generate's reconstruction prompt; a caller that hands none (the engine's
  // tests, which have no tokenizer) repeats each chunk without instruction or tail.
  ReplayPrompt prompt_;
  bool replaying_ = false;
  int pass_first_ = 0, pass_count_ = 0;
  int ctx_len_ = 0;
  std::vector<std::vector<float>> scores_;  // [layer][head x ctx_len]: the passes' maxima
  std::vector<std::vector<std::vector<int32_t>>> keep_;  // [layer][head], after end_replay
  ScratchRows rows_;
  std::vector<int32_t> prompt_slots_;
};

}  // namespace

PolicyInfo kvzip_policy_info() {
  PolicyInfo info{"kvzip",
          "KVzip (kvpress KVzipPress): the model repeats the context in extra passes; each slot "
          "scores the most attention a repeating query gives it, and the lowest scores across "
          "every layer and head leave (prefill: its passes and their scoring, 3.6x snapkv's at 4K on "
          "a CPU)",
          {
              {"n_sink", "4", "the first tokens, never evicted (kvpress's n_sink; at least 1)"},
              {"chunk_size", "2048", "context tokens repeated per pass (kvpress's chunk_size)"},
              {"layerwise", "false",
               "true: each layer keeps its own share (heads x kv_budget); false: the budget of "
               "the whole model goes to the best scores of any layer (kvpress's default)"},
          },
          [](const PolicyConfig& c) { return std::make_unique<KvZip>(c); }};
  info.composes = false;
  return info;
}

}  // namespace kvb::policies
