// YaRN rope scaling (Qwen2.5's long-context setting: GGUF qwen2.rope.scaling.type "yarn", factor,
// original_context_length) against Hugging Face transformers, on a tiny random-weight Qwen2:
// scripts/make_qwen2_yarn_fixture.py writes tests/fixtures/engine/qwen2_yarn_tiny.gguf (2 layers,
// hidden 64, 4 query / 2 KV heads of head_dim 16, QKV biases, factor 4 over an original context
// of 64, F16 weights) and Qwen2ForCausalLM's logits (eager) from the same values at every
// position of three sequences (the longest, 100 tokens, past the original context). kvbench
// expresses YaRN's blended frequencies as per-dimension factors and the attention factor
// 0.1 ln(4) + 1 as RopeParams::attn_factor on cos and sin.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "golden_logits.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_FIXTURES_DIR) + "/engine/qwen2_yarn_tiny.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/qwen2_yarn_tiny.json";
constexpr double kTol = 1e-4;

nlohmann::json fixture() {
  return golden::load_fixture(kFixture, "scripts/make_qwen2_yarn_fixture.py");
}

TEST(Qwen2YarnTiny, ConfigMatchesTransformersFrequencies) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const engine::ModelConfig& c = model->config;
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.rope_scaling, "yarn");
  EXPECT_EQ(c.rope_original_context, 64);
  EXPECT_NEAR(c.rope.attn_factor, fx["config"]["attention_factor"].get<double>(), 1e-7);
  EXPECT_NEAR(c.rope.attn_factor, 0.1 * std::log(4.0) + 1, 1e-7);
  // The frequencies the kernel will use, 1 / theta^(2i/d) / factor[i], against transformers'
  // inv_freq: within a few f32 ulps (the blend is f32 arithmetic on both sides).
  const std::vector<double> want = fx["config"]["inv_freq"].get<std::vector<double>>();
  ASSERT_EQ(c.rope.freq_factors.size(), want.size());
  int interpolated = 0, extrapolated = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float base = 1.0f / std::pow(c.rope.theta, static_cast<float>(2 * i) / c.rope.rot_dim);
    const float got = base / c.rope.freq_factors[i];
    EXPECT_NEAR(got, want[i], 4e-7 * want[i]) << "dimension pair " << i;
    interpolated += std::fabs(c.rope.freq_factors[i] - 4.0f) < 1e-6f;
    extrapolated += c.rope.freq_factors[i] == 1.0f;
  }
  // Both ends of the ramp occur (fast dimensions kept, slow ones divided by the factor).
  EXPECT_GT(interpolated, 0);
  EXPECT_GT(extrapolated, 0);
}

TEST(Qwen2YarnTiny, LogitsMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  for (const auto& cs : fx["cases"]) {
    const size_t n = cs["ids"].size();
    const golden::Diff d = golden::run_case(*model, cs);
    std::cout << "[ qwen2 yarn ] " << cs["name"].get<std::string>() << ": " << n
              << " tokens, max |logit - transformers| = " << d.max_abs << ", top-1 agreement "
              << n - d.top1_mismatch << "/" << n << "\n";
    EXPECT_LT(d.max_abs, kTol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"] << ", first at " << d.first_mismatch;
  }
}

TEST(Qwen2YarnTiny, ChunkedPrefillAndDecodeMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const golden::Diff d =
      golden::run_chunked(*model, golden::find_case(fx["cases"], "long"), 50, 70);
  std::cout << "[ qwen2 yarn ] long, prefill 50 + chunk 20 + 30 decode steps: max |logit - "
               "transformers| = "
            << d.max_abs << "\n";
  EXPECT_LT(d.max_abs, kTol);
  EXPECT_EQ(d.top1_mismatch, 0) << d.first_mismatch;
}

// Teeth: without the YaRN frequencies, or without the attention factor, or with plain linear
// interpolation in their place, the 100-token logits move far beyond the tolerance.
TEST(Qwen2YarnTiny, FixtureDetectsWrongYarnHandling) {
  const nlohmann::json fx = fixture();
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const golden::Mutation mutations[] = {
      {"no YaRN frequencies", [](engine::Model& m) { m.config.rope.freq_factors.clear(); }},
      {"attention factor 1", [](engine::Model& m) { m.config.rope.attn_factor = 1.0f; }},
      {"linear interpolation by 4 instead",
       [](engine::Model& m) {
         m.config.rope.freq_factors.clear();
         m.config.rope.linear_scale = 4.0f;
       }},
  };
  golden::expect_mutations_detected("qwen2 yarn", kModel, cs, mutations, 100 * kTol);
}

// End to end through the CLI: the GGUF's tokenizer gives the bytes of "Eviction studies need"
// (no merge applies), and `kvbench generate` prints transformers' top-1 at position 20.
TEST(Qwen2YarnTiny, CliGreedyTokenMatchesTransformers) {
  const nlohmann::json fx = fixture();
  golden::expect_cli_greedy_matches(kModel, golden::find_case(fx["cases"], "long"), 21,
                                    {" t", "he"});
}

}  // namespace
}  // namespace kvb
