// The Gemma 3 code path against Hugging Face transformers on a tiny random-weight model:
// scripts/make_gemma3_fixture.py writes tests/fixtures/engine/gemma3_tiny.gguf (6 layers: 0-4
// sliding-window layers of window 16 with RoPE base 10000, layer 5 global with base 1e6; hidden
// 64, 4 query / 2 KV heads of head_dim 32; q/k norms, post-attention and post-MLP norms, GeGLU
// with tanh GELU, embeddings times sqrt(64), tied classifier; F32) and the logits
// Gemma3ForCausalLM (eager) computes from the same arrays at every position of three sequences.
// Both sides hold identical f32 weights: 1e-4 absolute and the same top-1 everywhere, as for
// Qwen2 and Qwen3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

const std::string kModel = std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.json";
constexpr double kTol = 1e-4;

nlohmann::json fixture() {
  return golden::load_fixture(kFixture, "scripts/make_gemma3_fixture.py");
}

TEST(Gemma3Tiny, ConfigFromGguf) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const engine::ModelConfig& c = model->config;
  const nlohmann::json& want = fx["config"];
  EXPECT_EQ(c.arch, "gemma3");
  EXPECT_EQ(c.name, "gemma3-tiny-random");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.post_norms);
  EXPECT_EQ(c.ffn_act, engine::FfnAct::kGeluTanh);
  EXPECT_EQ(c.embed_scale, 8.0f);  // sqrt(hidden 64)
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_EQ(c.rope.theta, want["rope_theta"].get<float>());
  EXPECT_EQ(c.rope_local.theta, want["rope_local_base_freq"].get<float>());
  EXPECT_EQ(c.rope_local.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_EQ(c.head_dim, want["head_dim"].get<int>());
  EXPECT_EQ(c.softmax_scale(), 1.0f / std::sqrt(32.0f));  // query_pre_attn_scalar = head_dim
  const int w = want["sliding_window"].get<int>();
  EXPECT_EQ(c.window, (std::vector<int>{w, w, w, w, w, 0}));
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_EQ(c.sliding(l), l != 5) << l;
    EXPECT_EQ(c.rope_of(l).theta, l == 5 ? 1.0e6f : 10000.0f) << l;
  }
  for (const engine::LayerWeights& lw : model->layers) {
    EXPECT_EQ(lw.post_attn_norm.size(), static_cast<size_t>(c.dim));
    EXPECT_EQ(lw.post_ffn_norm.size(), static_cast<size_t>(c.dim));
  }
}

TEST(Gemma3Tiny, LogitsMatchTransformers) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  int long_cases = 0;
  for (const auto& cs : fx["cases"]) {
    const size_t n = cs["ids"].size();
    const golden::Diff d = golden::run_case(*model, cs);
    std::cout << "[ gemma3 ] " << cs["name"].get<std::string>() << ": " << n
              << " tokens, max |logit - transformers| = " << d.max_abs << ", top-1 agreement "
              << n - d.top1_mismatch << "/" << n << "\n";
    EXPECT_LT(d.max_abs, kTol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"];
    if (n >= 100) ++long_cases;  // 100 tokens: > 6 windows, and the blocked prefill path
  }
  EXPECT_GE(long_cases, 1);
}

// The long sequence through the cache in pieces: a 40-token prefill (blocked attention), a 7-token
// chunk (row attention) and single-token decode steps. Each sliding layer keeps only its last
// window - 1 = 15 rows between passes (the window is the cache), the global layer keeps all.
TEST(Gemma3Tiny, ChunkedPrefillAndDecodeKeepTheWindowAsTheCache) {
  const nlohmann::json fx = fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const int n = static_cast<int>(cs["ids"].size());
  const engine::ModelConfig& c = model->config;
  auto window_is_the_cache = [&c](int, int end, const golden::Diff&,
                                  const kernels::KvCache& cache) {
    for (int l = 0; l < c.num_layers; ++l) {
      for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
        const int want = c.sliding(l) ? std::min(end, 15) : end;
        ASSERT_EQ(cache.length(l, h), want) << "layer " << l << " head " << h << " after " << end;
      }
    }
    // The sliding layers' rows are the most recent positions, in order.
    const kernels::LayerKvView sliding = cache.layer(0);
    for (int s = 0; s < sliding.lengths[0]; ++s) {
      EXPECT_EQ(sliding.position(0)[s], std::max(0, end - 15) + s) << "slot " << s;
    }
  };
  const golden::Diff d = golden::run_chunked(*model, cs, 40, 47, window_is_the_cache);
  std::cout << "[ gemma3 ] long, prefill 40 + chunk 7 + " << n - 47
            << " decode steps: max |logit - transformers| = " << d.max_abs << "\n";
  EXPECT_LT(d.max_abs, kTol);
  EXPECT_EQ(d.top1_mismatch, 0);
}

// The fixture has teeth: each Gemma-specific ingredient, dropped or misapplied, moves the logits
// far beyond the tolerance.
TEST(Gemma3Tiny, FixtureDetectsWrongGemmaHandling) {
  const nlohmann::json fx = fixture();
  const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
  const golden::Mutation mutations[] = {
      {"no sliding window (every layer global)", [](engine::Model& m) { m.config.window.clear(); }},
      {"one RoPE base for every layer",
       [](engine::Model& m) { m.config.rope_local = m.config.rope; }},
      {"unscaled embeddings", [](engine::Model& m) { m.config.embed_scale = 1.0f; }},
      {"no post-norms", [](engine::Model& m) { m.config.post_norms = false; }},
      {"SwiGLU instead of GeGLU", [](engine::Model& m) { m.config.ffn_act = engine::FfnAct::kSilu; }},
      {"no q/k norm", [](engine::Model& m) { m.config.qk_norm = false; }},
  };
  golden::expect_mutations_detected("gemma3", kModel, cs, mutations, 100 * kTol);
}

// A sliding window of 0 in the file is refused, naming the file and the key.
TEST(Gemma3Tiny, MissingSlidingWindowIsRefusedNamingTheKey) {
  std::ifstream in(kModel, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "gemma3.attention.sliding_window";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  // The value follows the key: u32 type (UINT32 = 4), then the u32 value.
  uint32_t type = 0;
  std::memcpy(&type, &bytes[at + key.size()], 4);
  ASSERT_EQ(type, 4u);
  std::memset(&bytes[at + key.size() + 4], 0, 4);
  const std::string path = std::string(KVB_BINARY_DIR) + "/gemma3_tiny_window0.gguf";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  try {
    engine::load_model(path);
    FAIL() << "a sliding window of 0 was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvb
