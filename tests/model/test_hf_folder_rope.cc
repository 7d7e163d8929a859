// Hugging Face folders with scaled RoPE (kvbench --model DIR) against transformers 4.53's eager f32
// logits: scripts/make_hf_rope_fixture.py's phi3_longrope_f16 (Phi3ForCausalLM: fused qkv_proj
// and gate_up_proj, partial rotary factor 0.5, LongRoPE with the long set, sliding window 20) and
// qwen2_yarn_f16 (Qwen2ForCausalLM with rope_scaling yarn). Every position of every prompt within
// 1e-4 (max abs), through one prefill and through the cache in pieces; the config facts each
// folder maps to; one mutation per feature showing the golden catches it; refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "golden_logits.h"
#include "workers/engine/engine.h"
#include "workers/engine/model.h"
#include "workers/formats/model_header.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

constexpr double kTol = 1e-4;
constexpr char kScript[] = "scripts/make_hf_rope_fixture.py";

std::string folder(const std::string& name) {
  return std::string(KVB_FIXTURES_DIR) + "/hf/" + name;
}

nlohmann::json fixture(const std::string& name) {
  return golden::load_fixture(folder(name) + ".json", kScript);
}

class HfRopeFolder : public ::testing::TestWithParam<std::string> {};

TEST_P(HfRopeFolder, EveryPositionMatchesTransformers) {
  const nlohmann::json fx = fixture(GetParam());
  std::unique_ptr<engine::Model> model = engine::load_model(folder(GetParam()));
  EXPECT_EQ(model->config.format, "hf");
  for (const auto& cs : fx["cases"]) {
    const golden::Diff d = golden::run_case(*model, cs);
    std::cout << "[ " << GetParam() << " ] " << cs["name"].get<std::string>() << ": "
              << cs["ids"].size() << " tokens, max |logit - transformers| = " << d.max_abs << "\n";
    EXPECT_LT(d.max_abs, kTol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"] << ", first at " << d.first_mismatch;
  }
  // Prefill 12, a chunk to 24 (past Phi-3's window of 20), then decode steps.
  const golden::Diff d = golden::run_chunked(*model, golden::find_case(fx["cases"], "long"), 12, 24,
                                             golden::expect_step_top1);
  std::cout << "[ " << GetParam() << " ] long in pieces: max |logit - transformers| = " << d.max_abs
            << "\n";
  EXPECT_LT(d.max_abs, kTol);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfRopeFolder,
                         ::testing::Values("phi3_longrope_f16", "qwen2_yarn_f16"));

TEST(HfRopeFolderMapping, Phi3Config) {
  const nlohmann::json fx = fixture("phi3_longrope_f16");
  std::unique_ptr<engine::Model> m = engine::load_model(folder("phi3_longrope_f16"));
  const engine::ModelConfig& c = m->config;
  EXPECT_EQ(c.arch, "phi3");
  EXPECT_TRUE(c.fused_qkv && c.fused_gate_up);
  EXPECT_EQ(c.head_dim, 12);
  EXPECT_EQ(c.rope.rot_dim, 6);  // partial_rotary_factor 0.5
  EXPECT_EQ(c.rope.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_EQ(c.rope_scaling, "longrope");
  EXPECT_EQ(c.rope_original_context, 16);
  EXPECT_EQ(c.rope_factor_set, "long");  // 256 > 16
  EXPECT_EQ(c.rope.freq_factors,
            fx["config"]["rope_scaling"]["long_factor"].get<std::vector<float>>());
  EXPECT_FLOAT_EQ(c.rope.attn_factor, std::sqrt(2.0f));  // sqrt(1 + ln(256/16) / ln 16)
  EXPECT_EQ(c.window, (std::vector<int>{20, 20}));
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(m->layers[0].wq.size(), 48u * 48u);
  EXPECT_EQ(m->layers[0].wk.size(), 24u * 48u);
  EXPECT_EQ(m->layers[0].w_gate.size(), 64u * 48u);
}

TEST(HfRopeFolderMapping, Qwen2YarnConfigIsTheGgufPathsYarn) {
  std::unique_ptr<engine::Model> m = engine::load_model(folder("qwen2_yarn_f16"));
  const engine::ModelConfig& c = m->config;
  EXPECT_EQ(c.rope_scaling, "yarn");
  EXPECT_EQ(c.rope_original_context, 64);
  // The frequency factors the GGUF reader computes for the same settings. Hand check: the
  // correction range is [floor(d(16)), ceil(d(0.25))] = [0, 3] with d(r) = 12 ln(64 / (2 pi r)) /
  // (2 ln 1e4), so dimension 0 keeps its frequency and 3..5 take frequency / 4.
  kernels::cpu::RopeParams r = c.rope;
  EXPECT_EQ(c.rope.freq_factors, engine::yarn_freq_factors(r, 4.0f, 64, 16.0, 0.25));
  EXPECT_FLOAT_EQ(c.rope.freq_factors.front(), 1.0f);  // dimension 0 extrapolates
  EXPECT_FLOAT_EQ(c.rope.freq_factors.back(), 4.0f);   // dimension 5 interpolates fully
  EXPECT_FLOAT_EQ(c.rope.attn_factor, 0.1f * std::log(4.0f) + 1.0f);
}

// Each feature done wrong moves the logits far beyond the tolerance (100x) on the long prompt.
TEST(HfRopeFolderMapping, FixturesDetectWrongHandling) {
  const golden::Mutation phi3[] = {
      {"the short LongRoPE factors instead of the long",
       [](engine::Model& m) {
         m.config.rope.freq_factors = {1.0f, 1.2f, 1.5f};
       }},
      {"no LongRoPE attention factor", [](engine::Model& m) { m.config.rope.attn_factor = 1; }},
      {"full rotary (partial_rotary_factor ignored)",
       [](engine::Model& m) {
         m.config.rope.rot_dim = m.config.head_dim;
         m.config.rope.freq_factors.resize(6, 1.0f);
       }},
      {"gate and up swapped (gate_up_proj split the wrong way)",
       [](engine::Model& m) {
         for (auto& l : m.layers) std::swap(l.w_gate, l.w_up);
       }},
      {"K and V swapped (qkv_proj split the wrong way)",
       [](engine::Model& m) {
         for (auto& l : m.layers) std::swap(l.wk, l.wv);
       }},
      {"sliding window ignored", [](engine::Model& m) { m.config.window.clear(); }},
  };
  const golden::Mutation qwen2[] = {
      {"YaRN frequency factors dropped",
       [](engine::Model& m) { m.config.rope.freq_factors.clear(); }},
      {"YaRN attention factor dropped", [](engine::Model& m) { m.config.rope.attn_factor = 1; }},
  };
  for (const auto& [name, muts] :
       {std::pair{"phi3_longrope_f16", std::span<const golden::Mutation>(phi3)},
        std::pair{"qwen2_yarn_f16", std::span<const golden::Mutation>(qwen2)}}) {
    const nlohmann::json fx = fixture(name);
    const nlohmann::json& cs = golden::find_case(fx["cases"], "long");
    std::unique_ptr<engine::Model> m = engine::load_model(folder(name));
    ASSERT_LT(golden::run_case(*m, cs).max_abs, kTol) << name;
    golden::expect_mutations_detected(name, folder(name), cs, muts, 100 * kTol);
  }
}

// `kvbench inspect DIR` names the scaling and the fused tensors by their HF names.
TEST(HfRopeFolderMapping, InspectNamesTheScaling) {
  std::string out, err;
  ASSERT_EQ(
      testing::kvbench({"inspect", folder("phi3_longrope_f16"), "--format", "csv"}, &out, &err), 0)
      << err;
  for (const char* want : {"neox, base 10000, 6 dims, longrope with the long factors (context 256 "
                           "> original 16; fixed for the run), cos/sin x 1.41421",
                           "fused QKV (qkv_proj); fused gate/up (gate_up_proj, gate first)"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
  ASSERT_EQ(testing::kvbench({"inspect", folder("qwen2_yarn_f16"), "--format", "csv"}, &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("12 dims, yarn over an original context of 64, cos/sin x 1.13863"),
            std::string::npos)
      << out;
}

// A copy of a fixture folder with config.json edited; the loader's message.
std::string load_error(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(KVB_BINARY_DIR) / ("test_hf_rope_" + name + "_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(folder(name)))
    fs::copy(e.path(), dir / e.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(1);
  try {
    engine::load_model(dir.string());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(HfRopeFolderMapping, RefusesWhatItDoesNotRun) {
  using J = nlohmann::json;
  auto has = [](const std::string& err, const std::string& want) {
    EXPECT_NE(err.find(want), std::string::npos) << "'" << want << "' not in: " << err;
  };
  has(load_error("qwen2_yarn_f16", [](J& c) { c["rope_scaling"]["factor"] = 8.0; }),
      "rope_scaling.factor' is 8 but max_position_embeddings / "
      "rope_scaling.original_max_position_embeddings = 256 / 64 = 4");
  has(load_error("qwen2_yarn_f16", [](J& c) { c["rope_scaling"]["mscale"] = 1.0; }),
      "rope_scaling.mscale' is set");
  has(load_error("qwen2_yarn_f16", [](J& c) { c["rope_scaling"]["rope_type"] = "longrope"; }),
      "'longrope', which kvbench does not support for [\"Qwen2ForCausalLM\"]");
  has(load_error("qwen2_yarn_f16", [](J& c) { c["partial_rotary_factor"] = 0.5; }),
      "key 'partial_rotary_factor' must be 1 for Qwen2ForCausalLM");
  has(load_error("phi3_longrope_f16",
                 [](J& c) {
                   c["rope_scaling"]["long_factor"] = {1.0, 2.0};
                 }),
      "rope_scaling.long_factor' must be a list of 3 numbers");
  has(load_error("phi3_longrope_f16", [](J& c) { c["rope_scaling"]["short_factor"][1] = -1.0; }),
      "rope_scaling.short_factor[1]' = -1 is not a finite positive number");
  has(load_error("phi3_longrope_f16", [](J& c) { c["partial_rotary_factor"] = 0.1; }),
      "gives 1 rotary dimensions of head_dim 12");
  has(load_error("phi3_longrope_f16", [](J& c) { c["rope_scaling"]["type"] = "linear"; }),
      "rope_scaling.factor' is missing (rope_type linear)");
  has(load_error("phi3_longrope_f16", [](J& c) { c["intermediate_size"] = 32; }),
      "mlp.gate_up_proj.weight");
}

}  // namespace
}  // namespace kvb
