// The Qwen3 code path (per-head q/k RMSNorm before RoPE, head_dim != dim / num_heads, no QKV
// bias, NEOX RoPE, GQA, GGUF arch "qwen3") against Hugging Face transformers, on a tiny
// random-weight model: scripts/make_qwen3_fixture.py writes tests/fixtures/engine/qwen3_tiny.gguf
// (2 layers, hidden 64, 4 query / 2 KV heads of head_dim 32, so q_dim 128 != hidden; RoPE theta
// 1e6, F32 weights) and the logits Qwen3ForCausalLM computes from the same arrays at every
// position of three sequences. Both sides use identical f32 weights, so only f32 summation order
// differs: the Qwen2 test's tolerance, 1e-4 absolute (measured max is printed), and the same
// top-1 everywhere (the fixture guarantees a top-1/top-2 gap > 1e-3 at every position).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>

#include "common/error.h"
#include "golden_logits.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_FIXTURES_DIR) + "/engine/qwen3_tiny.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/qwen3_tiny.json";
constexpr double kTol = 1e-4;

nlohmann::json fixture() { return golden::load_fixture(kFixture, "scripts/make_qwen3_fixture.py"); }

// The fixture's GGUF bytes with the first dimension of tensor `name`'s info replaced by `dim`.
// Tensor info layout: u64 name length, name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset.
std::string patched_copy(const std::string& name, uint64_t dim, const std::string& out_name) {
  std::ifstream in(kModel, std::ios::binary);
  EXPECT_TRUE(in.good()) << kModel;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string needle(8, '\0');
  const uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);  // GGUF is little-endian, as is every host we build on
  needle += name;
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  EXPECT_NE(it, bytes.end()) << name << " not in " << kModel;
  if (it == bytes.end()) return "";
  const size_t at = static_cast<size_t>(it - bytes.begin()) + needle.size();
  uint32_t n_dims = 0;
  std::memcpy(&n_dims, &bytes[at], 4);
  EXPECT_EQ(n_dims, 1u) << name;
  std::memcpy(&bytes[at + 4], &dim, 8);
  const std::string path = std::string(KVB_BINARY_DIR) + "/" + out_name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(out.good()) << path;
  return path;
}

TEST(Qwen3Tiny, ConfigFromGguf) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const engine::ModelConfig& c = model->config;
  const nlohmann::json& want = fx["config"];
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_EQ(c.format, "gguf");
  EXPECT_EQ(c.name, "qwen3-tiny-random");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rope.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_EQ(c.rope.theta, 1.0e6f);
  EXPECT_FLOAT_EQ(c.norm_eps, want["rms_norm_eps"].get<float>());
  EXPECT_EQ(c.dim, want["hidden_size"].get<int>());
  EXPECT_EQ(c.hidden_dim, want["intermediate_size"].get<int>());
  EXPECT_EQ(c.num_layers, want["num_hidden_layers"].get<int>());
  EXPECT_EQ(c.num_heads, want["num_attention_heads"].get<int>());
  EXPECT_EQ(c.num_kv_heads, want["num_key_value_heads"].get<int>());
  EXPECT_EQ(c.head_dim, want["head_dim"].get<int>());
  // qwen3.attention.key_length, not dim / num_heads: q_dim = 128 against dim 64.
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_NE(c.head_dim, c.dim / c.num_heads);
  EXPECT_EQ(c.rope.rot_dim, c.head_dim);
  EXPECT_EQ(c.vocab_size, want["vocab_size"].get<int>());
  EXPECT_EQ(c.max_seq_len, want["max_position_embeddings"].get<int>());
  EXPECT_FALSE(c.tied_embeddings);
  ASSERT_EQ(model->layers.size(), 2u);
  const size_t QD = static_cast<size_t>(c.num_heads) * c.head_dim;
  for (const engine::LayerWeights& w : model->layers) {
    EXPECT_EQ(w.q_norm.size(), static_cast<size_t>(c.head_dim));
    EXPECT_EQ(w.k_norm.size(), static_cast<size_t>(c.head_dim));
    EXPECT_TRUE(w.bq.empty() && w.bk.empty() && w.bv.empty());
    EXPECT_EQ(w.wq.size(), QD * c.dim);
    EXPECT_EQ(w.wo.size(), static_cast<size_t>(c.dim) * QD);
  }
}

TEST(Qwen3Tiny, LogitsMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  ASSERT_EQ(model->config.arch, "qwen3");
  golden::expect_every_case_matches("qwen3", *model, fx["cases"], kTol);
}

// The same logits when the long sequence goes through the KV cache in pieces: a prefill, a
// second multi-token chunk at positions 64.., then single-token decode steps.
TEST(Qwen3Tiny, ChunkedPrefillAndDecodeMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const int n = static_cast<int>(cs["ids"].size());
  ASSERT_GE(n, 90);
  const golden::Diff d = golden::run_chunked(*model, cs, 64, 84, golden::expect_step_top1);
  std::cout << "[ qwen3 ] long, prefill 64 + chunk 20 + " << n - 84
            << " decode steps: max |logit - transformers| = " << d.max_abs << "\n";
  EXPECT_LT(d.max_abs, kTol);
  EXPECT_EQ(d.top1_mismatch, 0);
}

// The fixture has teeth: each Qwen3-specific ingredient, when dropped or misapplied, moves the
// logits far beyond the tolerance.
TEST(Qwen3Tiny, FixtureDetectsWrongQwen3Handling) {
  const nlohmann::json fx = fixture();
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const golden::Mutation mutations[] = {
      {"no q/k norm", [](engine::Model& m) { m.config.qk_norm = false; }},
      {"q/k norm weights of 1 (unweighted RMSNorm)",
       [](engine::Model& m) {
         for (auto& l : m.layers) {
           std::fill(l.q_norm.begin(), l.q_norm.end(), 1.0f);
           std::fill(l.k_norm.begin(), l.k_norm.end(), 1.0f);
         }
       }},
      {"q and k norm weights swapped",
       [](engine::Model& m) {
         for (auto& l : m.layers) std::swap(l.q_norm, l.k_norm);
       }},
      {"llama (NORM) RoPE pairing",
       [](engine::Model& m) { m.config.rope.style = kernels::cpu::RopeStyle::kNorm; }},
  };
  golden::expect_mutations_detected("qwen3", kModel, cs, mutations, 100 * kTol);
}

// A q_norm of the wrong size (here dim / num_heads = 16, the mistake of a loader that derives
// head_dim) is refused, naming the file and the tensor.
TEST(Qwen3Tiny, WrongSizeQNormIsRefusedNamingTheTensor) {
  const std::string patched =
      patched_copy("blk.1.attn_q_norm.weight", 16, "qwen3_tiny_q_norm_16.gguf");
  ASSERT_FALSE(patched.empty());
  try {
    engine::load_model(patched);
    FAIL() << "a 16-wide blk.1.attn_q_norm.weight (head_dim 32) was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    std::cout << "[ qwen3 ] q_norm of 16: " << msg << "\n";
    EXPECT_NE(msg.find(patched), std::string::npos) << msg;
    EXPECT_NE(msg.find("blk.1.attn_q_norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[16]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected [32]"), std::string::npos) << msg;
  }
  std::remove(patched.c_str());
}

}  // namespace
}  // namespace kvb
