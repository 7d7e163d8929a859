// Hugging Face checkpoint folders (kvbench --model DIR) against transformers: the tiny
// random-weight folders scripts/make_hf_folder_fixture.py writes under tests/fixtures/hf/
// (Llama f32 in 2 shards with llama3 rope_scaling, Qwen3 bf16, Gemma 3 f16 with sliding layers,
// Mistral f16 with a sliding window, Qwen2 f16 with q/k/v biases) and transformers' eager f32
// logits at every position of three prompts, computed from the folder as from_pretrained loads it.
// kvbench converts the same stored values to f32, so only the summation order differs: 1e-4 max
// abs, as the GGUF goldens, at every position of prefill, chunked prefill and single-token decode.
// The folder's tokenizer.json (a byte-level BPE trained with `tokenizers`) is checked against
// `tokenizers`' ids, and the prompt ids (with BOS where tokenizer_config.json's add_bos_token says
// so) against the ones the golden was computed on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>

#include "harness/model_info.h"
#include "run_kvbench.h"
#include "workers/engine/engine.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

constexpr double kTol = 1e-4;
const std::vector<std::string> kFolders = {"llama_f32_sharded", "qwen3_bf16", "gemma3_f16",
                                           "mistral_f16", "qwen2_f16"};

std::string folder(const std::string& name) {
  return std::string(KVB_FIXTURES_DIR) + "/hf/" + name;
}

nlohmann::json load_fixture(const std::string& name) {
  std::ifstream f(folder(name) + ".json");
  EXPECT_TRUE(f.good()) << folder(name) << ".json missing: run scripts/make_hf_folder_fixture.py";
  return nlohmann::json::parse(f);
}

struct Diff {
  double max_abs = 0;
  int top1_mismatch = 0;
};
// Rows [row0, row0 + rows) of a case against `got` (rows x V logits).
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
    d.top1_mismatch += top1 != cs["top1"][row0 + r].get<int>();
  }
  return d;
}

Diff prefill_case(const engine::Model& model, const nlohmann::json& cs) {
  engine::Engine eng(model);
  const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
  kernels::KvCache cache = eng.new_cache(static_cast<int>(ids.size()));
  std::vector<float> logits;
  eng.forward(ids, cache, engine::LogitsMode::kAll, &logits);
  return compare_rows(logits, cs, 0, static_cast<int>(ids.size()), model.config.vocab_size);
}

// Max abs diff over every case's every position (prefill).
double max_over_cases(const engine::Model& model, const nlohmann::json& fx) {
  double m = 0;
  for (const auto& cs : fx["cases"]) m = std::max(m, prefill_case(model, cs).max_abs);
  return m;
}

class HfFolder : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFolder, PrefillLogitsMatchTransformers) {
  const nlohmann::json fx = load_fixture(GetParam());
  std::unique_ptr<engine::Model> model = engine::load_model(folder(GetParam()));
  EXPECT_EQ(model->config.format, "hf");
  EXPECT_EQ(model->config.name, GetParam());
  EXPECT_EQ(model->config.vocab_size, fx["config"]["vocab_size"].get<int>());
  for (const auto& cs : fx["cases"]) {
    const Diff d = prefill_case(*model, cs);
    std::cout << "[ " << GetParam() << " ] " << cs["name"].get<std::string>() << ": "
              << cs["ids"].size() << " tokens, max |logit - transformers| = " << d.max_abs << "\n";
    EXPECT_LT(d.max_abs, kTol) << cs["name"];
    EXPECT_EQ(d.top1_mismatch, 0) << cs["name"];
  }
}

// The long prompt through the KV cache in pieces: a prefill, a chunk, then decode steps.
TEST_P(HfFolder, ChunkedPrefillAndDecodeMatchTransformers) {
  const nlohmann::json fx = load_fixture(GetParam());
  std::unique_ptr<engine::Model> model = engine::load_model(folder(GetParam()));
  const nlohmann::json& cs = fx["cases"][2];
  ASSERT_EQ(cs["name"], "long");
  const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(ids.size()), V = model->config.vocab_size;
  ASSERT_GE(n, 30);
  engine::Engine eng(*model);
  kernels::KvCache cache = eng.new_cache(4);  // small: the cache must grow
  std::vector<float> logits;
  double max_abs = 0;
  auto step = [&](int begin, int end, engine::LogitsMode mode) {
    eng.forward(std::span<const int32_t>(ids).subspan(begin, end - begin), cache, mode, &logits);
    const int row0 = mode == engine::LogitsMode::kAll ? begin : end - 1;
    const Diff d = compare_rows(logits, cs, row0, end - row0, V);
    max_abs = std::max(max_abs, d.max_abs);
    EXPECT_EQ(d.top1_mismatch, 0) << "tokens [" << begin << ", " << end << ")";
  };
  step(0, 16, engine::LogitsMode::kAll);
  step(16, 24, engine::LogitsMode::kAll);
  for (int t = 24; t < n; ++t) step(t, t + 1, engine::LogitsMode::kLast);
  std::cout << "[ " << GetParam() << " ] long, prefill 16 + chunk 8 + " << n - 24
            << " decode steps: max |logit - transformers| = " << max_abs << "\n";
  EXPECT_LT(max_abs, kTol);
}

// The folder's own tokenizer (tokenizer.json + tokenizer_config.json) gives `tokenizers`' ids,
// and the prompts encode to the ids the golden was computed on (BOS as add_bos_token says).
TEST_P(HfFolder, TokenizerMatchesTokenizersAndPrompts) {
  const nlohmann::json fx = load_fixture(GetParam());
  workers::LoadedModel lm = workers::load_model_and_tokenizer(folder(GetParam()), "");
  for (const auto& tc : fx["tokenizer_cases"]) {
    EXPECT_EQ(workers::encode_text(lm, tc["text"], true, false),
              tc["ids"].get<std::vector<int32_t>>())
        << tc["text"];
  }
  for (const auto& cs : fx["cases"]) {
    EXPECT_EQ(workers::encode_prompt(lm, cs["text"], false, ""),
              cs["ids"].get<std::vector<int32_t>>())
        << cs["name"];
  }
  // tokenizer_config.json's template: a ChatML one, parsed and rendered by the model's own Jinja.
  EXPECT_EQ(tokenizer::detect_chat_format(lm.chat_template), tokenizer::ChatFormat::kChatML);
  ASSERT_NE(lm.chat, nullptr) << lm.chat_error;
  EXPECT_EQ(workers::chat_frame(lm, "").suffix.rfind("<|im_end|>\n<|im_start|>assistant\n"), 0u);
  EXPECT_EQ(lm.tokenizer->eos_id(), lm.tokenizer->find_token("<|im_end|>"));
  // The tokenizer-only path (the sweep's coordinator) agrees.
  workers::LoadedModel tok = workers::load_tokenizer_only(folder(GetParam()), "");
  EXPECT_EQ(tok.add_bos, lm.add_bos);
  EXPECT_EQ(tok.chat_template, lm.chat_template);
}

// validate / inspect read the same facts from the headers alone.
TEST_P(HfFolder, ModelInfoFromHeaders) {
  const nlohmann::json fx = load_fixture(GetParam());
  const harness::ModelInfo info = harness::read_model_info(folder(GetParam()));
  std::unique_ptr<engine::Model> model = engine::load_model(folder(GetParam()));
  EXPECT_EQ(info.format, "hf");
  EXPECT_EQ(info.arch, model->config.arch);
  EXPECT_EQ(info.num_params, model->num_parameters());
  const std::string dtype = fx["dtype"];
  EXPECT_EQ(info.weight_type, dtype == "float32" ? "F32" : dtype == "bfloat16" ? "BF16" : "F16");
  EXPECT_EQ(info.chat_template, "tokenizer_config.json / chat_template.jinja");
  EXPECT_EQ(info.chat_template_error, "");
  EXPECT_EQ(info.max_seq_len, fx["config"]["max_position_embeddings"].get<int>());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFolder, ::testing::ValuesIn(kFolders));

// What each family's folder maps to, and that the golden catches each mapping done wrong: the
// mutation must move the logits far beyond the tolerance.
TEST(HfFolderMapping, FixturesDetectWrongHandling) {
  struct Mutation {
    const char* folder;
    const char* what;
    std::function<void(engine::Model&)> apply;
  };
  const std::vector<Mutation> mutations = {
      {"llama_f32_sharded", "adjacent-pair RoPE (GGUF llama's kNorm) on unpermuted HF rows",
       [](engine::Model& m) { m.config.rope.style = kernels::cpu::RopeStyle::kNorm; }},
      {"llama_f32_sharded", "llama3 frequency factors dropped",
       [](engine::Model& m) { m.config.rope.freq_factors.clear(); }},
      {"qwen3_bf16", "q/k norm weights ignored",
       [](engine::Model& m) {
         for (auto& l : m.layers) std::fill(l.q_norm.begin(), l.q_norm.end(), 1.0f);
       }},
      {"gemma3_f16", "norm weights used as stored (w instead of 1 + w)",
       [](engine::Model& m) {
         for (auto& l : m.layers)
           for (float& x : l.attn_norm) x -= 1.0f;
       }},
      {"gemma3_f16", "sliding window ignored",
       [](engine::Model& m) { m.config.window.assign(m.config.num_layers, 0); }},
      {"gemma3_f16", "softmax scale 1/sqrt(head_dim) instead of query_pre_attn_scalar",
       [](engine::Model& m) { m.config.attn_scale = 0; }},
      {"qwen2_f16", "q/k/v biases dropped",
       [](engine::Model& m) {
         for (auto& l : m.layers) {
           std::fill(l.bq.begin(), l.bq.end(), 0.0f);
           std::fill(l.bk.begin(), l.bk.end(), 0.0f);
           std::fill(l.bv.begin(), l.bv.end(), 0.0f);
         }
       }},
      {"mistral_f16", "sliding window ignored", [](engine::Model& m) { m.config.window.clear(); }},
  };
  for (const Mutation& mu : mutations) {
    const nlohmann::json fx = load_fixture(mu.folder);
    std::unique_ptr<engine::Model> model = engine::load_model(folder(mu.folder));
    ASSERT_LT(max_over_cases(*model, fx), kTol) << mu.folder;
    mu.apply(*model);
    const double d = max_over_cases(*model, fx);
    std::cout << "[ " << mu.folder << " ] " << mu.what << ": max diff " << d << "\n";
    EXPECT_GT(d, 1e-2) << mu.folder << ": " << mu.what;
  }
}

TEST(HfFolderMapping, ConfigOfEachFamily) {
  std::unique_ptr<engine::Model> llama = engine::load_model(folder("llama_f32_sharded"));
  EXPECT_EQ(llama->config.arch, "llama");
  EXPECT_EQ(llama->config.rope.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_EQ(llama->config.rope.freq_factors.size(), 6u);  // head_dim 12 / 2
  EXPECT_FALSE(llama->config.tied_embeddings);
  EXPECT_TRUE(llama->config.window.empty());
  std::unique_ptr<engine::Model> qwen3 = engine::load_model(folder("qwen3_bf16"));
  EXPECT_EQ(qwen3->config.arch, "qwen3");
  EXPECT_EQ(qwen3->config.head_dim, 16);  // config.json head_dim, not 48 / 4
  EXPECT_TRUE(qwen3->config.qk_norm && qwen3->config.tied_embeddings);
  EXPECT_TRUE(qwen3->output.empty());
  std::unique_ptr<engine::Model> qwen2 = engine::load_model(folder("qwen2_f16"));
  EXPECT_EQ(qwen2->config.arch, "qwen2");
  EXPECT_TRUE(qwen2->config.qkv_bias && !qwen2->config.qk_norm);
  EXPECT_EQ(qwen2->layers[1].bk.size(), 24u);  // 2 KV heads x head_dim 12
  std::unique_ptr<engine::Model> gemma = engine::load_model(folder("gemma3_f16"));
  EXPECT_EQ(gemma->config.arch, "gemma3");
  EXPECT_EQ(gemma->config.window, (std::vector<int>{4, 4, 0}));
  EXPECT_EQ(gemma->config.rope_local.theta, 100.0f);
  EXPECT_EQ(gemma->config.rope.theta, 10000.0f);
  EXPECT_FLOAT_EQ(gemma->config.attn_scale, 1.0f / std::sqrt(24.0f));
  EXPECT_FLOAT_EQ(gemma->config.embed_scale, std::sqrt(48.0f));
  std::unique_ptr<engine::Model> mistral = engine::load_model(folder("mistral_f16"));
  EXPECT_EQ(mistral->config.arch, "llama");
  EXPECT_EQ(mistral->config.window, (std::vector<int>{5, 5}));
}

// Max |logit a - logit b| over every position of the cases' prompts, each model from an empty
// cache (a's and b's logits must have the same size).
double max_logit_diff(const engine::Model& ma, const engine::Model& mb,
                      const nlohmann::json& cases) {
  engine::Engine ea(ma), eb(mb);
  double max_abs = 0;
  for (const auto& cs : cases) {
    const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
    std::vector<float> a, b;
    kernels::KvCache ca = ea.new_cache(static_cast<int>(ids.size()));
    kernels::KvCache cb = eb.new_cache(static_cast<int>(ids.size()));
    ea.forward(ids, ca, engine::LogitsMode::kAll, &a);
    eb.forward(ids, cb, engine::LogitsMode::kAll, &b);
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      max_abs = std::max(max_abs, double(std::fabs(a[i] - b[i])));
  }
  return max_abs;
}

// The same f16 weights as a GGUF "llama" file (convert_hf_to_gguf's Q/K row permutation, run
// with adjacent-pair RoPE) and as the folder (unpermuted, NEOX RoPE) give the same logits; the
// GGUF llama path has no sliding window, so the folder's is switched off for the comparison.
TEST(HfFolderMapping, FolderAndGgufOfTheSameWeightsAgree) {
  const nlohmann::json fx = load_fixture("mistral_f16");
  std::unique_ptr<engine::Model> hf = engine::load_model(folder("mistral_f16"));
  std::unique_ptr<engine::Model> gg =
      engine::load_model(std::string(KVB_FIXTURES_DIR) + "/hf/mistral_f16_as_llama.gguf");
  EXPECT_EQ(gg->config.rope.style, kernels::cpu::RopeStyle::kNorm);
  EXPECT_EQ(hf->config.rope.style, kernels::cpu::RopeStyle::kNeox);
  EXPECT_NE(hf->layers[0].wq, gg->layers[0].wq);  // permuted rows
  EXPECT_EQ(hf->layers[0].wv, gg->layers[0].wv);
  hf->config.window.clear();
  const double max_abs = max_logit_diff(*hf, *gg, fx["cases"]);
  std::cout << "[ mistral_f16 ] folder vs GGUF of the same weights (window off): max |diff| = "
            << max_abs << "\n";
  EXPECT_LT(max_abs, kTol);
}

// Llama 3's rope scaling both ways: the folder's config.json rope_scaling (llama3) and the GGUF's
// rope_freqs.weight that convert_hf_to_gguf.py writes for it (scripts/make_hf_folder_fixture.py),
// over the same f32 weights; the folder matches transformers (LogitsMatchTransformers), so the
// GGUF path's llama3 scaling does too. The long prompt crosses every band of the factors.
TEST(HfFolderMapping, Llama3ScalingAsGgufAgreesWithTheFolder) {
  const nlohmann::json fx = load_fixture("llama_f32_sharded");
  std::unique_ptr<engine::Model> hf = engine::load_model(folder("llama_f32_sharded"));
  std::unique_ptr<engine::Model> gg = engine::load_model(
      std::string(KVB_FIXTURES_DIR) + "/hf/llama_f32_sharded_as_llama.gguf");
  ASSERT_EQ(gg->config.rope.freq_factors.size(), hf->config.rope.freq_factors.size());
  ASSERT_FALSE(gg->config.rope.freq_factors.empty());
  for (size_t i = 0; i < gg->config.rope.freq_factors.size(); ++i) {
    EXPECT_NEAR(gg->config.rope.freq_factors[i], hf->config.rope.freq_factors[i], 1e-6) << i;
  }
  const double max_abs = max_logit_diff(*hf, *gg, fx["cases"]);
  std::cout << "[ llama_f32_sharded ] folder vs GGUF with rope_freqs.weight: max |diff| = "
            << max_abs << "\n";
  EXPECT_LT(max_abs, kTol);
  // Teeth: the GGUF without its factors is another model.
  gg->config.rope.freq_factors.clear();
  const nlohmann::json last = nlohmann::json::array({fx["cases"].back()});
  EXPECT_GT(max_logit_diff(*hf, *gg, last), 1e-2)
      << "dropping rope_freqs.weight should change the logits";
}

// `kvbench inspect DIR` reports the folder with the loader's facts.
TEST(HfFolderMapping, InspectPrintsTheFolder) {
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"inspect", folder("gemma3_f16"), "--format", "csv"}, &out, &err), 0)
      << err;
  for (const char* want : {"format,hf", "architecture,gemma3", "\"F16, 0.06984 M parameters\"",
                           "layer kinds,\"sliding 0-1 (window 4, RoPE neox, base 100, 16 dims); "
                           "global 2\"",
                           "chat template,tokenizer_config.json chat_template (199 bytes)",
                           // Since the chat merge every template renders through minja.
                           "chat format kvbench renders,the model's own Jinja template (minja)"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
  ASSERT_EQ(testing::kvbench({"inspect", folder("llama_f32_sharded")}, &out, &err), 0) << err;
  EXPECT_NE(out.find("llama3 frequency factors"), std::string::npos) << out;
  EXPECT_NE(out.find("HF tokenizer.json (288 tokens), add BOS yes"), std::string::npos) << out;
  const std::string empty = std::string(KVB_BINARY_DIR) + "/test_hf_folder_empty";
  std::filesystem::create_directories(empty);
  EXPECT_EQ(testing::kvbench({"inspect", empty}, &out, &err), 2);
  EXPECT_NE(err.find("is a directory without config.json"), std::string::npos) << err;
}

// A sweep config names folders as it names files: validate reads their headers (format hf, the
// folder's name as the model name, a trailing slash included).
TEST(HfFolderMapping, ValidateAcceptsFoldersInSweepConfigs) {
  const std::string dir =
      std::string(KVB_BINARY_DIR) + "/test_hf_folder_validate_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string yaml = dir + "/hf.yaml";
  std::ofstream(yaml) << "models:\n  - path: " << folder("qwen3_bf16")
                      << "\n  - {path: " << folder("gemma3_f16")
                      << "/}\ntasks:\n  - name: niah\n    options: "
                      << "{context_lengths: [256], depths: [0], haystack: noise, chat: false}\n"
                      << "policies: [full]\n";
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"validate", yaml}, &out, &err), 0) << err << out;
  EXPECT_NE(out.find("| qwen3_bf16 | hf     | qwen3  | BF16 |"), std::string::npos) << out;
  EXPECT_NE(out.find("| gemma3_f16 | hf     | gemma3 | F16  |"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvb
