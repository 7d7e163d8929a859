// Mistral (GGUF arch "llama" with llama.attention.sliding_window: every layer slides) against
// Hugging Face transformers, on a tiny random-weight model: scripts/make_mistral_fixture.py writes
// tests/fixtures/engine/mistral_tiny.gguf (2 layers, hidden 64, 4 query / 2 KV heads of head_dim
// 16, window 8, Q/K rows permuted as convert_hf_to_gguf does, F16 weights) and the logits
// MistralForCausalLM (eager) computes from the same values at every position of three sequences.
// Tolerance 1e-4 absolute and the same top-1 everywhere, as for Qwen2/Qwen3/Gemma 3. With no
// global layer, the window alone bounds the cache: kvbench refuses every policy but full.
#include <gtest/gtest.h>

#include <iostream>

#include "common/error.h"
#include "golden_logits.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_FIXTURES_DIR) + "/engine/mistral_tiny.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/mistral_tiny.json";
constexpr double kTol = 1e-4;

nlohmann::json fixture() {
  return golden::load_fixture(kFixture, "scripts/make_mistral_fixture.py");
}

TEST(MistralTiny, ConfigFromGguf) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const engine::ModelConfig& c = model->config;
  const nlohmann::json& want = fx["config"];
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.name, "mistral-tiny-random");
  EXPECT_EQ(c.rope.style, kernels::cpu::RopeStyle::kNorm);
  EXPECT_EQ(c.head_dim, want["head_dim"].get<int>());
  EXPECT_EQ(c.num_kv_heads, want["num_key_value_heads"].get<int>());
  EXPECT_EQ(c.max_seq_len, want["max_position_embeddings"].get<int>());
  const int w = want["sliding_window"].get<int>();
  EXPECT_EQ(c.window, std::vector<int>(c.num_layers, w));
  EXPECT_EQ(c.global_layers(), 0);
  for (int l = 0; l < c.num_layers; ++l) EXPECT_EQ(&c.rope_of(l), &c.rope) << l;
}

TEST(MistralTiny, LogitsMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  for (const auto& cs : fx["cases"]) {
    const size_t n = cs["ids"].size();
    const golden::Diff d = golden::run_case(*model, cs);
    std::cout << "[ mistral ] " << cs["name"].get<std::string>() << ": " << n
              << " tokens, max |logit - transformers| = " << d.max_abs << ", top-1 agreement "
              << n - d.top1_mismatch << "/" << n << "\n";
    EXPECT_LT(d.max_abs, kTol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"] << ", first at " << d.first_mismatch;
  }
}

// Through the cache in pieces (chunks wider than the window, then decode steps that evict the
// row leaving the window each step): the same logits.
TEST(MistralTiny, ChunkedPrefillAndDecodeMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const golden::Diff d =
      golden::run_chunked(*model, golden::find_case(fx["cases"], "long"), 40, 61);
  std::cout << "[ mistral ] long, prefill 40 + chunk 21 + 39 decode steps: max |logit - "
               "transformers| = "
            << d.max_abs << "\n";
  EXPECT_LT(d.max_abs, kTol);
  EXPECT_EQ(d.top1_mismatch, 0) << d.first_mismatch;
}

// Teeth: without the window (every layer global), or with the wrong RoPE pairing, the 100-token
// logits move far beyond the tolerance.
TEST(MistralTiny, FixtureDetectsAMissingWindow) {
  const nlohmann::json fx = fixture();
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const golden::Mutation mutations[] = {
      {"no sliding window", [](engine::Model& m) { m.config.window.clear(); }},
      {"window 9 instead of 8",
       [](engine::Model& m) { std::fill(m.config.window.begin(), m.config.window.end(), 9); }},
      {"NEOX RoPE pairing",
       [](engine::Model& m) { m.config.rope.style = kernels::cpu::RopeStyle::kNeox; }},
  };
  golden::expect_mutations_detected("mistral", kModel, cs, mutations, 100 * kTol);
}

// No global layer: a policy would run exactly as full, so every policy but full is refused
// with a message that says why.
TEST(MistralTiny, PoliciesOtherThanFullAreRefused) {
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const engine::ModelConfig& c = model->config;
  EXPECT_NO_THROW(engine::require_policy_layers("full", kModel, c.global_layers(), 8));
  try {
    engine::require_policy_layers("snapkv", kModel, c.global_layers(), 8);
    FAIL() << "snapkv accepted on a model with no global layer";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("snapkv"), std::string::npos) << msg;
    EXPECT_NE(msg.find("window of 8 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("would run exactly as full"), std::string::npos) << msg;
  }
}

// End to end through the CLI: the GGUF's tokenizer gives the bytes of "Eviction studies need"
// (no merge applies), and `kvbench generate` prints transformers' top-1 at position 20.
TEST(MistralTiny, CliGreedyTokenMatchesTransformers) {
  const nlohmann::json fx = fixture();
  golden::expect_cli_greedy_matches(kModel, golden::find_case(fx["cases"], "long"), 21,
                                    {" t", "he"});
}

// Through the CLI: `kvbench generate --policy snapkv` on the all-sliding model is a usage error
// (exit 2) that says why; `--policy full` runs.
TEST(MistralTiny, CliRefusesPoliciesOtherThanFull) {
  std::string out, err;
  EXPECT_EQ(testing::kvbench({"generate", "--model", kModel, "--prompt", "window", "-n", "2",
                              "--policy", "snapkv", "--kv-budget", "4"},
                             &out, &err),
            2);
  EXPECT_NE(err.find("policy 'snapkv'"), std::string::npos) << err;
  EXPECT_NE(err.find("which alone bounds its cache"), std::string::npos) << err;
  EXPECT_EQ(testing::kvbench({"generate", "--model", kModel, "--prompt", "window", "-n", "2"}, &out,
                             &err),
            0)
      << err;
}

}  // namespace
}  // namespace kvb
