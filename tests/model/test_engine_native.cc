// The CPU engine on a GGUF model's own quantized blocks (--dtype native, issue 35) on SmolLM2:
// 1. row laws that prefix reuse and decode batches rest on: a prompt prefilled in two pieces, and
//    a decode step taken in a batch, give the bits of one pass and of a lone step;
// 2. the cost of 8-bit activations against the f32 reference on the same (dequantized) weights,
//    as a bound on the logits and a top-1 agreement rate (figures printed);
// 3. a sweep's provenance names the dtype, "cpu (native quantized weights)".
// The policy laws on native weights are in test_policy_laws (SmolLM2NativeWeights); the kernels'
// own tests in test_qmatmul.
#include <gtest/gtest.h>
#include <omp.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine_gap.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/qmatmul.h"
#include "run_kvbench.h"
#include "tp_test_model.h"
#include "workers/engine/engine.h"
#include "workers/engine/engine_types.h"
#include "workers/engine/model.h"
#include "workers/formats/gguf.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {

const std::string kSmol = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kSmolFixture = std::string(KVB_FIXTURES_DIR) + "/engine/smollm2_logits.json";

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class SmolNative : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::ifstream(kSmol).good()) << kSmol << " missing: run scripts/fetch_models.sh";
    std::ifstream f(kSmolFixture);
    ASSERT_TRUE(f.good()) << kSmolFixture;
    fixture_ = nlohmann::json::parse(f);
    model_ = engine::load_model(kSmol);
  }
  nlohmann::json fixture_;
  std::unique_ptr<engine::Model> model_;
};

// Every linear layer of this file runs in its blocks: 30 layers x 7 matrices and the (tied)
// embedding are of types qmatmul takes.
TEST_F(SmolNative, TheFilesMatricesAreOfTypesTheProductsTake) {
  std::map<std::string, int> types;
  int quantized = 0;
  for (const auto& t : model_->gguf->tensors()) {
    if (t.dims.size() != 2) continue;
    ++types[kernels::cpu::ggml_type_name(t.type)];
    quantized += kernels::cpu::qmatmul_supports(t.type);
  }
  std::string seen;
  for (const auto& [name, count] : types) seen += name + " x" + std::to_string(count) + " ";
  std::printf("SmolLM2 matrices: %s\n", seen.c_str());
  EXPECT_EQ(quantized, 30 * 7 + 1) << seen;
}

TEST_F(SmolNative, PiecesAndBatchesGiveTheBitsOfOnePass) {
  engine::Engine eng(*model_, nullptr, engine::DType::kNative);
  const int V = model_->config.vocab_size;
  std::vector<int32_t> ids = fixture_["cases"][1]["ids"].get<std::vector<int32_t>>();
  ids.resize(std::min<size_t>(ids.size(), 40));
  const int n = static_cast<int>(ids.size());
  kernels::KvCache whole = eng.new_cache(n + 8);
  std::vector<float> all;
  eng.forward(ids, whole, engine::LogitsMode::kAll, &all);
  ASSERT_EQ(all.size(), static_cast<size_t>(n) * V);
  // The same prompt in two pieces (prefix reuse continues a prefill so).
  kernels::KvCache pieces = eng.new_cache(n + 8);
  std::vector<float> first, second;
  const int cut = 17;
  eng.forward({ids.data(), static_cast<size_t>(cut)}, pieces, engine::LogitsMode::kAll, &first);
  eng.forward({ids.data() + cut, static_cast<size_t>(n - cut)}, pieces, engine::LogitsMode::kAll,
              &second);
  EXPECT_TRUE(same_bits(first.data(), all.data(), first.size()));
  EXPECT_TRUE(same_bits(second.data(), all.data() + first.size(), second.size()));
  // A decode step alone and in a batch of three copies of the cache.
  const int32_t t = ids[3];
  kernels::KvCache alone = whole;
  std::vector<float> one;
  eng.forward({&t, 1}, alone, engine::LogitsMode::kLast, &one);
  std::vector<kernels::KvCache> copies(3, whole);
  std::vector<kernels::KvCache*> ptrs = {&copies[0], &copies[1], &copies[2]};
  std::vector<policies::Policy*> none(3, nullptr);
  std::vector<float> batch;
  eng.decode_batch(std::vector<int32_t>{ids[5], t, ids[7]}, ptrs, none, &batch);
  ASSERT_EQ(batch.size(), 3u * V);
  EXPECT_TRUE(same_bits(batch.data() + V, one.data(), V));
}

// The engine quantizes a layer's normed input once for its Q, K and V products (and once for gate
// and up): the bits of the three (two) products each quantizing it again (Backend's default).
TEST_F(SmolNative, SharedInputProductsAreTheSeparateProducts) {
  engine::Engine eng(*model_, nullptr, engine::DType::kNative);
  std::vector<int32_t> ids = fixture_["cases"][0]["ids"].get<std::vector<int32_t>>();
  ids.resize(std::min<size_t>(ids.size(), 24));
  const int n = static_cast<int>(ids.size());
  kernels::KvCache cache = eng.new_cache(n);
  std::vector<float> logits;
  eng.forward(ids, cache, engine::LogitsMode::kLast, &logits);  // fills the activations
  engine::Backend& be = eng.backend();
  const auto& c = model_->config;
  auto read = [&](engine::Act a, size_t width) {
    std::vector<float> v(static_cast<size_t>(n) * width);
    be.download(a, v.size(), v.data());
    return v;
  };
  const size_t qd = static_cast<size_t>(c.num_heads) * c.head_dim;
  const size_t kvd = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  for (int layer : {0, 7, c.num_layers - 1}) {
    SCOPED_TRACE(layer);
    be.rmsnorm(engine::Act::kXb, engine::Act::kX, layer, engine::Norm::kAttn, 0, n);
    be.linear_qkv(layer, n);
    const auto q = read(engine::Act::kQ, qd), k = read(engine::Act::kK, kvd),
               v = read(engine::Act::kV, kvd);
    be.linear_gate_up(layer, n);
    const auto g = read(engine::Act::kGate, c.hidden_dim), u = read(engine::Act::kUp, c.hidden_dim);
    be.engine::Backend::linear_qkv(layer, n);
    be.engine::Backend::linear_gate_up(layer, n);
    EXPECT_TRUE(same_bits(q.data(), read(engine::Act::kQ, qd).data(), q.size()));
    EXPECT_TRUE(same_bits(k.data(), read(engine::Act::kK, kvd).data(), k.size()));
    EXPECT_TRUE(same_bits(v.data(), read(engine::Act::kV, kvd).data(), v.size()));
    EXPECT_TRUE(same_bits(g.data(), read(engine::Act::kGate, c.hidden_dim).data(), g.size()));
    EXPECT_TRUE(same_bits(u.data(), read(engine::Act::kUp, c.hidden_dim).data(), u.size()));
  }
}

TEST_F(SmolNative, LogitsNearF32) {
  // The prompts of the transformers golden (test_engine_smollm2), every position of their first
  // 128 tokens.
  engine::Engine native(*model_, nullptr, engine::DType::kNative), f32(*model_);
  const testing::LogitsGap g =
      testing::logits_gap(native, f32, fixture_["cases"], 128, model_->config.vocab_size);
  ASSERT_GT(g.rows, 0);
  std::printf(
      "SmolLM2 native vs f32: %d positions, max |logit diff| %.4f (%.2f%% of max |logit|), "
      "top-1 agreement %d/%d\n",
      g.rows, g.max_diff, 100 * g.max_rel, g.top1, g.rows);
  // The weights are the same numbers on both sides (the f32 engine reads the file's blocks
  // dequantized); the difference is the 8-bit rounding of every linear layer's input alone.
  // Measured (2026-12-03): max diff 3.43 (12.8% of the largest logit), top-1 163/170. Bounds with
  // a 2x margin and 90%. LogitsNearLlamaCpp holds the same path to llama.cpp itself.
  EXPECT_LT(g.max_diff, 7.0);
  EXPECT_GE(g.top1, g.rows * 90 / 100);
}

// llama.cpp's own logits (scripts/make_native_llamacpp_fixture.py: llama-cpp-python 0.3.36, one
// thread, an f32 KV cache) on the prompts of the transformers golden: native weights are
// llama.cpp's arithmetic family, so they must agree with it about as well as the f32 reference
// does; both figures are printed.
TEST_F(SmolNative, LogitsNearLlamaCpp) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/smollm2_native_llamacpp.json";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  const nlohmann::json golden = nlohmann::json::parse(f);
  const std::vector<int> sample = golden["sample_ids"].get<std::vector<int>>();
  engine::Engine native(*model_, nullptr, engine::DType::kNative), f32(*model_);
  const int V = model_->config.vocab_size;
  double max_native = 0, max_f32 = 0, sum_native = 0, sum_f32 = 0;
  int rows = 0, top1_native = 0, top1_f32 = 0, compared = 0;
  for (const auto& cs : golden["cases"]) {
    const std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
    kernels::KvCache ca = native.new_cache(static_cast<int>(ids.size()));
    kernels::KvCache cb = f32.new_cache(static_cast<int>(ids.size()));
    std::vector<float> la, lb;
    native.forward(ids, ca, engine::LogitsMode::kAll, &la);
    f32.forward(ids, cb, engine::LogitsMode::kAll, &lb);
    for (const auto& row : cs["rows"]) {
      const size_t p = row["pos"].get<size_t>();
      const float* a = &la[p * V];
      const float* b = &lb[p * V];
      auto check = [&](int id, double theirs) {
        max_native = std::max(max_native, std::fabs(a[id] - theirs));
        max_f32 = std::max(max_f32, std::fabs(b[id] - theirs));
        sum_native += std::fabs(a[id] - theirs);
        sum_f32 += std::fabs(b[id] - theirs);
        ++compared;
      };
      for (const auto& t : row["top"]) check(t[0].get<int>(), t[1].get<double>());
      for (size_t i = 0; i < sample.size(); ++i) check(sample[i], row["sample"][i].get<double>());
      const int theirs = row["top"][0][0].get<int>();
      top1_native += std::max_element(a, a + V) - a == theirs;
      top1_f32 += std::max_element(b, b + V) - b == theirs;
      ++rows;
    }
  }
  std::printf(
      "SmolLM2 against llama.cpp, %d positions, %d logits: native max |diff| %.4f, mean %.4f, "
      "top-1 %d/%d; f32 reference max |diff| %.4f, mean %.4f, top-1 %d/%d\n",
      rows, compared, max_native, sum_native / compared, top1_native, rows, max_f32,
      sum_f32 / compared, top1_f32, rows);
  // Measured (2026-12-03, llama.cpp with an f32 KV cache): native max 1.60, mean 0.177, top-1
  // 163/170; the f32 reference max 2.00, mean 0.184, top-1 164/170. The native path is as close
  // to llama.cpp as the reference is, not closer: what separates kvbench from llama.cpp here is
  // not the weights' arithmetic (rounding the activations' scales to f16 as llama.cpp stores
  // them left the mean at 0.177) but the other operations' orders. Bounds: 2x the maximum and
  // the mean, 93% top-1, and no further from llama.cpp than the reference by more than 10%.
  EXPECT_LT(max_native, 3.2);
  EXPECT_LT(sum_native / compared, 0.36);
  EXPECT_GE(top1_native, rows * 93 / 100);
  EXPECT_LE(sum_native, 1.1 * sum_f32);
}

std::vector<float> all_logits(engine::Engine& eng, const std::vector<int32_t>& ids) {
  kernels::KvCache cache = eng.new_cache(static_cast<int>(ids.size()));
  std::vector<float> logits;
  eng.forward(ids, cache, engine::LogitsMode::kAll, &logits);
  return logits;
}

// Loaded for --dtype native (what the sweep and generate do), a model keeps its matrices and
// embedding only in their blocks: no f32 copy of them is resident, it counts the same
// parameters, and it runs the bits of the native engine on the fully loaded model. An f32
// engine on it is refused.
void expect_blocks_only_load_runs_the_same_bits(const std::string& path,
                                                const std::vector<int32_t>& ids) {
  std::unique_ptr<engine::Model> full = engine::load_model(path);
  std::unique_ptr<engine::Model> blocks = engine::load_model(path, /*native_blocks=*/true);
  EXPECT_TRUE(blocks->native_blocks);
  EXPECT_TRUE(blocks->token_embedding.empty());
  EXPECT_EQ(blocks->output.empty(), true);
  for (const engine::LayerWeights& w : blocks->layers) {
    EXPECT_TRUE(w.wq.empty() && w.wk.empty() && w.wv.empty() && w.wo.empty() &&
                w.w_gate.empty() && w.w_up.empty() && w.w_down.empty());
    EXPECT_EQ(w.attn_norm.size(), static_cast<size_t>(blocks->config.dim));
  }
  EXPECT_GT(blocks->blocks_only_params, 0u);
  EXPECT_EQ(blocks->num_parameters(), full->num_parameters());
  engine::Engine a(*full, nullptr, engine::DType::kNative);
  engine::Engine b(*blocks, nullptr, engine::DType::kNative);
  const std::vector<float> la = all_logits(a, ids), lb = all_logits(b, ids);
  ASSERT_EQ(la.size(), ids.size() * blocks->config.vocab_size);
  ASSERT_EQ(lb.size(), la.size());
  EXPECT_TRUE(same_bits(la.data(), lb.data(), la.size())) << path;
  try {
    engine::Engine f32(*blocks);
    ADD_FAILURE() << "an f32 engine ran a model loaded for --dtype native";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was loaded for --dtype native"), std::string::npos)
        << e.what();
  }
}

TEST_F(SmolNative, BlocksOnlyLoadRunsTheSameBits) {  // tied classifier (the embedding's blocks)
  std::vector<int32_t> ids = fixture_["cases"][1]["ids"].get<std::vector<int32_t>>();
  ids.resize(std::min<size_t>(ids.size(), 40));
  expect_blocks_only_load_runs_the_same_bits(kSmol, ids);
}

TEST(NativeLoad, UntiedQ8_0ModelRunsTheSameBitsFromItsBlocks) {
  const std::string path = std::string(KVB_BINARY_DIR) + "/test_engine_native_q8_" +
                           std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(testing::write_random_llama_gguf(path, {}, 8, /*q8_0=*/true));
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 37 + 5) % 512);
  expect_blocks_only_load_runs_the_same_bits(path, ids);
  std::filesystem::remove(path);
}

// A model none of whose matrices the quantized product takes (F16 here, Phi-3's fused QKV and
// gate-up) loads whole for --dtype native, and the native engine runs the f32 reference's bits.
TEST(NativeLoad, MatricesOfOtherTypesLoadInF32AndRunTheReferenceBits) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/phi3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path, /*native_blocks=*/true);
  EXPECT_EQ(m->blocks_only_params, 0u);
  ASSERT_FALSE(m->layers.empty());
  EXPECT_FALSE(m->layers[0].wq.empty());
  EXPECT_FALSE(m->layers[0].w_gate.empty());
  // The weights' path alone: both engines with an f32 cache.
  engine::Engine native(*m, nullptr, engine::DType::kNative, engine::KvRows::kF32);
  std::unique_ptr<engine::Model> f = engine::load_model(path);
  engine::Engine f32(*f);
  const std::vector<int32_t> ids = {1, 7, 42, 99, 3, 64, 12};
  const std::vector<float> a = all_logits(native, ids), b = all_logits(f32, ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(same_bits(a.data(), b.data(), a.size()));
  // --dtype native's own cache holds f16 rows: the f32 reference with an f16 cache, bit for bit.
  engine::Engine native_f16(*m, nullptr, engine::DType::kNative);
  engine::Engine f32_f16(*f, nullptr, engine::DType::kF32, engine::KvRows::kF16);
  const std::vector<float> c = all_logits(native_f16, ids), e = all_logits(f32_f16, ids);
  ASSERT_EQ(c.size(), e.size());
  EXPECT_TRUE(same_bits(c.data(), e.data(), c.size()));
  EXPECT_FALSE(same_bits(c.data(), a.data(), c.size())) << "the f16 cache changed no logit";
}

// The softmax's exponential follows the products: a model whose matrices run on blocks under
// --dtype native takes exp_fast (llama.cpp's family) in attention, and the f32 reference and a
// native model without blocks keep std::exp's bits (exp_floats, which SwiGLU also calls).
TEST_F(SmolNative, TheSoftmaxIsExpFastWhereTheProductsAreBlocks) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);  // dispatch counts are per thread
  const std::vector<int32_t> ids = {1, 7, 42, 99, 3, 64, 12, 5, 8, 13};
  auto fast_and_exact = [&](engine::Engine& eng) {
    kernels::cpu::simd_dispatch_counts() = kernels::cpu::SimdDispatchCounts{};
    all_logits(eng, ids);
    const kernels::cpu::SimdDispatchCounts c = kernels::cpu::simd_dispatch_counts();
    uint64_t fast = 0, exact = 0;
    for (int isa = 0; isa < kernels::cpu::kIsaCount; ++isa) {
      fast += c.calls[static_cast<int>(kernels::cpu::SimdKernel::kExpFast)][isa];
      exact += c.calls[static_cast<int>(kernels::cpu::SimdKernel::kExpFloats)][isa];
    }
    return std::pair{fast, exact};
  };
  engine::Engine native(*model_, nullptr, engine::DType::kNative), f32(*model_);
  const auto [native_fast, native_exact] = fast_and_exact(native);
  EXPECT_GT(native_fast, 0u) << "native attention took std::exp's bits";
  EXPECT_GT(native_exact, 0u) << "SwiGLU's exp is std::exp's on every path";
  EXPECT_EQ(fast_and_exact(f32).first, 0u) << "the f32 reference took exp_fast";
  const std::string phi3 = std::string(KVB_FIXTURES_DIR) + "/engine/phi3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(phi3, /*native_blocks=*/true);
  engine::Engine no_blocks(*m, nullptr, engine::DType::kNative);
  EXPECT_EQ(fast_and_exact(no_blocks).first, 0u) << "a native model without blocks took exp_fast";
  omp_set_num_threads(threads);
}

// A sweep on native weights (the config's `dtype: native`) says so in its provenance, and its
// database refuses to be resumed in f32 (--dtype on the command line wins over the config; one
// precision per matrix); a bad dtype in the config names the file and line.
TEST_F(SmolNative, SweepProvenanceNamesTheDtypeAndKeepsOnePrecision) {
  const std::string dir =
      std::string(KVB_BINARY_DIR) + "/test_engine_native/sweep_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cfg = dir + "/sweep.yaml", db = dir + "/native.db";
  std::ofstream(cfg) << "models:\n  - name: smollm2\n    path: " << kSmol << "\n"
                     << "tasks:\n  - name: niah\n    options: {context_lengths: [96], depths: [0], "
                        "haystack: noise}\n"
                     << "policies: [full]\nkv_budget: [48]\nseed: [0]\ndtype: native\n";
  std::string err;
  // The config's dtype: (no --dtype given).
  ASSERT_EQ(testing::kvbench({"sweep", cfg, "--db", db, "--threads", "1"}, nullptr, &err), 0)
      << err;
  const nlohmann::json devices = nlohmann::json::parse(testing::run_devices(db));
  ASSERT_EQ(devices.size(), 1u) << devices.dump();
  EXPECT_EQ(devices[0]["device"], "cpu (native quantized weights)") << devices.dump();
  EXPECT_EQ(testing::kvbench({"sweep", cfg, "--db", db, "--threads", "1", "--dtype", "f32"},
                             nullptr, &err),
            2);
  EXPECT_NE(err.find("another precision than this run's f32"), std::string::npos) << err;
  std::ofstream(dir + "/bad.yaml") << "models: [" << kSmol << "]\ntasks: [niah]\npolicies: [full]\n"
                                   << "dtype: int4\n";
  EXPECT_EQ(testing::kvbench({"sweep", dir + "/bad.yaml", "--db", dir + "/bad.db"}, nullptr, &err), 2);
  EXPECT_NE(err.find("bad.yaml:4"), std::string::npos) << err;
  EXPECT_NE(err.find("must be f32, bf16 or native, got 'int4'"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvb
