// Reads the real SmolLM2-135M-Instruct Q4_1 GGUF (scripts/fetch_models.sh) with
// workers/formats/gguf: metadata as llama.cpp sees it, the tensor table, and dequantized values of
// a Q8_0 and a Q4_1 tensor against gguf-py 0.10.0
// (tests/fixtures/dequant/smollm2_samples.json, written by scripts/make_dequant_fixture.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/dequant.h"
#include "workers/formats/gguf.h"

namespace kvb::formats {
namespace {

const std::string kModel = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

class GgufSmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) {
      GTEST_SKIP() << kModel << " is absent; fetch it with scripts/fetch_models.sh";
    }
    file_ = GgufFile::open(kModel);
  }
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufSmolLM2, Metadata) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.context_length"), 8192);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 64);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.get_float("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), 49152u);
  const auto& merges = f.get_string_array("tokenizer.ggml.merges");
  ASSERT_EQ(merges.size(), 48900u);
  EXPECT_EQ(merges[0], "\xC4\xA0 t");  // "Ġ t"
  EXPECT_NE(f.get_string("tokenizer.chat_template").find("messages"), std::string::npos);
}

TEST_F(GgufSmolLM2, TensorTable) {
  const GgufFile& f = *file_;
  ASSERT_EQ(f.tensors().size(), 272u);
  int n_f32 = 0, n_q8_0 = 0, n_q4_1 = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    n_f32 += t.type == static_cast<uint32_t>(GgmlType::kF32);
    n_q8_0 += t.type == static_cast<uint32_t>(GgmlType::kQ8_0);
    n_q4_1 += t.type == static_cast<uint32_t>(GgmlType::kQ4_1);
    EXPECT_LE(f.data_offset() + t.offset + t.num_bytes, f.file_size()) << t.name;
  }
  EXPECT_EQ(n_f32, 61);
  EXPECT_EQ(n_q8_0, 1);
  EXPECT_EQ(n_q4_1, 210);
  const GgufTensorInfo* q = f.find_tensor("blk.29.attn_k.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dims, (std::vector<uint64_t>{576, 192}));  // 3 KV heads x 64
  // Every norm weight (F32) loads with its shape and finite values.
  for (int layer = 0; layer < 30; ++layer) {
    const std::string name = "blk." + std::to_string(layer) + ".attn_norm.weight";
    for (float v : f.load_f32(name, {576})) ASSERT_TRUE(std::isfinite(v)) << name;
  }
}

TEST_F(GgufSmolLM2, DequantizedValuesMatchGgufPy) {
  const std::string fixture = std::string(KVB_FIXTURES_DIR) + "/dequant/smollm2_samples.json";
  std::ifstream in(fixture);
  ASSERT_TRUE(in) << "missing " << fixture;
  const nlohmann::json ref = nlohmann::json::parse(in);
  const GgufFile& f = *file_;
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, info] : ref.at("tensors").items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* ti = f.find_tensor(name);
    ASSERT_NE(ti, nullptr);
    EXPECT_STREQ(ggml_type_name(ti->type), info.at("type").get<std::string>().c_str());
    EXPECT_EQ(f.data_offset() + ti->offset, info.at("file_offset").get<uint64_t>());
    const auto dims = info.at("dims").get<std::vector<uint64_t>>();
    std::vector<float>& v = values[name];
    v = f.load_f32(name, dims);
    // gguf-py sums pairwise in float64, we sum in order: allow for the different rounding.
    double sum = 0;
    for (float x : v) sum += x;
    const double want = info.at("sum").get<double>();
    EXPECT_NEAR(sum, want, 1e-9 * info.at("sum_abs").get<double>());
  }
  const auto& samples = ref.at("samples");
  ASSERT_EQ(samples.size(), 64u);
  for (const auto& s : samples) {
    const std::string name = s.at("tensor").get<std::string>();
    const uint64_t index = s.at("index").get<uint64_t>();
    ASSERT_LT(index, values.at(name).size());
    uint32_t got;
    std::memcpy(&got, &values.at(name)[index], sizeof(got));
    EXPECT_EQ(got, s.at("bits").get<uint32_t>())
        << name << "[" << index << "] = " << values.at(name)[index] << ", gguf-py "
        << s.at("value").get<double>();
  }
}

}  // namespace
}  // namespace kvb::formats
