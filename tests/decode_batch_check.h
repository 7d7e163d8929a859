// The decode-batch law's driver, shared by the CPU test (tests/model/test_decode_batch.cc) and
// the GPU one (tests/cuda/test_cuda_decode_batch.cc): B sequences (no policy, every registered
// policy, and the variant flags that change the code path), prompts of different lengths, step
// together through decode_batch while a twin of each decodes alone with forward(); sequences
// leave the batch at different steps. `compare(b, t, row, alone)` judges each batched logits
// row against the alone run; the caches of both runs come back for the final checks.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "registry_options.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"

namespace kvb::testing_batch {

struct Variant {
  std::string policy;  // "" = no policy
  std::map<std::string, std::string> options;
};

// sliding: the model has sliding-window layers, which kvzip refuses (its passes would pass through
// their windows).
inline std::vector<Variant> variants(bool sliding = false) {
  std::vector<Variant> v = {{"", {}}};
  for (const auto& p : policies::policy_registry()) {
    if (sliding && p.name == "kvzip") continue;
    v.push_back({p.name, testing_registry::required_options(p.name)});
  }
  v.push_back({"h2o", {{"gqa", "expand"}}});
  v.push_back({"h2o", {{"prefill", "streaming"}}});
  v.push_back({"streaming_llm", {{"positions", "rolling"}, {"evict", "before_attention"}}});
  v.push_back({"snapkv", {{"gqa", "expand"}}});
  v.push_back({"subgen_kcenter", {{"weight_by_cluster_size", "true"}, {"decode", "slide"}}});
  v.push_back({"scissorhands", {{"threshold", "inv_position"}}});
  v.push_back({"tova", {{"tova_reduce", "layer"}}});
  return v;
}

inline std::unique_ptr<policies::Policy> make(const engine::Model& m, const Variant& v,
                                              int budget) {
  if (v.policy.empty()) return nullptr;
  policies::PolicyConfig pc;
  pc.name = v.policy;
  pc.kv_budget = budget;
  const auto& c = m.config;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.shape.sliding_layers = c.has_sliding_layers();  // finch keeps positions there
  pc.options = policies::PolicyOptions(v.options);
  if (testing_registry::needs_model_options(v.policy) && v.options.empty()) {  // fit the model
    pc.options = policies::PolicyOptions(testing_registry::required_options(
        v.policy, c.num_layers, c.num_kv_heads, c.head_dim));
  }
  pc.seed = 5;
  return policies::make_policy(pc);
}

struct BatchRun {
  std::vector<Variant> vars;
  std::vector<std::unique_ptr<policies::Policy>> alone_policies, batch_policies;
  std::vector<kernels::KvCache> alone, batch;  // the caches of the two runs
  int batched_steps = 0;                        // steps that ran more than one sequence
};

// prompt_len: sequence b's prompt has prompt_len + 3 b tokens. vars: the sequences' policies.
template <typename Compare>
void run_variants_against_alone(engine::Engine& eng, const engine::Model& m,
                                std::vector<Variant> vars, int budget, int steps, int prompt_len,
                                BatchRun* run, Compare compare) {
  run->vars = std::move(vars);
  const int B = static_cast<int>(run->vars.size());
  const int V = m.config.vocab_size;
  std::vector<int> stop(B);
  std::vector<float> logits;
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < prompt_len + 3 * b; ++i) prompt.push_back((7 + 31 * i + 13 * b) % V);
    run->alone_policies.push_back(make(m, run->vars[b], budget));
    run->batch_policies.push_back(make(m, run->vars[b], budget));
    run->alone.push_back(eng.new_cache(0, run->alone_policies[b].get()));
    run->batch.push_back(eng.new_cache(0, run->batch_policies[b].get()));
    engine::prefill_prompt(eng, run->alone[b], prompt, run->alone_policies[b].get(), &logits);
    engine::prefill_prompt(eng, run->batch[b], prompt, run->batch_policies[b].get(), &logits);
    stop[b] = steps - b % 4;  // sequences leave the batch at different steps
  }
  for (int t = 0; t < steps; ++t) {
    std::vector<int32_t> tokens;
    std::vector<kernels::KvCache*> caches;
    std::vector<policies::Policy*> pols;
    std::vector<int> who;
    for (int b = 0; b < B; ++b) {
      if (t >= stop[b]) continue;
      tokens.push_back((3 + 17 * t + 29 * b) % V);
      caches.push_back(&run->batch[b]);
      pols.push_back(run->batch_policies[b].get());
      who.push_back(b);
    }
    std::vector<float> batch;
    eng.decode_batch(tokens, caches, pols, &batch);
    ASSERT_EQ(batch.size(), tokens.size() * static_cast<size_t>(V));
    run->batched_steps += tokens.size() > 1;
    for (size_t i = 0; i < who.size(); ++i) {
      const int b = who[i];
      std::vector<float> alone;
      eng.forward({&tokens[i], 1}, run->alone[b], engine::LogitsMode::kLast, &alone,
                  run->alone_policies[b].get(), engine::PolicyHook::kDecode);
      const std::vector<float> row(batch.begin() + static_cast<std::ptrdiff_t>(i) * V,
                                   batch.begin() + static_cast<std::ptrdiff_t>(i + 1) * V);
      compare(b, t, row, alone);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Every variant of variants() in one batch.
template <typename Compare>
void run_batch_against_alone(engine::Engine& eng, const engine::Model& m, int budget, int steps,
                             int prompt_len, BatchRun* run, Compare compare) {
  run_variants_against_alone(eng, m, variants(m.config.has_sliding_layers()), budget, steps,
                             prompt_len, run, compare);
}

}  // namespace kvb::testing_batch
