// `then:` (kvpress's ComposedPress of two token presses; POLICIES.md "kvpress's presses",
// kernels/policies/README.md "Composition"): the policy named first decides each layer's prompt
// at its own budget (first_compression_ratio: it keeps max(1, int(n x (1 - c))) of the n prompt
// tokens per head, kvpress's compute_n_kept), then the policy named by `then` scores that layer's
// survivors as a cache of their rows alone and keeps kv_budget of them. The composition decides
// the prompt only: decode appends (kvpress compresses in the prefill's forward hooks).
//
// The second policy must decide from the cache alone (Policy::decides_on_cache_rows: keydiff,
// cur, lagkv, qfilter) or from its window's attention (decides_on_window_attention: the SnapKV
// family, whose probabilities are recomputed over the survivors from the block's last queries,
// as kvpress's SnapKV recomputes them over a compressed cache): its scratch cache holds the
// survivors' rows and positions, in slot order, at the layer's index, and nothing else of the
// prompt's statistics (which describe every token). It decides with the host ops: on a device
// the layer's rows are read once per head (two copies and two syncs) and the first policy's keep
// lists once per head (one each); the last queries come to the host as the engine's
// last_queries.
#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/extra_policies.h"
#include "kernels/policies/policy.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class Composed final : public Policy {
 public:
  // own: the composition's config (its options: gqa, think, think_window, positions); first: the
  // first policy's config, and `widest` that policy at its widest budget (the model's context),
  // which it stays until begin_sequence knows the prompt; c: first_compression_ratio.
  Composed(const PolicyConfig& own, PolicyConfig first, double c, std::unique_ptr<Policy> widest,
           std::unique_ptr<Policy> then)
      : Policy(own),
        first_config_(std::move(first)),
        ratio_(c),
        first_(std::move(widest)),
        then_(std::move(then)) {}

  Composed(const Composed& o)
      : Policy(o),
        first_config_(o.first_config_),
        ratio_(o.ratio_),
        first_(o.first_->clone()),
        then_(o.then_->clone()),
        question_(o.question_),
        tail_(o.tail_),
        question_set_(o.question_set_) {}

  PrefillMode prefill_mode() const override { return first_->prefill_mode(); }
  void set_question_tokens(int question, int tail) override {
    question_ = question;
    tail_ = tail;
    question_set_ = true;
    first_->set_question_tokens(question, tail);
    then_->set_question_tokens(question, tail);
  }
  void begin_sequence(int prompt_len) override {
    // kvpress's compute_n_kept of the first press over the prompt's k_len tokens.
    const int budget = std::max(1, static_cast<int>(prompt_len * (1.0 - ratio_)));
    if (budget != first_->kv_budget()) {
      PolicyConfig c = first_config_;
      c.kv_budget = budget;
      first_ = make_policy(c);
      if (question_set_) first_->set_question_tokens(question_, tail_);
    }
    first_->begin_sequence(prompt_len);
    then_->begin_sequence(prompt_len);
  }
  bool decides_with_ops() const override { return first_->decides_with_ops(); }

  // The first policy's request at its budget: before begin_sequence its widest budget's, which
  // asks for at least what any budget asks (a window of min(w, budget / 2) grows with it), so a
  // bundle's shared prefill, recorded before the budget is known, holds what the hooks read
  // (apply_recorded_prefill hands each policy the rows of its own request). A second policy of
  // the SnapKV family reads no probabilities of the engine's: its window's are recomputed over
  // the survivors from the block's last queries.
  StatsRequest prefill_request(int n_new) const override {
    StatsRequest second = then_->prefill_request(n_new);
    if (then_->decides_on_window_attention()) {
      second.last_queries = std::max(second.last_queries, second.last_w);
      second.last_w = 0;
    }
    return merged(first_->prefill_request(n_new), second);
  }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    first_->on_prefill_layer(st, cache, plan);
    PolicyOps& ops = ops_of(st);
    const int layer = st.layer, heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
    std::vector<std::vector<int32_t>> kept(heads);
    int longest = 0;
    for (int h = 0; h < heads; ++h) {
      kept[h] = ops.read_keep_list(plan, h, cache.length(layer, h));
      longest = std::max(longest, static_cast<int>(kept[h].size()));
    }
    // The survivors as a host cache of the model's layers, only this one written (its storage
    // costs memory where written: kv_cache.h ZeroedAllocator).
    kernels::KvCache scratch({cache.shape().num_layers, heads, d}, longest);
    kernels::KvCache pulled;  // the layer's rows, where a device holds them
    const kernels::LayerKvView rows = host_layer(ops, cache, layer, &pulled);
    for (int h = 0; h < heads; ++h) {
      for (int32_t s : kept[h]) {
        scratch.append(layer, h, rows.key(h, s), rows.value(h, s), rows.position(h)[s]);
      }
    }
    // The second policy reads the scratch cache and the layer, on the host ops; nothing of the
    // prompt's statistics, which describe every prompt token (on a device they are device
    // memory). Its wrappers may read the output projection (critical), a host matrix on the CPU.
    LayerStats one;
    one.layer = layer;
    one.n_new = longest;
    one.num_heads = st.num_heads;
    one.rope = st.rope;
    one.block_end = st.block_end;
    if (!ops.on_device()) {
      one.wo = st.wo;
      one.wo_bf16 = st.wo_bf16;
      one.wo_dim = st.wo_dim;
    } else {
      KVB_USAGE_CHECK(!then_->prefill_request(longest).output_projection)
          << "then: " << then_->config().name << " with critical reads the output projection "
             "on the host, and on --device cuda it is device memory; drop then.critical or run "
             "the composition on the CPU";
    }
    one.ops = &cpu_policy_ops();
    if (then_->decides_on_window_attention()) window_probs(st, scratch, &one);
    kernels::EvictionPlan second;
    second.reset(layer, heads);
    then_->on_prefill_layer(one, scratch, second);
    KVB_CHECK(!second.on_device() && !second.prunes_channels())
        << "then: policy " << then_->config().name << " planned on a device or pruned channels";
    plan.reset(layer, heads);
    std::vector<int32_t> sub;
    for (int h = 0; h < heads; ++h) {
      const int n = static_cast<int>(kept[h].size());
      second.keep_list(h, n, &sub);
      if (n == cache.length(layer, h) && static_cast<int>(sub.size()) == n) continue;
      std::vector<int32_t> slots(sub.size());
      for (size_t i = 0; i < sub.size(); ++i) slots[i] = kept[h][sub[i]];
      plan.keep(h, std::move(slots));
    }
  }

  size_t state_bytes() const override { return first_->state_bytes() + then_->state_bytes(); }

 private:
  // The probabilities of the block's last w queries over the survivors (w: the second policy's
  // last_w, at most the queries recorded), each query seeing the survivors at or before its
  // position: the vocabulary's window_attention (policy_ops.h; q.k / sqrt(head_dim), kvpress's
  // SnapKV scale, softmax in f64) on the host ops, over the scratch cache.
  void window_probs(const LayerStats& st, const kernels::KvCache& scratch, LayerStats* one) {
    int longest = 0;
    for (int h = 0; h < scratch.shape().num_kv_heads; ++h) {
      longest = std::max(longest, scratch.length(st.layer, h));
    }
    const int w = std::min(then_->prefill_request(longest).last_w, st.n_queries);
    KVB_CHECK(st.last_queries != nullptr && w >= 1 &&
              st.num_heads % scratch.shape().num_kv_heads == 0)
        << "then: " << then_->config().name << " needs the block's last queries (engine gave "
        << st.n_queries << ")";
    PolicyOps& host = cpu_policy_ops();
    if (!probs_) probs_ = host.make_window_probs();
    host.window_attention(*probs_, scratch, st.layer, st, w);
    use_window(*probs_, one);
  }

 public:
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Composed>(*this); }

 private:
  PolicyConfig first_config_;
  double ratio_ = 0;
  std::unique_ptr<Policy> first_, then_;
  int question_ = 0, tail_ = 0;
  bool question_set_ = false;
  // window_probs' rows (scratch of one layer's decision; a copy starts without)
  std::unique_ptr<WindowProbs> probs_;
};

// Options of the composition itself (the Policy base reads them); `gqa` also goes to both
// policies, whose caches it shapes.
bool own_option(const std::string& key) {
  return key == "then" || key == "first_compression_ratio" || key == "think" ||
         key == "think_window" || key == "positions" || key == "gqa" || key.rfind("then.", 0) == 0;
}

}  // namespace

std::unique_ptr<Policy> make_composed(const PolicyInfo& info, const PolicyConfig& config) {
  const PolicyOptions& o = config.options;
  const std::string second = o.get_string("then", "");
  const PolicyInfo& then_info = require_policy(second);
  KVB_USAGE_CHECK(o.has("first_compression_ratio"))
      << "policy " << config.name << " with then: " << second
      << " needs first_compression_ratio: c, the fraction of the prompt " << config.name
      << " removes before " << second << " scores the rest (kvpress's compression_ratio of the "
      << "first press; kv_budget is what " << second << " keeps)";
  const double c = o.get_double("first_compression_ratio", 0, 0, 1);
  KVB_USAGE_CHECK(c < 1) << "policy " << config.name
                         << ": first_compression_ratio must be in [0, 1), got " << c;
  auto refuse_first = [&](bool bad, const std::string& why) {
    KVB_USAGE_CHECK(!bad) << "policy " << config.name << " " << why << ", so then: " << second
                          << " cannot follow it (then: composes two prompt decisions, as "
                          << "kvpress's ComposedPress); choose another first policy";
  };
  refuse_first(!info.budgeted, "keeps every token");
  refuse_first(!info.composes, "decides after passes of its own or replaces attention");
  KVB_USAGE_CHECK(then_info.budgeted)
      << "then: " << second << " keeps every token; name a policy that evicts (keydiff, cur, "
      << "lagkv, qfilter)";

  PolicyConfig own = config;
  PolicyConfig first = config;
  PolicyConfig then = config;
  own.options = PolicyOptions({}, "policy option");
  first.options = PolicyOptions({}, "policy option");
  then.options = PolicyOptions({}, "policy option");
  then.name = second;
  for (const auto& [key, value] : o.values()) {
    const std::string v = o.get_string(key, value);  // every key is read here (check_all_used)
    if (key.rfind("then.", 0) == 0) {
      then.options.set(key.substr(5), v);
    } else if (!own_option(key)) {
      first.options.set(key, v);
    } else if (key != "then" && key != "first_compression_ratio") {
      own.options.set(key, v);
      if (key == "gqa") {
        first.options.set(key, v);
        if (!then.options.has(key)) then.options.set(key, v);
      }
    }
  }
  // B's budget is kv_budget tokens of A's survivors, whatever fraction of the prompt the unit's
  // budget was given as: a wrapper or formula that reads the fraction (ChunkPress's runs,
  // PyramidKV's kvpress formula) takes kv_budget / its n, as for a token budget.
  then.budget_fraction = 0;
  // The first policy's widest budget: the model's context (every prompt fits it).
  first.budget_fraction = 1 - c;
  if (config.shape.max_seq_len > 0) first.kv_budget = config.shape.max_seq_len;
  std::unique_ptr<Policy> widest = make_policy(info, first);
  refuse_first(widest->prefill_mode() != PrefillMode::kOneshot,
               "streams the prompt token by token");
  refuse_first(widest->evicts_at_decode(), "evicts during decode");
  refuse_first(widest->replaces_attention(), "replaces attention");
  refuse_first(widest->rolling_positions(), "caches its keys before RoPE");
  refuse_first(widest->reconstructs_context(), "reconstructs the context");

  std::unique_ptr<Policy> after = make_policy(then_info, then);
  KVB_USAGE_CHECK((after->decides_on_cache_rows() || after->decides_on_window_attention()) &&
                  !after->evicts_at_decode())
      << "then: " << second << " cannot score " << config.name << "'s survivors: the second "
      << "policy must decide the prompt from the cache's rows alone (keydiff, cur, lagkv, qfilter; "
      << "without decode_interval or threshold_decode) or from its window's attention (snapkv, "
      << "pyramidkv, ada_snapkv, ada_pyramidkv), since the prompt's other statistics describe "
      << "every prompt token, not the survivors";
  KVB_USAGE_CHECK(after->gqa_expand() == widest->gqa_expand())
      << "then: " << second << " and " << config.name << " must share gqa";
  own.name = config.name;
  auto policy = std::make_unique<Composed>(own, first, c, std::move(widest), std::move(after));
  return policy;
}

}  // namespace kvb::policies
