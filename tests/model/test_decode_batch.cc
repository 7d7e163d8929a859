// Batched decode (issue 16 "a bundle decodes as one batch"): B sequences, each with its own
// cache, prompt, position and policy (every registered policy and the variant flags that change
// the code path), step together through Engine::decode_batch. The law: every sequence's
// logits at every step, and its cache (lengths, positions, K/V rows) at the end, are
// bit-identical to decoding it alone with forward(); sequences drop out of the batch at
// different steps. On the tiny Qwen3 and Gemma 3 fixtures (q/k norm, sliding windows) and
// SmolLM2 (GQA 3:1).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include "kernels/policies/policy.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "decode_batch_check.h"

namespace kvb {
namespace {

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
  testing_batch::BatchRun run;
  testing_batch::run_batch_against_alone(
      eng, m, budget, steps, 30, &run,
      [&](int b, int t, const std::vector<float>& row, const std::vector<float>& alone) {
        ASSERT_EQ(row, alone) << "sequence " << b << " (" << run.vars[b].policy << ") step " << t;
      });
  if (::testing::Test::HasFatalFailure()) return;
  const int B = static_cast<int>(run.vars.size());
  EXPECT_EQ(run.batched_steps, steps);
  for (int b = 0; b < B; ++b) {
    expect_same_cache(run.alone[b], run.batch[b],
                      "sequence " + std::to_string(b) + " (" + run.vars[b].policy + ")");
  }
  std::vector<kernels::KvCache>& ca = run.alone;
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
