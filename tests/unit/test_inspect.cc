// `kvbench inspect MODEL`: header-only facts about a model, checked against the committed tiny
// fixtures whose configurations are known by construction (scripts/make_gemma3_fixture.py,
// scripts/make_qwen3_fixture.py), with the byte counts computed by hand.
#include <gtest/gtest.h>

#include <string>

#include "run_kvbench.h"

namespace kvb {
namespace {

const std::string kFixtures = std::string(KVB_FIXTURES_DIR) + "/engine/";

TEST(Inspect, Gemma3TinyLayerKindsAndKvBytes) {
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"inspect", kFixtures + "gemma3_tiny.gguf"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("| architecture "), std::string::npos) << out;
  EXPECT_NE(out.find("gemma3"), std::string::npos) << out;
  // Layers 0-4 slide over 16 positions with base 10000; layer 5 is global (base 1e6).
  EXPECT_NE(out.find("sliding 0-4 (window 16, RoPE neox, base 10000, 32 dims); global 5"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("neox, base 1e+06, 32 dims"), std::string::npos) << out;
  // A slot: key + value of head_dim 32 in f32 + a 4-byte position = 260; bf16: 132.
  EXPECT_NE(out.find("260 (f32, CPU); 132 (bf16, GPU)"), std::string::npos) << out;
  // Per token: 1 global layer x 2 KV heads x 260 = 520; windows: 5 layers x 15 rows x 2 x 260.
  EXPECT_NE(out.find("520 per token over 1 global layers"), std::string::npos) << out;
  EXPECT_NE(out.find("at most 39000 held by the sliding layers"), std::string::npos) << out;
  EXPECT_NE(out.find("embeddings x 8"), std::string::npos) << out;
  EXPECT_NE(out.find("| chat format kvbench renders | none"), std::string::npos) << out;
}

TEST(Inspect, Qwen3TinyIsAllGlobalAndJsonlWorks) {
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"inspect", kFixtures + "qwen3_tiny.gguf", "--format", "jsonl"},
                             &out, &err),
            0)
      << err;
  EXPECT_NE(out.find(R"({"field":"layer kinds","value":"global 0-1"})"), std::string::npos) << out;
  // 2 layers x 2 KV heads x 260 bytes.
  EXPECT_NE(out.find("1040 per token over 2 global layers"), std::string::npos) << out;
}

// Mistral: every layer slides over 8 positions with the one RoPE, and inspect says that no
// layer is left for a policy. Slot: 2 x 16 x 4 + 4 = 132 bytes; windows: 2 layers x 7 rows x 2
// KV heads x 132 = 3696.
TEST(Inspect, MistralTinyHasNoGlobalLayer) {
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"inspect", kFixtures + "mistral_tiny.gguf"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("sliding 0-1 (window 8, RoPE as global); no global layer"), std::string::npos)
      << out;
  EXPECT_NE(out.find("eviction policies have no layer to act on"), std::string::npos) << out;
  EXPECT_NE(out.find("0 per token over 0 global layers"), std::string::npos) << out;
  EXPECT_NE(out.find("at most 3696 held by the sliding layers"), std::string::npos) << out;
}

// Phi-3 and YaRN: the scaling, the factor set chosen for the run and the cos/sin factor
// (sqrt(1 + ln 8 / ln 32) = 1.26491; 0.1 ln 4 + 1 = 1.13863).
TEST(Inspect, Phi3AndYarnScalingIsReported) {
  std::string out, err;
  ASSERT_EQ(
      testing::kvbench({"inspect", kFixtures + "phi3_tiny.gguf", "--format", "csv"}, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("neox, base 10000, 16 dims, longrope with the long factors (context 256 > "
                     "original 32; fixed for the run), cos/sin x 1.26491"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("fused QKV (attn_qkv); fused gate/up (ffn_up, gate first)"), std::string::npos)
      << out;
  ASSERT_EQ(testing::kvbench({"inspect", kFixtures + "qwen2_yarn_tiny.gguf", "--format", "csv"},
                             &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("yarn factor 4 over an original context of 64, cos/sin x 1.13863"),
            std::string::npos)
      << out;
}

TEST(Inspect, BadInputsAreUsageErrors) {
  std::string out, err;
  EXPECT_EQ(testing::kvbench({"inspect", kFixtures + "no-such.gguf"}, &out, &err), 2);
  EXPECT_NE(err.find("no-such.gguf"), std::string::npos) << err;
  EXPECT_EQ(testing::kvbench({"inspect", kFixtures + "gemma3_tiny.gguf", "--format", "xml"}, &out,
                             &err),
            2);
  EXPECT_NE(err.find("--format 'xml'"), std::string::npos) << err;
  EXPECT_EQ(testing::kvbench({"inspect"}, &out, &err), 2);
  EXPECT_EQ(testing::kvbench({"inspect", "--help"}, &out, &err), 0);
  EXPECT_NE(out.find("usage: kvbench inspect MODEL"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvb
