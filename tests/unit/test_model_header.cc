// `kvbench validate` and the loaders share one set of header checks (issue 14): every malformed
// GGUF or llama2.c file below is refused by the loader, so validate (read_model_info) must refuse
// it too, before any sweep starts units on it. NaN, inf, zero or negative rms_epsilon,
// rope.freq_base and rope.scaling.factor are refused naming the key and the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf_writer.h"
#include "harness/model_info.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"

namespace kvb {
namespace {
namespace fs = std::filesystem;
using testing::GgufWriter;

const std::string kDir = KVB_BINARY_DIR "/test_model_header";

// A tiny Llama GGUF (dim 16, 2 heads of 8, 1 KV head, 1 layer, vocab 32) with edits.
struct Edit {
  std::map<std::string, uint32_t> u32;  // metadata set (added or replaced)
  std::map<std::string, float> f32;
  std::map<std::string, std::string> str;
  std::set<std::string> drop;  // metadata keys or tensor names left out
  std::map<std::string, std::vector<uint64_t>> shape;
  int tensor_count_delta = 0;  // written into the header's tensor_count
  std::vector<std::string> extra;  // tensors of shape [16] added before output_norm.weight
};

std::string write_gguf(const std::string& name, const Edit& e) {
  std::map<std::string, uint32_t> u32 = {{"llama.embedding_length", 16},
                                         {"llama.feed_forward_length", 32},
                                         {"llama.block_count", 1},
                                         {"llama.attention.head_count", 2},
                                         {"llama.attention.head_count_kv", 1},
                                         {"llama.context_length", 64}};
  std::map<std::string, float> f32 = {{"llama.attention.layer_norm_rms_epsilon", 1e-5f}};
  std::map<std::string, std::string> str = {{"general.architecture", "llama"}};
  for (const auto& [k, v] : e.u32) u32[k] = v;
  for (const auto& [k, v] : e.f32) f32[k] = v;
  for (const auto& [k, v] : e.str) str[k] = v;
  GgufWriter w;
  for (const auto& [k, v] : str) {
    if (!e.drop.count(k)) w.add_string(k, v);
  }
  for (const auto& [k, v] : u32) {
    if (!e.drop.count(k)) w.add_scalar<uint32_t>(k, GgufWriter::kU32, v);
  }
  for (const auto& [k, v] : f32) {
    if (!e.drop.count(k)) w.add_scalar<float>(k, GgufWriter::kF32, v);
  }
  // Tensors in loader order, output_norm last (a tensor_count one short drops it).
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> tensors = {
      {"token_embd.weight", {16, 32}},   {"blk.0.attn_norm.weight", {16}},
      {"blk.0.attn_q.weight", {16, 16}}, {"blk.0.attn_k.weight", {16, 8}},
      {"blk.0.attn_v.weight", {16, 8}},  {"blk.0.attn_output.weight", {16, 16}},
      {"blk.0.ffn_norm.weight", {16}},   {"blk.0.ffn_gate.weight", {16, 32}},
      {"blk.0.ffn_up.weight", {16, 32}}, {"blk.0.ffn_down.weight", {32, 16}},
      {"output.weight", {16, 32}},       {"output_norm.weight", {16}}};
  std::vector<std::pair<std::string, std::vector<uint64_t>>> all(tensors.begin(),
                                                                 tensors.end() - 1);
  for (const std::string& t : e.extra) all.push_back({t, {16}});
  all.push_back(tensors.back());
  for (const auto& [t, dims0] : all) {
    if (e.drop.count(t)) continue;
    const auto it = e.shape.find(t);
    const std::vector<uint64_t> dims = it == e.shape.end() ? dims0 : it->second;
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::vector<float> ones(n, 0.01f);
    std::vector<uint8_t> bytes(n * 4);
    std::memcpy(bytes.data(), ones.data(), bytes.size());
    w.add_tensor(t, dims, 0, bytes);
  }
  std::vector<uint8_t> b = w.bytes();
  uint64_t count = 0;
  std::memcpy(&count, b.data() + 8, 8);
  count += e.tensor_count_delta;
  std::memcpy(b.data() + 8, &count, 8);
  fs::create_directories(kDir);
  const std::string path = kDir + "/" + name + ".gguf";
  EXPECT_TRUE(GgufWriter::write_file(path, b));
  return path;
}

// A llama2.c checkpoint: header then `floats` zero floats (the legacy layout's size by default).
std::string write_llama2c(const std::string& name, std::vector<int32_t> hdr, int64_t extra_bytes) {
  const int64_t D = hdr[0], H = hdr[1], L = hdr[2], NH = hdr[3], KV = hdr[4];
  const int64_t V = hdr[5] > 0 ? hdr[5] : -static_cast<int64_t>(hdr[5]);
  const int64_t HD = NH > 0 ? D / NH : 0, KVD = KV * HD;
  const int64_t floats = V * D + L * D + L * D * D + 2 * L * KVD * D + L * D * D + L * D +
                         3 * L * H * D + D + (hdr[5] > 0 ? 0 : V * D);
  std::vector<uint8_t> bytes(28 + std::max<int64_t>(0, floats * 4 + extra_bytes), 0);
  std::memcpy(bytes.data(), hdr.data(), 28);
  fs::create_directories(kDir);
  const std::string path = kDir + "/" + name + ".bin";
  EXPECT_TRUE(GgufWriter::write_file(path, bytes));
  return path;
}

// Both refuse, or both accept; the message of validate's refusal is returned.
std::string both_refuse(const std::string& path) {
  std::string loader_err, validate_err;
  try {
    engine::load_model(path);
  } catch (const Error& e) {
    loader_err = e.what();
  }
  try {
    harness::read_model_info(path);
  } catch (const Error& e) {
    validate_err = e.what();
  }
  EXPECT_FALSE(loader_err.empty()) << path << ": the loader accepts it";
  EXPECT_FALSE(validate_err.empty())
      << path << ": validate accepts what the loader refuses: " << loader_err;
  return validate_err;
}

TEST(ModelHeader, WellFormedFilesLoadAndValidate) {
  const std::string g = write_gguf("ok", {});
  EXPECT_NO_THROW(engine::load_model(g));
  const harness::ModelInfo info = harness::read_model_info(g);
  EXPECT_EQ(info.num_kv_heads, 1);
  EXPECT_EQ(info.head_dim, 8);
  EXPECT_EQ(info.vocab_size, 32);
  EXPECT_FALSE(info.tied_embeddings);
  const std::string l = write_llama2c("ok", {16, 32, 1, 2, 1, 32, 64}, 0);
  EXPECT_NO_THROW(engine::load_model(l));
  EXPECT_EQ(harness::read_model_info(l).num_params,
            32u * 16 + 16 + 256 + 2 * 128 + 256 + 16 + 3 * 32 * 16 + 16);
  // The legacy rope tables after the weights (untied classifier) are accepted by both.
  const std::string t = write_llama2c("tables", {16, 32, 1, 2, 1, -32, 64}, 4 * 64 * 8);
  EXPECT_NO_THROW(engine::load_model(t));
  EXPECT_NO_THROW(harness::read_model_info(t));
}

// Mistral: llama.attention.sliding_window puts every layer under the window (0 or absent: none;
// a window covering the whole context can never bind and counts as none), and validate's model
// info reports that no layer is global.
TEST(ModelHeader, SlidingWindowOnEveryLlamaLayer) {
  const std::string g = write_gguf("window", {.u32 = {{"llama.attention.sliding_window", 8}}});
  const std::unique_ptr<engine::Model> m = engine::load_model(g);
  ASSERT_EQ(m->config.window, std::vector<int>({8}));
  EXPECT_EQ(m->config.global_layers(), 0);
  EXPECT_EQ(&m->config.rope_of(0), &m->config.rope);  // Mistral's window layers: the one RoPE
  const harness::ModelInfo info = harness::read_model_info(g);
  EXPECT_EQ(info.global_layers, 0);
  EXPECT_EQ(info.max_window, 8);
  for (uint32_t w : {0u, 64u, 100u}) {  // context_length is 64
    const std::string n =
        write_gguf("window_" + std::to_string(w), {.u32 = {{"llama.attention.sliding_window", w}}});
    EXPECT_TRUE(engine::load_model(n)->config.window.empty()) << w;
    EXPECT_EQ(harness::read_model_info(n).global_layers, 1) << w;
  }
}

// YaRN by hand on the tiny Llama (rot_dim 8, theta 10000, original context 64, factor 4):
// d(r) = 8 ln(64 / (2 pi r)) / (2 ln 10000) gives d(32) = -0.50 and d(1) = 1.01, so the ramp runs
// over [floor, ceil] = [0, 2]: pair 0 keeps its frequency, pair 1 blends half and half
// (1 / (0.5 / 4 + 0.5) = 1.6), pairs 2 and 3 are divided by 4. yarn_beta_slow 2 moves the upper
// end to ceil(d(2) = 0.71) = 1. The attention factor is 0.1 ln 4 + 1, times
// rope.scaling.attn_factor.
TEST(ModelHeader, YarnFactorsByHand) {
  const Edit yarn = {.u32 = {{"llama.rope.scaling.original_context_length", 64}},
                     .f32 = {{"llama.rope.scaling.factor", 4}},
                     .str = {{"llama.rope.scaling.type", "yarn"}}};
  const engine::ModelConfig c = engine::load_model(write_gguf("yarn", yarn))->config;
  ASSERT_EQ(c.rope.freq_factors.size(), 4u);
  const float want[4] = {1.0f, 1.6f, 4.0f, 4.0f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(c.rope.freq_factors[i], want[i], 1e-6) << i;
  EXPECT_NEAR(c.rope.attn_factor, 0.1 * std::log(4.0) + 1, 1e-7);
  EXPECT_EQ(c.rope_scaling, "yarn");
  EXPECT_EQ(c.rope_original_context, 64);
  Edit slow = yarn;
  slow.f32["llama.rope.scaling.yarn_beta_slow"] = 2;
  slow.f32["llama.rope.scaling.attn_factor"] = 2;
  const engine::ModelConfig s = engine::load_model(write_gguf("yarn_slow", slow))->config;
  EXPECT_EQ(s.rope.freq_factors, std::vector<float>({1.0f, 4.0f, 4.0f, 4.0f}));
  EXPECT_NEAR(s.rope.attn_factor, 2 * (0.1 * std::log(4.0) + 1), 1e-6);
}

TEST(ModelHeader, ValidateRefusesEveryGgufTheLoaderRefuses) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::string eps = "llama.attention.layer_norm_rms_epsilon", base = "llama.rope.freq_base";
  struct Case {
    std::string name;
    Edit edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"rope_dim_0", {.u32 = {{"llama.rope.dimension_count", 0}}}, "rope.dimension_count = 0"},
      {"rope_dim_odd", {.u32 = {{"llama.rope.dimension_count", 3}}}, "rope.dimension_count = 3"},
      {"rope_dim_big", {.u32 = {{"llama.rope.dimension_count", 10}}}, "rope.dimension_count = 10"},
      {"eps_nan", {.f32 = {{eps, nan}}}, eps + " = nan is not a finite positive number"},
      {"eps_inf", {.f32 = {{eps, inf}}}, eps + " = inf is not a finite positive number"},
      {"eps_zero", {.f32 = {{eps, 0}}}, eps + " = 0 is not a finite positive number"},
      {"eps_negative", {.f32 = {{eps, -1e-5f}}}, eps + " = -1e-05 is not a finite positive"},
      {"base_nan", {.f32 = {{base, nan}}}, base + " = nan is not a finite positive number"},
      {"base_inf", {.f32 = {{base, inf}}}, base + " = inf is not a finite positive number"},
      {"base_zero", {.f32 = {{base, 0}}}, base + " = 0 is not a finite positive number"},
      {"base_negative", {.f32 = {{base, -10000}}}, base + " = -10000 is not a finite positive"},
      {"scale_nan",
       {.f32 = {{"llama.rope.scaling.factor", nan}},
        .str = {{"llama.rope.scaling.type", "linear"}}},
       "rope.scaling.factor = nan is not a finite positive number"},
      {"scale_missing", {.str = {{"llama.rope.scaling.type", "linear"}}}, "factor is missing"},
      {"scaling_dynamic",
       {.str = {{"llama.rope.scaling.type", "dynamic"}}},
       "'dynamic' is not supported"},
      {"yarn_no_factor", {.str = {{"llama.rope.scaling.type", "yarn"}}}, "factor is missing"},
      {"yarn_factor_below_1",
       {.f32 = {{"llama.rope.scaling.factor", 0.5f}}, .str = {{"llama.rope.scaling.type", "yarn"}}},
       "out of range for yarn"},
      {"yarn_orig_0",
       {.u32 = {{"llama.rope.scaling.original_context_length", 0}},
        .f32 = {{"llama.rope.scaling.factor", 4}},
        .str = {{"llama.rope.scaling.type", "yarn"}}},
       "original_context_length = 0 is out of range"},
      {"yarn_base_1",
       {.f32 = {{"llama.rope.scaling.factor", 4}, {base, 1}},
        .str = {{"llama.rope.scaling.type", "yarn"}}},
       "rope.freq_base = 1 with yarn scaling"},
      {"yarn_ext_factor",
       {.f32 = {{"llama.rope.scaling.factor", 4}, {"llama.rope.scaling.yarn_ext_factor", 0.5f}},
        .str = {{"llama.rope.scaling.type", "yarn"}}},
       "yarn_ext_factor other than 1 is not supported"},
      {"yarn_attn_factor",
       {.f32 = {{"llama.rope.scaling.factor", 4}, {"llama.rope.scaling.yarn_attn_factor", 1}},
        .str = {{"llama.rope.scaling.type", "yarn"}}},
       "yarn_attn_factor is not supported"},
      {"yarn_beta_nan",
       {.f32 = {{"llama.rope.scaling.factor", 4}, {"llama.rope.scaling.yarn_beta_fast", nan}},
        .str = {{"llama.rope.scaling.type", "yarn"}}},
       "yarn_beta_fast = nan is not a finite positive number"},
      {"longrope_no_factors",
       {.str = {{"llama.rope.scaling.type", "longrope"}}},
       "needs both rope_factors_long.weight and rope_factors_short.weight"},
      {"attn_factor_nan",
       {.f32 = {{"llama.rope.scaling.attn_factor", nan}}},
       "rope.scaling.attn_factor = nan is not a finite positive number"},
      {"window_huge",
       {.u32 = {{"llama.attention.sliding_window", 1u << 25}}},
       "sliding_window = 33554432 is out of range"},
      {"arch_gpt2", {.str = {{"general.architecture", "gpt2"}}}, "unsupported architecture"},
      {"no_ffn_length", {.drop = {"llama.feed_forward_length"}}, "feed_forward_length"},
      {"ffn_length_0", {.u32 = {{"llama.feed_forward_length", 0}}}, "feed_forward_length = 0"},
      {"dim_0", {.u32 = {{"llama.embedding_length", 0}}}, "embedding_length = 0"},
      {"kv_heads_3", {.u32 = {{"llama.attention.head_count_kv", 3}}}, "head_count_kv = 3"},
      {"key_length_odd", {.u32 = {{"llama.attention.key_length", 7}}}, "head dimension 7"},
      {"context_0", {.u32 = {{"llama.context_length", 0}}}, "context_length = 0"},
      // Issue 31: no default context (it was 2048), no layer left unread past block_count.
      {"no_context_length",
       {.drop = {"llama.context_length"}},
       "metadata llama.context_length is missing; kvbench bounds prompts and budgets by the "
       "model's context"},
      {"block_count_short",
       {.extra = {"blk.1.attn_norm.weight"}},
       "tensor 'blk.1.attn_norm.weight' belongs to no layer of metadata llama.block_count = 1 "
       "(layers blk.0 to blk.0); the file holds more layers than block_count says"},
      {"block_not_a_number",
       {.extra = {"blk.x.attn_norm.weight"}},
       "tensor 'blk.x.attn_norm.weight' belongs to no layer"},
      {"block_number_huge",
       {.extra = {"blk.99999999999999999999.attn_norm.weight"}},
       "tensor 'blk.99999999999999999999.attn_norm.weight' belongs to no layer"},
      {"block_name_control_bytes",
       {.extra = {std::string("blk.1\n\x1b[2J.w")}},
       "tensor 'blk.1\\x0a\\x1b[2J.w' belongs to no layer"},
      {"no_ffn_up", {.drop = {"blk.0.ffn_up.weight"}}, "no tensor named 'blk.0.ffn_up.weight'"},
      {"no_output_norm", {.drop = {"output_norm.weight"}}, "'output_norm.weight'"},
      {"q_shape", {.shape = {{"blk.0.attn_q.weight", {16, 8}}}}, "'blk.0.attn_q.weight' has shape"},
      {"output_shape", {.shape = {{"output.weight", {16, 31}}}}, "'output.weight' has shape"},
      {"tensor_count_short", {.tensor_count_delta = -1}, "'output_norm.weight'"},
      {"tensor_count_long", {.tensor_count_delta = 1}, ""},
  };
  for (const Case& c : cases) {
    const std::string path = write_gguf(c.name, c.edit);
    const std::string err = both_refuse(path);
    EXPECT_NE(err.find(path), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
  }
}

TEST(ModelHeader, ValidateRefusesEveryLlama2cTheLoaderRefuses) {
  struct Case {
    std::string name;
    std::vector<int32_t> hdr;
    int64_t extra_bytes;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"longer", {16, 32, 1, 2, 1, 32, 64}, 4, "does not match the header"},
      {"shorter", {16, 32, 1, 2, 1, 32, 64}, -4, "does not match the header"},
      {"header_larger_than_file", {64, 256, 4, 8, 8, 512, 512}, -100000, "does not match"},
      {"tied_with_tables", {16, 32, 1, 2, 1, 32, 64}, 4 * 64 * 8 + 4, "does not match"},
      {"heads_do_not_divide", {18, 32, 1, 4, 1, 32, 64}, 0, "do not divide"},
      {"kv_heads_do_not_divide", {16, 32, 1, 4, 3, 32, 64}, 0, "do not divide"},
      {"odd_head_dim", {18, 32, 1, 2, 1, 32, 64}, 0, "head dimension 9"},
      {"kv_above_heads", {16, 32, 1, 2, 4, 32, 64}, 0, "out of range"},
      {"zero_layers", {16, 32, 0, 2, 1, 32, 64}, 0, "out of range"},
      {"seq_len_0", {16, 32, 1, 2, 1, 32, 0}, 0, "out of range"},
      {"negative_dim", {-16, 32, 1, 2, 1, 32, 64}, 0, "out of range"},
      {"vocab_0", {16, 32, 1, 2, 1, 0, 64}, 0, "out of range"},
  };
  for (const Case& c : cases) {
    const std::string path = write_llama2c(c.name, c.hdr, c.extra_bytes);
    const std::string err = both_refuse(path);
    EXPECT_NE(err.find(path), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
  }
  // Shorter than the header itself.
  fs::create_directories(kDir);
  const std::string tiny = kDir + "/tiny.bin";
  ASSERT_TRUE(GgufWriter::write_file(tiny, {1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_NE(both_refuse(tiny).find("truncated llama2.c checkpoint"), std::string::npos);
}

}  // namespace
}  // namespace kvb
