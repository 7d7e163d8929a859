// Batched decode (issue 16 "a bundle decodes as one batch"): B sequences, each with its own
// cache, prompt, position and policy (every registered policy and the variant flags that change
// the code path), step together through StackEngine::decode_batch. The law: every sequence's
// logits at every step, and its cache (lengths, positions, K/V rows) at the end, are
// bit-identical to decoding it alone with forward(); sequences drop out of the batch at
// different steps. On the tiny Qwen3 and Gemma 3 fixtures (q/k norm, sliding windows) and
// SmolLM2 (GQA 3:1).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include "kernels/policies/policy.h"
#include "workers/engine/forward.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"

namespace kvb {
namespace {

struct Variant {
  std::string policy;  // "" = no policy
  std::map<std::string, std::string> options;
};

std::vector<Variant> variants() {
  std::vector<Variant> v = {{"", {}}};
  for (const auto& p : policies::policy_registry()) v.push_back({p.name, {}});
  v.push_back({"h2o", {{"gqa", "expand"}}});
  v.push_back({"h2o", {{"prefill", "streaming"}}});
  v.push_back({"streaming_llm", {{"positions", "rolling"}, {"evict", "before_attention"}}});
  v.push_back({"snapkv", {{"gqa", "expand"}}});
  v.push_back({"subgen_kcenter", {{"weight_by_cluster_size", "true"}, {"decode", "slide"}}});
  return v;
}

std::unique_ptr<policies::Policy> make(const engine::Model& m, const Variant& v, int budget) {
  if (v.policy.empty()) return nullptr;
  policies::PolicyConfig pc;
  pc.name = v.policy;
  pc.kv_budget = budget;
  const auto& c = m.config;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.options = policies::PolicyOptions(v.options);
  pc.seed = 5;
  return policies::make_policy(pc);
}

// Lengths, positions and K/V rows of every (layer, head), bit for bit.
void expect_same_cache(const kernels::KvCache& a, const kernels::KvCache& b, const std::string& what) {
  ASSERT_EQ(a.shape().num_layers, b.shape().num_layers) << what;
  ASSERT_EQ(a.shape().num_kv_heads, b.shape().num_kv_heads) << what;
  EXPECT_EQ(a.next_position(), b.next_position()) << what;
  const int d = a.shape().head_dim;
  for (int l = 0; l < a.shape().num_layers; ++l) {
    const kernels::LayerKvView va = a.layer(l), vb = b.layer(l);
    for (int h = 0; h < a.shape().num_kv_heads; ++h) {
      const int len = a.length(l, h);
      ASSERT_EQ(len, b.length(l, h)) << what << " layer " << l << " head " << h;
      EXPECT_EQ(0, std::memcmp(va.position(h), vb.position(h), len * sizeof(int32_t))) << what;
      EXPECT_EQ(0, std::memcmp(va.key(h, 0), vb.key(h, 0), sizeof(float) * len * d)) << what;
      EXPECT_EQ(0, std::memcmp(va.value(h, 0), vb.value(h, 0), sizeof(float) * len * d)) << what;
    }
  }
}

void check_model(const engine::Model& m, int budget, int steps) {
  engine::Engine eng(m);
  const std::vector<Variant> vars = variants();
  const int B = static_cast<int>(vars.size());
  const int V = m.config.vocab_size;
  std::vector<std::unique_ptr<policies::Policy>> pa, pb;
  std::vector<kernels::KvCache> ca, cb;
  std::vector<int> stop(B);
  std::vector<float> logits;
  for (int b = 0; b < B; ++b) {
    // Prompts of different lengths (so positions and cache lengths differ across the batch).
    std::vector<int32_t> prompt;
    for (int i = 0; i < 30 + 3 * b; ++i) prompt.push_back((7 + 31 * i + 13 * b) % V);
    pa.push_back(make(m, vars[b], budget));
    pb.push_back(make(m, vars[b], budget));
    ca.push_back(eng.new_cache(0, pa[b].get()));
    cb.push_back(eng.new_cache(0, pb[b].get()));
    engine::prefill_prompt(eng, ca[b], prompt, pa[b].get(), &logits);
    engine::prefill_prompt(eng, cb[b], prompt, pb[b].get(), &logits);
    stop[b] = steps - b % 4;  // sequences leave the batch at different steps
  }
  int batched_steps = 0;
  for (int t = 0; t < steps; ++t) {
    std::vector<int32_t> tokens;
    std::vector<kernels::KvCache*> caches;
    std::vector<policies::Policy*> pols;
    std::vector<int> who;
    for (int b = 0; b < B; ++b) {
      if (t >= stop[b]) continue;
      tokens.push_back((3 + 17 * t + 29 * b) % V);
      caches.push_back(&cb[b]);
      pols.push_back(pb[b].get());
      who.push_back(b);
    }
    std::vector<float> batch;
    eng.decode_batch(tokens, caches, pols, &batch);
    ASSERT_EQ(batch.size(), tokens.size() * static_cast<size_t>(V));
    batched_steps += tokens.size() > 1;
    for (size_t i = 0; i < who.size(); ++i) {
      const int b = who[i];
      std::vector<float> alone;
      eng.forward({&tokens[i], 1}, ca[b], engine::LogitsMode::kLast, &alone, pa[b].get(),
                  engine::PolicyHook::kDecode);
      const std::vector<float> row(batch.begin() + static_cast<std::ptrdiff_t>(i) * V,
                                   batch.begin() + static_cast<std::ptrdiff_t>(i + 1) * V);
      ASSERT_EQ(row, alone) << "sequence " << b << " (" << vars[b].policy << ") step " << t
                            << " in a batch of " << who.size();
    }
  }
  EXPECT_EQ(batched_steps, steps);
  for (int b = 0; b < B; ++b) {
    expect_same_cache(ca[b], cb[b], "sequence " + std::to_string(b) + " (" + vars[b].policy + ")");
  }
  // The budget forced evictions somewhere (else the hooks were not exercised).
  int evicted = 0;
  for (int b = 0; b < B; ++b) evicted += ca[b].max_length() < ca[b].next_position();
  EXPECT_GT(evicted, B / 2);
}

TEST(DecodeBatch, Qwen3TinyEveryPolicyBitIdenticalToAlone) {
  std::unique_ptr<engine::Model> m =
      engine::load_model(std::string(KVB_FIXTURES_DIR) + "/engine/qwen3_tiny.gguf");
  check_model(*m, 16, 12);
}

TEST(DecodeBatch, Gemma3TinySlidingLayersBitIdenticalToAlone) {
  std::unique_ptr<engine::Model> m =
      engine::load_model(std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf");
  ASSERT_TRUE(m->config.sliding(0));
  check_model(*m, 20, 12);
}

TEST(DecodeBatch, SmolLM2EveryPolicyBitIdenticalToAlone) {
  const std::string path = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::ifstream(path).good()) << path << " missing: run scripts/fetch_models.sh";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  check_model(*m, 16, 6);
}

}  // namespace
}  // namespace kvb
