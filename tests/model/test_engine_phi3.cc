// Phi-3 (GGUF arch "phi3": fused attn_qkv and ffn_up, NEOX RoPE over a partial rotary dimension,
// LongRoPE factor sets and attention factor) against Hugging Face transformers, on a tiny
// random-weight model: scripts/make_phi3_fixture.py writes tests/fixtures/engine/phi3_tiny.gguf
// (2 layers, hidden 64, 2 query / 1 KV head of head_dim 32, 16 rotated dims, context 256 over an
// original 32, F16 weights) and Phi3ForCausalLM's logits (eager) from the same values.
// kvbench, like llama.cpp, fixes the long factor set for the run because its context (256)
// exceeds the original (32); the fixture's "cases" are transformers with the long set at every
// length (at 100 tokens transformers picks it by itself), its "short_cases" transformers with the
// short set it uses up to 32 tokens, checked here against the engine given the short tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>

#include "common/error.h"
#include "golden_logits.h"
#include "workers/formats/gguf.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_FIXTURES_DIR) + "/engine/phi3_tiny.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/phi3_tiny.json";
constexpr double kTol = 1e-4;

nlohmann::json fixture() { return golden::load_fixture(kFixture, "scripts/make_phi3_fixture.py"); }

TEST(Phi3Tiny, ConfigFromGguf) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const engine::ModelConfig& c = model->config;
  const nlohmann::json& want = fx["config"];
  EXPECT_EQ(c.arch, "phi3");
  EXPECT_TRUE(c.fused_qkv);
  EXPECT_TRUE(c.fused_gate_up);
  EXPECT_EQ(c.rope.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope.rot_dim, want["rope_dimension_count"].get<int>());
  EXPECT_EQ(c.hidden_dim, want["intermediate_size"].get<int>());
  EXPECT_EQ(c.rope_scaling, "longrope");
  EXPECT_EQ(c.rope_original_context, want["original_max_position_embeddings"].get<int>());
  EXPECT_EQ(c.rope_factor_set, "long");  // context 256 > original 32
  EXPECT_EQ(c.rope.freq_factors, want["long_factor"].get<std::vector<float>>());
  EXPECT_NEAR(c.rope.attn_factor, want["attention_factor"].get<double>(), 1e-7);
  // sliding_window 512 covers the context 256: it can never bind, so every layer stays global.
  EXPECT_TRUE(c.window.empty());
  const size_t D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  for (const engine::LayerWeights& w : model->layers) {
    EXPECT_EQ(w.wq.size(), c.num_heads * hd * D);
    EXPECT_EQ(w.wk.size(), c.num_kv_heads * hd * D);
    EXPECT_EQ(w.wv.size(), c.num_kv_heads * hd * D);
    EXPECT_EQ(w.w_gate.size(), H * D);
    EXPECT_EQ(w.w_up.size(), H * D);
  }
}

// The fixture's GGUF bytes with every occurrence of `from` replaced by `to` (same length), written
// under a per-process name (ctest runs this binary's tests as concurrent processes).
std::string patched_copy(const std::vector<std::pair<std::string, std::string>>& edits,
                         const std::string& tag) {
  std::ifstream in(kModel, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [from, to] : edits) {
    EXPECT_EQ(from.size(), to.size());
    const size_t at = bytes.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) bytes.replace(at, from.size(), to);
  }
  const std::string path = std::string(KVB_BINARY_DIR) + "/phi3_tiny_" + tag + "_" +
                           std::to_string(::getpid()) + ".gguf";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(out.good()) << path;
  return path;
}

std::string u32_value(const std::string& key, uint32_t v) {
  std::string s(8, '\0');
  const uint64_t len = key.size();
  std::memcpy(s.data(), &len, 8);
  s += key;
  const uint32_t type = 4;  // GGUF_TYPE_UINT32
  s.append(reinterpret_cast<const char*>(&type), 4);
  s.append(reinterpret_cast<const char*>(&v), 4);
  return s;
}

// Without the key rope.scaling.attn_factor the loader derives the factor from the context lengths
// as transformers does, sqrt(1 + ln(256 / 32) / ln(32)), and the logits still match.
TEST(Phi3Tiny, AttentionFactorWithoutTheKeyMatchesTransformers) {
  const nlohmann::json fx = fixture();
  const std::string path =
      patched_copy({{"phi3.rope.scaling.attn_factor", "phi3.rope.scaling.attn_fact0r"}}, "nokey");
  std::unique_ptr<engine::Model> model = engine::load_model(path);
  std::remove(path.c_str());
  ASSERT_FALSE(model->gguf->has("phi3.rope.scaling.attn_factor"));
  EXPECT_NEAR(model->config.rope.attn_factor, fx["config"]["attention_factor"].get<double>(), 1e-7);
  const golden::Diff d = golden::run_case(*model, golden::find_case(fx["cases"], "long"));
  EXPECT_LT(d.max_abs, kTol);
}

// The factor set follows the context in use: a GGUF whose context_length is the original context
// (and which carries no attention factor) runs with the short set and a factor of 1.
TEST(Phi3Tiny, ShortSetWhenTheContextIsTheOriginal) {
  const std::string path =
      patched_copy({{"phi3.rope.scaling.attn_factor", "phi3.rope.scaling.attn_fact0r"},
                    {u32_value("phi3.context_length", 256), u32_value("phi3.context_length", 32)}},
                   "ctx32");
  std::unique_ptr<engine::Model> model = engine::load_model(path);
  const engine::ModelConfig& c = model->config;
  EXPECT_EQ(c.max_seq_len, 32);
  EXPECT_EQ(c.rope_factor_set, "short");
  EXPECT_EQ(c.rope.freq_factors, model->gguf->load_f32("rope_factors_short.weight"));
  EXPECT_EQ(c.rope.attn_factor, 1.0f);
  std::remove(path.c_str());
}

// Phi-3's window follows Mistral's rule: a phi3.attention.sliding_window below the context puts
// every layer under it (no global layer: only full runs), one that covers the context (the
// fixture's 512 over 256) is none.
TEST(Phi3Tiny, BindingWindowSlidesEveryLayer) {
  const std::string path = patched_copy({{u32_value("phi3.attention.sliding_window", 512),
                                          u32_value("phi3.attention.sliding_window", 16)}},
                                        "window16");
  std::unique_ptr<engine::Model> model = engine::load_model(path);
  std::remove(path.c_str());
  const engine::ModelConfig& c = model->config;
  EXPECT_EQ(c.window, std::vector<int>(c.num_layers, 16));
  EXPECT_EQ(c.global_layers(), 0);
  EXPECT_EQ(&c.rope_of(0), &c.rope);  // the window layers keep LongRoPE
  EXPECT_THROW(engine::require_policy_layers("h2o", path, c.global_layers(), 16), Error);
}

// Hostile factors: a NaN in rope_factors_long.weight would poison every rotated key; the loader
// refuses it naming the file, the tensor and the entry.
TEST(Phi3Tiny, NonFiniteLongRopeFactorIsRefused) {
  const float good[2] = {1.3f, 1.9f};  // LONG[1], LONG[2] in scripts/make_phi3_fixture.py
  const float bad[2] = {std::nanf(""), 1.9f};
  const std::string path = patched_copy({{std::string(reinterpret_cast<const char*>(good), 8),
                                          std::string(reinterpret_cast<const char*>(bad), 8)}},
                                        "nan_factor");
  try {
    engine::load_model(path);
    ADD_FAILURE() << "a NaN LongRoPE factor was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("rope_factors_long.weight[1] = nan"), std::string::npos) << msg;
  }
  std::remove(path.c_str());
}

TEST(Phi3Tiny, LogitsMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  for (const auto& cs : fx["cases"]) {
    const size_t n = cs["ids"].size();
    const golden::Diff d = golden::run_case(*model, cs);
    std::cout << "[ phi3 ] " << cs["name"].get<std::string>() << " (long factors): " << n
              << " tokens, max |logit - transformers| = " << d.max_abs << ", top-1 agreement "
              << n - d.top1_mismatch << "/" << n << "\n";
    EXPECT_LT(d.max_abs, kTol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"] << ", first at " << d.first_mismatch;
  }
}

// The short set, as transformers runs prompts within the original context: the engine given
// rope_factors_short.weight matches it.
TEST(Phi3Tiny, ShortFactorsMatchTransformersWithinTheOriginalContext) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  model->config.rope.freq_factors = model->gguf->load_f32("rope_factors_short.weight");
  ASSERT_EQ(model->config.rope.freq_factors,
            fx["config"]["short_factor"].get<std::vector<float>>());
  ASSERT_GE(fx["short_cases"].size(), 2u);
  for (const auto& cs : fx["short_cases"]) {
    const golden::Diff d = golden::run_case(*model, cs);
    std::cout << "[ phi3 ] " << cs["name"].get<std::string>()
              << ": max |logit - transformers| = " << d.max_abs << "\n";
    EXPECT_LT(d.max_abs, kTol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"] << ", first at " << d.first_mismatch;
  }
}

TEST(Phi3Tiny, ChunkedPrefillAndDecodeMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const golden::Diff d =
      golden::run_chunked(*model, golden::find_case(fx["cases"], "long"), 20, 50);
  std::cout << "[ phi3 ] long, prefill 20 + chunk 30 + 50 decode steps: max |logit - "
               "transformers| = "
            << d.max_abs << "\n";
  EXPECT_LT(d.max_abs, kTol);
  EXPECT_EQ(d.top1_mismatch, 0) << d.first_mismatch;
}

// Teeth: each Phi-3 ingredient, dropped or misapplied, moves the 100-token logits far beyond the
// tolerance.
TEST(Phi3Tiny, FixtureDetectsWrongPhi3Handling) {
  const nlohmann::json fx = fixture();
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const golden::Mutation mutations[] = {
      {"short factors at 100 tokens",
       [](engine::Model& m) {
         m.config.rope.freq_factors = m.gguf->load_f32("rope_factors_short.weight");
       }},
      {"no LongRoPE factors", [](engine::Model& m) { m.config.rope.freq_factors.clear(); }},
      {"attention factor 1", [](engine::Model& m) { m.config.rope.attn_factor = 1.0f; }},
      {"gate and up halves swapped",
       [](engine::Model& m) {
         for (auto& l : m.layers) std::swap(l.w_gate, l.w_up);
       }},
      {"K and V rows swapped",
       [](engine::Model& m) {
         for (auto& l : m.layers) std::swap(l.wk, l.wv);
       }},
      {"full rotary dimension",
       [](engine::Model& m) {
         m.config.rope.rot_dim = m.config.head_dim;
         m.config.rope.freq_factors.resize(m.config.head_dim / 2, 1.0f);
       }},
  };
  golden::expect_mutations_detected("phi3", kModel, cs, mutations, 100 * kTol);
}

// End to end through the CLI: the GGUF's tokenizer gives the bytes of "Eviction studies need"
// (no merge applies), and `kvbench generate` prints transformers' top-1 at position 20.
TEST(Phi3Tiny, CliGreedyTokenMatchesTransformers) {
  const nlohmann::json fx = fixture();
  golden::expect_cli_greedy_matches(kModel, golden::find_case(fx["cases"], "long"), 21,
                                    {" t", "he"});
}

}  // namespace
}  // namespace kvb
