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
#include <iterator>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "workers/engine/forward.h"
#include "workers/engine/model.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf";
const std::string kFixture = std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.json";
constexpr double kTol = 1e-4;

nlohmann::json load_fixture() {
  std::ifstream f(kFixture);
  EXPECT_TRUE(f.good()) << kFixture << " missing: run scripts/make_gemma3_fixture.py";
  return nlohmann::json::parse(f);
}

const nlohmann::json& find_case(const nlohmann::json& fx, const std::string& name) {
  for (const auto& cs : fx["cases"]) {
    if (cs["name"] == name) return cs;
  }
  throw std::runtime_error("fixture has no case " + name);
}

struct Diff {
  double max_abs = 0;
  int top1_mismatch = 0;
};
Diff compare_rows(const std::vector<float>& got, const nlohmann::json& cs, int row0, int rows,
                  int V) {
  Diff d;
  for (int r = 0; r < rows; ++r) {
    const auto& ref = cs["logits"][row0 + r];
    const float* g = &got[static_cast<size_t>(r) * V];
    for (int v = 0; v < V; ++v) {
      d.max_abs = std::max(d.max_abs, std::fabs(g[v] - ref[v].get<double>()));
    }
    const int top1 = static_cast<int>(std::max_element(g, g + V) - g);
    if (top1 != cs["top1"][row0 + r].get<int>()) ++d.top1_mismatch;
  }
  return d;
}

Diff run_case(const engine::Model& model, const nlohmann::json& cs) {
  engine::Engine eng(model);
  const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
  kernels::KvCache cache = eng.new_cache(static_cast<int>(ids.size()));
  std::vector<float> logits;
  eng.forward(ids, cache, engine::LogitsMode::kAll, &logits);
  return compare_rows(logits, cs, 0, static_cast<int>(ids.size()), model.config.vocab_size);
}

TEST(Gemma3Tiny, ConfigFromGguf) {
  const nlohmann::json fx = load_fixture();
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
  const nlohmann::json fx = load_fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  int long_cases = 0;
  for (const auto& cs : fx["cases"]) {
    const size_t n = cs["ids"].size();
    const Diff d = run_case(*model, cs);
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
  const nlohmann::json fx = load_fixture();
  std::unique_ptr<engine::Model> model = engine::load_model(kModel);
  const nlohmann::json& cs = find_case(fx, "long");
  const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(ids.size()), V = model->config.vocab_size;
  engine::Engine eng(*model);
  kernels::KvCache cache = eng.new_cache(8);
  std::vector<float> logits;
  double max_abs = 0;
  int mismatches = 0;
  auto step = [&](int begin, int end, engine::LogitsMode mode) {
    eng.forward(std::span<const int32_t>(ids).subspan(begin, end - begin), cache, mode, &logits);
    const int row0 = mode == engine::LogitsMode::kAll ? begin : end - 1;
    const Diff d = compare_rows(logits, cs, row0, end - row0, V);
    max_abs = std::max(max_abs, d.max_abs);
    mismatches += d.top1_mismatch;
    for (int l = 0; l < model->config.num_layers; ++l) {
      for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
        const int want = model->config.sliding(l) ? std::min(end, 15) : end;
        ASSERT_EQ(cache.length(l, h), want) << "layer " << l << " head " << h << " after " << end;
      }
    }
    // The sliding layers' rows are the most recent positions, in order.
    const kernels::LayerKvView sliding = cache.layer(0);
    for (int s = 0; s < sliding.lengths[0]; ++s) {
      EXPECT_EQ(sliding.position(0)[s], std::max(0, end - 15) + s) << "slot " << s;
    }
  };
  step(0, 40, engine::LogitsMode::kAll);
  step(40, 47, engine::LogitsMode::kAll);
  for (int t = 47; t < n; ++t) step(t, t + 1, engine::LogitsMode::kLast);
  std::cout << "[ gemma3 ] long, prefill 40 + chunk 7 + " << n - 47
            << " decode steps: max |logit - transformers| = " << max_abs << "\n";
  EXPECT_LT(max_abs, kTol);
  EXPECT_EQ(mismatches, 0);
}

// The fixture has teeth: each Gemma-specific ingredient, dropped or misapplied, moves the logits
// far beyond the tolerance.
TEST(Gemma3Tiny, FixtureDetectsWrongGemmaHandling) {
  const nlohmann::json fx = load_fixture();
  const nlohmann::json& cs = find_case(fx, "long");
  struct Mutation {
    const char* what;
    void (*apply)(engine::Model&);
  };
  const Mutation mutations[] = {
      {"no sliding window (every layer global)", [](engine::Model& m) { m.config.window.clear(); }},
      {"one RoPE base for every layer",
       [](engine::Model& m) { m.config.rope_local = m.config.rope; }},
      {"unscaled embeddings", [](engine::Model& m) { m.config.embed_scale = 1.0f; }},
      {"no post-norms", [](engine::Model& m) { m.config.post_norms = false; }},
      {"SwiGLU instead of GeGLU", [](engine::Model& m) { m.config.ffn_act = engine::FfnAct::kSilu; }},
      {"no q/k norm", [](engine::Model& m) { m.config.qk_norm = false; }},
  };
  for (const Mutation& mu : mutations) {
    std::unique_ptr<engine::Model> model = engine::load_model(kModel);
    mu.apply(*model);
    const Diff d = run_case(*model, cs);
    std::cout << "[ gemma3 ] with " << mu.what << ": max |logit - transformers| = " << d.max_abs
              << "\n";
    EXPECT_GT(d.max_abs, 100 * kTol) << mu.what;
  }
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
