// PolicyOptions parsing and make_policy's validation (POLICIES.md "Common terms").
#include "kernels/policies/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/error.h"
#include "kernels/policies/extra_policies.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

Policy::Policy(const PolicyConfig& config) : config_(config) {
  gqa_expand_ =
      config.options.get_string("gqa", "per_kv_head", {"per_kv_head", "expand"}) == "expand";
  think_ratio_ = config.options.get_double("think", 0, 0, 1);
  KVB_USAGE_CHECK(think_ratio_ < 1) << "policy " << config.name
                                    << ": think must be a fraction of the key channels in [0, 1), "
                                    << "got " << think_ratio_;
  think_window_ = config.options.get_int("think_window", 32, 1, 1 << 20);
  // `rolling` is streaming_llm's own (make_policy refuses it elsewhere).
  rerotate_ =
      config.options.get_string("positions", "true", {"true", "rolling", "rerotate"}) == "rerotate";
}

StatsRequest Policy::prefill_stats(int n_new) const {
  StatsRequest r = prefill_request(n_new);
  if (prunes_key_channels()) r.last_queries = std::max(r.last_queries, think_window_);
  return r;
}

bool budgeted(const std::string& name) {
  const PolicyInfo* info = find_policy(name);
  return info == nullptr || info->budgeted;
}

const std::vector<ParamDoc>& common_params() {
  static const std::vector<ParamDoc> params = {
      {"gqa", "per_kv_head",
       "decide per KV head (scores: mean of its query heads), or expand K/V to every query head "
       "as paper-era code did (memory x group size)",
       {"per_kv_head", "expand"}},
      {"think", "0",
       "ThinK after this policy (kvpress ComposedPress([press, ThinKPress(r)])): zero the "
       "int(head_dim x r) key channels of each head that score lowest (query energy x key "
       "energy) after the prompt; memory counts the channels as not stored; 0: off"},
      {"think_window", "32", "ThinK's window: the prompt's last queries its query energy reads"},
      {"positions", "true",
       "true: slots keep their positions; rerotate: after the prompt each head's kept keys are "
       "re-rotated to positions 0..n-1 and the sequence continues at the longest head's n "
       "(kvpress KeyRerotationPress)",
       {"true", "rerotate"}},
      {"then", "",
       "composition (kvpress ComposedPress([this, then])): after this policy's prompt decision "
       "at first_compression_ratio, policy `then` (keydiff, cur, lagkv, qfilter, or the SnapKV "
       "family: snapkv, pyramidkv, ada_snapkv, ada_pyramidkv) scores each layer's survivors, in "
       "position order, as a cache of their rows (the SnapKV family: its window's attention "
       "recomputed over them) and keeps kv_budget of them; the prompt only (decode appends); "
       "this policy must not evict at decode; empty: off",
       {}},
      {"first_compression_ratio", "",
       "with then: the fraction of the prompt this policy removes first (it keeps max(1, int(n x "
       "(1 - c))) per head, kvpress's compression_ratio of the first press); required with then",
       {}},
      {"then.<option>", "",
       "with then: an option of the second policy (then.lag=64 gives lagkv lag=64)", {}},
  };
  return params;
}

void prefill_layer(Policy& policy, const LayerStats& stats, kernels::KvCache& cache) {
  kernels::EvictionPlan plan;
  plan.reset(stats.layer, cache.shape().num_kv_heads);
  LayerStats st = stats;
  if (!st.ops) st.ops = &cpu_policy_ops();
  policy.on_prefill_layer(st, cache, plan);
  cache.apply(plan);
}

void decode_layer(Policy& policy, const LayerStats& stats, kernels::KvCache& cache) {
  kernels::EvictionPlan plan;
  plan.reset(stats.layer, cache.shape().num_kv_heads);
  LayerStats st = stats;
  if (!st.ops) st.ops = &cpu_policy_ops();
  policy.on_decode_layer(st, cache, plan);
  cache.apply(plan);
}

void attend_layer(Policy& policy, const AttendArgs& args, kernels::KvCache& cache) {
  kernels::EvictionPlan plan;
  plan.reset(args.layer, cache.shape().num_kv_heads);
  policy.attend(args, cache, plan);
  cache.apply(plan);
}

const PolicyInfo* find_policy(const std::string& name) {
  for (const auto& p : policy_registry()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

const PolicyInfo& require_policy(const std::string& name) {
  const PolicyInfo* info = find_policy(name);
  if (!info) {
    std::vector<std::string> names;
    for (const auto& p : policy_registry()) names.push_back(p.name);
    KVB_USAGE_FAIL() << "unknown policy '" << name << "'; known policies: " << join(names)
                     << " (kvbench ls policies describes them)";
  }
  return *info;
}

std::unique_ptr<Policy> make_policy(const PolicyConfig& config) {
  return make_policy(require_policy(config.name), config);
}

std::unique_ptr<Policy> make_policy(const PolicyInfo& info, const PolicyConfig& config) {
  KVB_CHECK(config.name == info.name) << "make_policy: a config for '" << config.name
                                      << "' given the entry of '" << info.name << "'";
  if (info.budgeted) {
    KVB_USAGE_CHECK(config.kv_budget > 0)
        << "policy " << config.name << ": --kv-budget must be a positive number of tokens per KV "
        << "head, got " << config.kv_budget;
    KVB_USAGE_CHECK(config.shape.max_seq_len <= 0 || config.kv_budget <= config.shape.max_seq_len)
        << "policy " << config.name << ": --kv-budget " << config.kv_budget
        << " exceeds the model's context of " << config.shape.max_seq_len
        << " tokens; use 1.." << config.shape.max_seq_len;
  }
  bool composition_keys = config.options.has("first_compression_ratio");
  for (const auto& [key, value] : config.options.values()) {
    composition_keys |= key.rfind("then.", 0) == 0;
  }
  KVB_USAGE_CHECK(config.options.has("then") || !composition_keys)
      << "policy " << config.name << ": first_compression_ratio and then.<option> belong to a "
      << "composition; give then: POLICY too (kvbench ls policies, option then)";
  std::unique_ptr<Policy> policy =
      config.options.has("then") ? make_composed(info, config) : info.make(config);
  KVB_USAGE_CHECK(config.options.get_string("positions", "true", {"true", "rolling", "rerotate"}) !=
                      "rolling" ||
                  policy->rolling_positions())
      << "policy " << config.name << ": positions: rolling is streaming_llm's option; other "
      << "policies take positions: true or rerotate";
  KVB_USAGE_CHECK(!policy->rerotates() || info.budgeted)
      << "policy " << config.name << " keeps every token: positions: rerotate has nothing to move";
  KVB_USAGE_CHECK(!policy->rerotates() || !config.shape.sliding_layers)
      << "policy " << config.name << ": positions: rerotate on a model with sliding-window layers: "
      << "their windows keep the tokens' own positions, which the re-rotated layers' next tokens "
      << "would precede; run the policy with positions: true";
  if (policy->prunes_key_channels() || policy->rerotates()) {
    const char* what = policy->prunes_key_channels() ? "think (ThinK's key channels after the "
                                                       "prompt)"
                                                     : "positions: rerotate (the kept keys "
                                                       "re-rotated after the prompt)";
    KVB_USAGE_CHECK(config.name != "full")
        << "policy full is the reference and takes no think; policy think is full's tokens with "
        << "ThinK's key channels (key_channel_compression_ratio)";
    const char* why = policy->rolling_positions()      ? "caches its keys before RoPE"
                      : policy->replaces_attention()   ? "replaces attention"
                      : policy->prefill_mode() == PrefillMode::kStreaming
                          ? "streams the prompt token by token"
                          : nullptr;
    KVB_USAGE_CHECK(why == nullptr)
        << "policy " << config.name << " " << why << ", so " << what
        << " cannot follow it; drop that option or choose another policy";
  }
  std::vector<ParamDoc> allowed = info.params;
  allowed.insert(allowed.end(), common_params().begin(), common_params().end());
  config.options.check_all_used("policy " + config.name, allowed);
  return policy;
}

}  // namespace kvb::policies
