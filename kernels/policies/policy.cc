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
}

const std::vector<ParamDoc>& common_params() {
  static const std::vector<ParamDoc> params = {
      {"gqa", "per_kv_head",
       "decide per KV head (scores: mean of its query heads), or expand K/V to every query head "
       "as paper-era code did (memory x group size)",
       {"per_kv_head", "expand"}},
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
  if (config.name != "full") {
    KVB_USAGE_CHECK(config.kv_budget > 0)
        << "policy " << config.name << ": --kv-budget must be a positive number of tokens per KV "
        << "head, got " << config.kv_budget;
    KVB_USAGE_CHECK(config.shape.max_seq_len <= 0 || config.kv_budget <= config.shape.max_seq_len)
        << "policy " << config.name << ": --kv-budget " << config.kv_budget
        << " exceeds the model's context of " << config.shape.max_seq_len
        << " tokens; use 1.." << config.shape.max_seq_len;
  }
  std::unique_ptr<Policy> policy = info.make(config);
  std::vector<ParamDoc> allowed = info.params;
  allowed.insert(allowed.end(), common_params().begin(), common_params().end());
  config.options.check_all_used("policy " + config.name, allowed);
  return policy;
}

}  // namespace kvb::policies
