// safetensors reader and Hugging Face folder configuration on hostile input
// (kernels/formats/safetensors.h, hf_config.h): hand-built files whose converted values are known
// (F32, F16 and BF16 bit patterns), then mutated headers, offsets, shapes and dtypes, bad
// config.json / tokenizer_config.json / index files built from the fixture folders, and a seeded
// fuzz over header bytes. Every failure must be a kvb::Error naming the file and the field; none
// may crash or allocate what the file does not hold (huge shapes are refused by arithmetic
// before any allocation). Files live in a per-process folder (ctest runs tests in parallel).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "workers/engine/model.h"
#include "workers/formats/hf_config.h"
#include "workers/formats/model_load.h"
#include "kernels/formats/safetensors.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string scratch() {
  const std::string d = std::string(KVB_BINARY_DIR) + "/test_safetensors_" +
                        std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(d);
  return d;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A safetensors file: 8-byte little-endian length, header text as given, data bytes.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string u16s(std::initializer_list<uint16_t> v) {
  std::string s;
  for (uint16_t x : v) s += std::string{static_cast<char>(x & 0xff), static_cast<char>(x >> 8)};
  return s;
}
std::string f32s(std::initializer_list<float> v) {
  std::string s;
  for (float x : v) s.append(reinterpret_cast<const char*>(&x), 4);
  return s;
}

// The error message of f(), or "" when it does not throw kvb::Error (other exceptions fail).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(msg, ...)                                                            \
  do {                                                                                        \
    const std::string m_ = (msg);                                                             \
    for (const char* part : {__VA_ARGS__}) EXPECT_NE(m_.find(part), std::string::npos) << m_; \
  } while (0)

// A good file: a [2, 2] F32, a [3] F16 and a [2] BF16 tensor with known values.
const std::string kGoodHeader =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
    R"("h":{"dtype":"F16","shape":[3],"data_offsets":[16,22]},)"
    R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[22,26]}})";
const std::string kGoodData =
    f32s({1.0f, -2.5f, 0.125f, 3e9f}) + u16s({0x3C00, 0xC100, 0x0001}) + u16s({0x3F80, 0xC020});

std::string open_error(const std::string& header, const std::string& data,
                       const std::string& name = "t.safetensors") {
  const std::string path = scratch() + "/" + name;
  write_bytes(path, safetensors_bytes(header, data));
  return error_of([&] { formats::SafetensorsFile::open(path); });
}

TEST(Safetensors, ConvertsF32F16Bf16Exactly) {
  const std::string path = scratch() + "/good.safetensors";
  write_bytes(path, safetensors_bytes(kGoodHeader, kGoodData));
  auto f = formats::SafetensorsFile::open(path);
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->load_f32("a", {2, 2}), (std::vector<float>{1.0f, -2.5f, 0.125f, 3e9f}));
  // F16 0x3C00 = 1, 0xC100 = -2.5, 0x0001 = 2^-24 (the smallest subnormal).
  EXPECT_EQ(f->load_f32("h", {3}), (std::vector<float>{1.0f, -2.5f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(f->load_f32("b", {2}), (std::vector<float>{1.0f, -2.5f}));  // BF16 0x3F80, 0xC020
  EXPECT_ERROR_HAS(error_of([&] { f->load_f32("a", {4}); }), "good.safetensors",
                   "tensor 'a' has shape [2, 2], expected [4]");
  EXPECT_ERROR_HAS(error_of([&] { f->load_f32("zz", {1}); }), "no tensor named 'zz'");
}

TEST(Safetensors, MalformedHeadersNameFileAndField) {
  // Header length past the end of the file.
  {
    const std::string path = scratch() + "/len.safetensors";
    std::string bytes = safetensors_bytes(kGoodHeader, kGoodData);
    bytes[5] = 1;  // n += 2^40
    write_bytes(path, bytes);
    EXPECT_ERROR_HAS(error_of([&] { formats::SafetensorsFile::open(path); }), "len.safetensors",
                     "header length", "runs past the end of the file");
  }
  {
    const std::string path = scratch() + "/short.safetensors";
    write_bytes(path, "abc");
    EXPECT_ERROR_HAS(error_of([&] { formats::SafetensorsFile::open(path); }), "short.safetensors",
                     "too short for the 8-byte header length");
  }
  EXPECT_ERROR_HAS(open_error(R"({"a":{"dtype":"F32",)", ""), "t.safetensors", "not valid JSON");
  EXPECT_ERROR_HAS(open_error("[1, 2]", ""), "must be a JSON object");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", f32s({1})),
      "tensor 'a'", "unknown dtype 'F17'");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", f32s({1})),
      "tensor 'a'", "outside the data section");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", f32s({1})),
      "tensor 'a'", "hold 4 bytes", "needs 8");
  EXPECT_ERROR_HAS(open_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              f32s({1, 2})),
                   "overlaps");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32s({1, 2})),
      "belong to no tensor");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32s({1, 2})),
      "trailing bytes");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", f32s({1})),
      "tensor 'a'", "shape[0]", "non-negative integer");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", f32s({1})),
      "tensor 'a'", "data_offsets");
  EXPECT_ERROR_HAS(open_error(R"({"a":{"dtype":"F32","shape":[1]}})", f32s({1})), "tensor 'a'",
                   "dtype, shape and data_offsets");
  EXPECT_ERROR_HAS(open_error(R"({"__metadata__":{"k":1}})", ""), "'__metadata__.k'");
  // Structures the format never has are refused while parsing.
  EXPECT_ERROR_HAS(open_error(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],)"
                              R"("data_offsets":[0,4]}})",
                              f32s({1})),
                   "t.safetensors", "more than 8 entries");
  EXPECT_ERROR_HAS(open_error(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})",
                              f32s({1})),
                   "t.safetensors", "nests deeper");
  // Huge shapes: refused by arithmetic, nothing allocated.
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                 f32s({1})),
      "tensor 'a'", "overflows");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[1073741824,1024],"data_offsets":[0,4]}})",
                 f32s({1})),
      "tensor 'a'", "needs 4398046511104");
  EXPECT_ERROR_HAS(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})",
                 f32s({1})),
      "outside the data section");
}

// A dtype the format defines but kvbench does not convert is refused when read, not crashed on.
TEST(Safetensors, UnconvertibleDtypeIsRefusedOnLoad) {
  const std::string path = scratch() + "/i64.safetensors";
  write_bytes(path, safetensors_bytes(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                                      std::string(8, '\0')));
  auto f = formats::SafetensorsFile::open(path);
  EXPECT_ERROR_HAS(error_of([&] { f->load_f32("a", {1}); }), "i64.safetensors", "tensor 'a'",
                   "dtype I64");
}

// Seeded byte mutations of a real header: every outcome is a clean open or a kvb::Error.
TEST(Safetensors, FuzzedHeadersNeverCrash) {
  const std::string src = std::string(KVB_FIXTURES_DIR) + "/hf/qwen3_bf16/model.safetensors";
  std::ifstream in(src, std::ios::binary);
  std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(good.size(), 1000u);
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  std::mt19937_64 rng(20251125);
  const std::string path = scratch() + "/fuzz.safetensors";
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (8 + n);  // the length field and the JSON header
      bytes[at] = static_cast<char>("0123456789[]{},:\"-e.\xff"[rng() % 21]);
    }
    write_bytes(path, bytes);
    try {
      auto f = formats::SafetensorsFile::open(path);
      for (const auto& t : f->tensors()) {
        if (formats::safetensors_dtype_convertible(t.dtype)) f->load_f32(t.name, t.shape);
      }
    } catch (const Error& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find("fuzz.safetensors"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(refused, 100);
}

// ---- folders: a copy of a fixture folder with one file changed.

std::string copy_fixture(const std::string& name) {
  const std::string dst = scratch() + "/" + name;
  fs::remove_all(dst);
  fs::copy(std::string(KVB_FIXTURES_DIR) + "/hf/" + name, dst);
  for (const auto& e : fs::directory_iterator(dst)) {
    fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add);
  }
  return dst;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

// load_model's error after `edit` changed the folder's config.json.
std::string config_error(const std::string& fixture, const std::function<void(json&)>& edit) {
  const std::string dir = copy_fixture(fixture);
  json cfg = read_json(dir + "/config.json");
  edit(cfg);
  write_json(dir + "/config.json", cfg);
  return error_of([&] { engine::load_model(dir); });
}

TEST(HfFolderHostile, BadConfigJsonNamesTheKey) {
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c.erase("hidden_size"); }),
                   "config.json", "key 'hidden_size' is missing");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["num_hidden_layers"] = -2; }),
                   "config.json", "key 'num_hidden_layers' = -2 is out of range");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["vocab_size"] = 1ull << 40; }),
                   "config.json", "key 'vocab_size'", "out of range");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["hidden_size"] = "48"; }),
                   "config.json", "key 'hidden_size' is \"48\", expected an integer");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["rms_norm_eps"] = -1; }),
                   "config.json", "key 'rms_norm_eps'", "not a finite positive number");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["tie_word_embeddings"] = 1; }),
                   "config.json", "key 'tie_word_embeddings'", "expected true or false");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["num_key_value_heads"] = 3; }),
                   "config.json", "not a multiple of num_key_value_heads 3");
  EXPECT_ERROR_HAS(
      config_error("qwen3_bf16", [](json& c) { c["architectures"] = {"PhiForCausalLM"}; }),
      "config.json", "unsupported architecture 'PhiForCausalLM'", "Phi3ForCausalLM");
  EXPECT_ERROR_HAS(config_error("llama_f32_sharded",
                                [](json& c) { c["rope_scaling"]["rope_type"] = "dynamic"; }),
                   "config.json", "rope_scaling.rope_type' is 'dynamic'",
                   "default, linear, llama3");
  EXPECT_ERROR_HAS(config_error("gemma3_f16",
                                [](json& c) {
                                  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
                                }),
                   "config.json", "rope_scaling.rope_type' is 'yarn'",
                   "yarn for Llama, Mistral, Qwen2, Qwen3");
  EXPECT_ERROR_HAS(config_error("llama_f32_sharded",
                                [](json& c) { c["rope_scaling"].erase("low_freq_factor"); }),
                   "config.json", "rope_scaling.low_freq_factor' is missing");
  EXPECT_ERROR_HAS(
      config_error("gemma3_f16", [](json& c) { c["layer_types"] = {"sliding_attention"}; }),
      "config.json", "key 'layer_types' must list one entry per layer (3)");
  EXPECT_ERROR_HAS(config_error("gemma3_f16", [](json& c) { c["final_logit_softcapping"] = 30; }),
                   "config.json", "final_logit_softcapping");
  // Sizes that disagree with the tensors: the tensor, the file and both shapes are named.
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["intermediate_size"] = 65; }),
                   "model.safetensors",
                   "tensor 'model.layers.0.mlp.gate_proj.weight' has shape "
                   "[64, 48], expected [65, 48]");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["num_hidden_layers"] = 3; }),
                   "no tensor named 'model.layers.2.");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["tie_word_embeddings"] = false; }),
                   "no tensor named 'lm_head.weight'");
  {
    const std::string dir = copy_fixture("qwen3_bf16");
    write_bytes(dir + "/config.json", "{\"hidden_size\": 48,");
    EXPECT_ERROR_HAS(error_of([&] { engine::load_model(dir); }), "config.json", "not valid JSON");
  }
}

// null in config.json (issue 31): accepted only where transformers reads None as the default
// kvbench takes (the fixtures' "rope_scaling", "sliding_window", "head_dim": null load), refused
// naming the file and the key everywhere else, instead of being replaced by a default.
TEST(HfFolderHostile, NullKeysAreRefusedUnlessNullMeansTheDefault) {
  for (const char* key : {"hidden_size", "rms_norm_eps", "rope_theta", "max_position_embeddings",
                          "tie_word_embeddings", "vocab_size", "hidden_act"}) {
    EXPECT_ERROR_HAS(config_error("qwen3_bf16", [&](json& c) { c[key] = nullptr; }),
                     "qwen3_bf16/config.json: key '", key,
                     "' is null, which transformers does not read as the default: give the value");
  }
  // Qwen3's head_dim defaults to 128, but None means hidden_size / heads; Gemma 3 keeps None.
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["head_dim"] = nullptr; }),
                   "key 'head_dim' is null");
  EXPECT_ERROR_HAS(config_error("gemma3_f16", [](json& c) { c["num_key_value_heads"] = nullptr; }),
                   "key 'num_key_value_heads' is null");
  // null num_key_value_heads is read as transformers reads None: as many as the heads (4 here),
  // which the fixture's 2-head K and V weights then contradict.
  EXPECT_ERROR_HAS(config_error("qwen2_f16", [](json& c) { c["num_key_value_heads"] = nullptr; }),
                   "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [24, 48], expected "
                   "[48, 48]");
  // Where None is the default, null loads as the absent key does.
  for (const char* key : {"head_dim", "rope_scaling", "attention_bias", "layer_types"}) {
    const std::string dir = copy_fixture("qwen2_f16");
    json cfg = read_json(dir + "/config.json");
    cfg[key] = nullptr;
    write_json(dir + "/config.json", cfg);
    EXPECT_EQ(error_of([&] { engine::load_model(dir); }), "") << key;
  }
}

// layer_types is checked for every family that writes it, not only Gemma 3 (which reads its
// windows from it): a list shorter than the layers, a wrong entry or a Qwen sliding layer.
TEST(HfFolderHostile, LayerTypesMustDescribeEveryLayer) {
  EXPECT_ERROR_HAS(
      config_error("qwen2_f16", [](json& c) { c["layer_types"] = {"full_attention"}; }),
      "qwen2_f16/config.json: key 'layer_types' must list one entry per layer (2); it is a list "
      "of 1");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16", [](json& c) { c["layer_types"] = "full_attention"; }),
                   "key 'layer_types' must list one entry per layer (2); it is not a list");
  EXPECT_ERROR_HAS(config_error("qwen3_bf16",
                                [](json& c) {
                                  c["layer_types"] = {"full_attention", 7};
                                }),
                   "key 'layer_types[1]' is 7, expected \"sliding_attention\" or");
  const std::string e = config_error("qwen2_f16", [](json& c) {
    c["layer_types"] = {"full_attention", "sliding_attention"};
  });
  EXPECT_ERROR_HAS(e,
                   "key 'layer_types[1]' is \"sliding_attention\"; kvbench does not run "
                   "Qwen's sliding layers");
  // The fixture's own ["full_attention", "full_attention"] loads.
  EXPECT_EQ(error_of([] { engine::load_model(copy_fixture("qwen2_f16")); }), "");
}

// Mistral's sliding_window: every layer windowed, unless the window cannot bind in the context.
TEST(HfFolderConfig, MistralWindowOnlyWhenItBinds) {
  const std::string dir = copy_fixture("mistral_f16");
  EXPECT_EQ(engine::load_model(dir)->config.window, (std::vector<int>{5, 5}));
  json cfg = read_json(dir + "/config.json");
  cfg["sliding_window"] = cfg["max_position_embeddings"];
  write_json(dir + "/config.json", cfg);
  EXPECT_TRUE(engine::load_model(dir)->config.window.empty());
  cfg["sliding_window"] = nullptr;
  write_json(dir + "/config.json", cfg);
  EXPECT_TRUE(engine::load_model(dir)->config.window.empty());
  cfg["sliding_window"] = 0;
  write_json(dir + "/config.json", cfg);
  EXPECT_ERROR_HAS(error_of([&] { engine::load_model(dir); }), "config.json",
                   "key 'sliding_window' = 0 is out of range");
}

TEST(HfFolderHostile, ShardsAndIndexAreChecked) {
  const std::string dir = copy_fixture("llama_f32_sharded");
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  EXPECT_ERROR_HAS(error_of([&] { engine::load_model(dir); }), "model.safetensors.index.json",
                   "model-00002-of-00002.safetensors", "missing");
  const std::string dir2 = copy_fixture("llama_f32_sharded");
  json idx = read_json(dir2 + "/model.safetensors.index.json");
  idx["weight_map"]["model.norm.weight"] = "../llama_f32_sharded/model-00001-of-00002.safetensors";
  write_json(dir2 + "/model.safetensors.index.json", idx);
  EXPECT_ERROR_HAS(error_of([&] { engine::load_model(dir2); }),
                   "key 'weight_map.model.norm.weight'", "plain file names");
  idx["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";  // wrong shard
  write_json(dir2 + "/model.safetensors.index.json", idx);
  EXPECT_ERROR_HAS(error_of([&] { engine::load_model(dir2); }), "names shard",
                   "has no tensor 'model.norm.weight'");
  idx.erase("weight_map");
  write_json(dir2 + "/model.safetensors.index.json", idx);
  EXPECT_ERROR_HAS(error_of([&] { engine::load_model(dir2); }), "key 'weight_map' missing");
  // A tensor absent from a single-file checkpoint.
  const std::string dir3 = copy_fixture("mistral_f16");
  const std::string st = dir3 + "/model.safetensors";
  auto f = formats::SafetensorsFile::open(st);
  json header = json::object();
  std::string data;
  {
    std::ifstream in(st, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto& t : f->tensors()) {
      if (t.name == "model.layers.1.mlp.up_proj.weight") continue;
      header[t.name] = {{"dtype", t.dtype},
                        {"shape", t.shape},
                        {"data_offsets", {data.size(), data.size() + (t.end - t.begin)}}};
      data += bytes.substr(f->data_offset() + t.begin, t.end - t.begin);
    }
  }
  write_bytes(st, safetensors_bytes(header.dump(), data));
  EXPECT_ERROR_HAS(error_of([&] { engine::load_model(dir3); }), "model.safetensors",
                   "no tensor named 'model.layers.1.mlp.up_proj.weight'");
  // model.safetensors wins over an index beside it, as in transformers' from_pretrained.
  const std::string both = copy_fixture("qwen3_bf16");
  write_bytes(both + "/model.safetensors.index.json", "not json");
  EXPECT_EQ(error_of([&] { engine::load_model(both); }), "");
  // An empty folder and a folder without weights.
  const std::string empty = scratch() + "/empty";
  fs::create_directories(empty);
  write_bytes(empty + "/config.json", read_json(dir3 + "/config.json").dump());
  EXPECT_ERROR_HAS(error_of([&] { engine::load_model(empty); }),
                   "no model.safetensors or model.safetensors.index.json");
}

TEST(HfFolderHostile, BadTokenizerConfigNamesTheKey) {
  const std::string dir = copy_fixture("qwen3_bf16");
  json tc = read_json(dir + "/tokenizer_config.json");
  tc["add_bos_token"] = "yes";
  write_json(dir + "/tokenizer_config.json", tc);
  EXPECT_ERROR_HAS(error_of([&] { workers::load_tokenizer_only(dir, ""); }),
                   "tokenizer_config.json", "key 'add_bos_token' must be true or false");
  tc["add_bos_token"] = true;
  tc["bos_token"] = 7;
  write_json(dir + "/tokenizer_config.json", tc);
  EXPECT_ERROR_HAS(error_of([&] { workers::load_tokenizer_only(dir, ""); }),
                   "tokenizer_config.json", "key 'bos_token'");
  tc["bos_token"] = {{"content", "<|endoftext|>"}};
  tc["chat_template"] = json::array({{{"name", "default"}, {"template", "T"}}});
  write_json(dir + "/tokenizer_config.json", tc);
  const engine::HfTokenizerConfig got = engine::read_hf_tokenizer_config(dir);
  EXPECT_EQ(got.bos_token, "<|endoftext|>");
  EXPECT_TRUE(got.add_bos_token);
  EXPECT_EQ(got.chat_template, "T");
  // Without add_bos_token, a TemplateProcessing post-processor that starts with a special token
  // (Llama 3's <|begin_of_text|>, here inside a Sequence) makes prompts start with it.
  tc.erase("add_bos_token");
  write_json(dir + "/tokenizer_config.json", tc);
  EXPECT_FALSE(workers::load_tokenizer_only(dir, "").add_bos);
  json tj = read_json(dir + "/tokenizer.json");
  tj["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}}}};
  write_json(dir + "/tokenizer.json", tj);
  const workers::LoadedModel lm = workers::load_tokenizer_only(dir, "");
  EXPECT_TRUE(lm.add_bos);
  EXPECT_EQ(lm.tokenizer->bos_id(), 0);
  EXPECT_EQ(workers::encode_prompt(lm, "hi", false, "").front(), 0);
  fs::remove(dir + "/tokenizer.json");
  EXPECT_ERROR_HAS(error_of([&] { workers::load_tokenizer_only(dir, ""); }),
                   "has no tokenizer.json", "--tokenizer");
}

}  // namespace
}  // namespace kvb
