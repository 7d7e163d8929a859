// The Qwen2 code path (QKV bias, NEOX RoPE, GQA, GGUF arch "qwen2") against Hugging Face
// transformers, on a tiny random-weight model: scripts/make_qwen2_fixture.py writes
// tests/fixtures/engine/qwen2_tiny.gguf (2 layers, hidden 32, 4 query / 2 KV heads of dim 8,
// RoPE theta 1e6, F32 weights) and the logits transformers computes from that same file at every
// position of three sequences. Both sides use identical f32 weights, so only f32 summation order
// differs: we allow 1e-4 absolute on logits up to ~14 (measured max is printed) and require the
// same top-1 everywhere (the fixture guarantees a top-1/top-2 gap > 1e-3 at every position).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "common/error.h"
#include "golden_logits.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_FIXTURES_DIR) + "/engine/qwen2_tiny.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/qwen2_tiny.json";
constexpr double kTol = 1e-4;

nlohmann::json fixture() { return golden::load_fixture(kFixture, "scripts/make_qwen2_fixture.py"); }

TEST(Qwen2Tiny, ConfigFromGguf) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const engine::ModelConfig& c = model->config;
  const nlohmann::json& want = fx["config"];
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.format, "gguf");
  EXPECT_EQ(c.name, "qwen2-tiny-random");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.rope.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_EQ(c.rope.theta, 1.0e6f);  // qwen2.rope.freq_base, not the 10000 default
  EXPECT_EQ(c.rope.rot_dim, c.head_dim);
  EXPECT_FLOAT_EQ(c.norm_eps, want["rms_norm_eps"].get<float>());
  EXPECT_EQ(c.dim, want["hidden_size"].get<int>());
  EXPECT_EQ(c.hidden_dim, want["intermediate_size"].get<int>());
  EXPECT_EQ(c.num_layers, want["num_hidden_layers"].get<int>());
  EXPECT_EQ(c.num_heads, want["num_attention_heads"].get<int>());
  EXPECT_EQ(c.num_kv_heads, want["num_key_value_heads"].get<int>());
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);  // GQA: two query heads per KV head
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, want["vocab_size"].get<int>());
  EXPECT_EQ(c.max_seq_len, want["max_position_embeddings"].get<int>());
  EXPECT_FALSE(c.tied_embeddings);
  ASSERT_EQ(model->layers.size(), 2u);
  for (const engine::LayerWeights& w : model->layers) {
    EXPECT_EQ(w.bq.size(), static_cast<size_t>(c.num_heads * c.head_dim));
    EXPECT_EQ(w.bk.size(), static_cast<size_t>(c.num_kv_heads * c.head_dim));
    EXPECT_EQ(w.bv.size(), static_cast<size_t>(c.num_kv_heads * c.head_dim));
  }
  EXPECT_EQ(model->output.size(), static_cast<size_t>(c.vocab_size) * c.dim);
}

TEST(Qwen2Tiny, LogitsMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  ASSERT_EQ(model->config.arch, "qwen2");
  golden::expect_every_case_matches("qwen2", *model, fx["cases"], kTol);
}

// The same logits when the long sequence goes through the KV cache in pieces: a prefill, a
// second multi-token chunk at positions 64.., then single-token decode steps.
TEST(Qwen2Tiny, ChunkedPrefillAndDecodeMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const int n = static_cast<int>(cs["ids"].size());
  ASSERT_GE(n, 90);
  const golden::Diff d = golden::run_chunked(*model, cs, 64, 84, golden::expect_step_top1);
  std::cout << "[ qwen2 ] long, prefill 64 + chunk 20 + " << n - 84
            << " decode steps: max |logit - transformers| = " << d.max_abs << "\n";
  EXPECT_LT(d.max_abs, kTol);
  EXPECT_EQ(d.top1_mismatch, 0);
}

// The fixture has teeth: each Qwen2-specific ingredient, when dropped or swapped for the Llama
// choice, moves the logits far beyond the tolerance.
TEST(Qwen2Tiny, FixtureDetectsWrongQwen2Handling) {
  const nlohmann::json fx = fixture();
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const golden::Mutation mutations[] = {
      {"llama (NORM) RoPE pairing",
       [](engine::Model& m) { m.config.rope.style = kernels::cpu::RopeStyle::kNorm; }},
      {"default RoPE theta 10000", [](engine::Model& m) { m.config.rope.theta = 10000.0f; }},
      {"no Q/K/V biases",
       [](engine::Model& m) {
         m.config.qkv_bias = false;
         for (auto& l : m.layers) l.bq.clear(), l.bk.clear(), l.bv.clear();
       }},
      {"no K bias only", [](engine::Model& m) { for (auto& l : m.layers) l.bk.clear(); }},
      {"tied classifier", [](engine::Model& m) { m.output.clear(); }},
  };
  golden::expect_mutations_detected("qwen2", kModel, cs, mutations, 100 * kTol);
}

// general.architecture patched in place to an unsupported name of the same length.
TEST(Qwen2Tiny, UnsupportedArchitectureListsSupportedOnes) {
  std::ifstream in(kModel, std::ios::binary);
  ASSERT_TRUE(in.good()) << kModel;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // KV layout: u64 key length, key, u32 type (8 = string), u64 value length, value.
  const std::string key = "general.architecture";
  auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(it, bytes.end());
  const size_t value = static_cast<size_t>(it - bytes.begin()) + key.size() + 4 + 8;
  ASSERT_LE(value + 5, bytes.size());
  ASSERT_EQ(std::string(&bytes[value], 5), "qwen2");
  bytes[value + 4] = '9';
  const std::string patched = std::string(KVB_BINARY_DIR) + "/qwen2_tiny_arch_qwen9.gguf";
  {
    std::ofstream out(patched, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << patched;
  }
  try {
    engine::load_model(patched);
    FAIL() << "loading an arch 'qwen9' GGUF did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    std::cout << "[ qwen2 ] arch 'qwen9': " << msg << "\n";
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << msg;
    EXPECT_NE(msg.find(patched), std::string::npos) << msg;
    EXPECT_NE(msg.find("unsupported architecture 'qwen9'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("supported: llama, qwen2"), std::string::npos) << msg;
  }
  std::remove(patched.c_str());
}

}  // namespace
}  // namespace kvb
