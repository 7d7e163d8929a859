// Non-finite logits in `kvbench generate` and `kvbench eval` (issue 31): a model whose weights are
// NaN or infinite must not print tokens and exit 0. The decode loop (engine::Generation) refuses
// logits that are not all finite at every step, naming the model and the step; generate exits 1
// with that message, eval fails every sample with it and exits 1. On copies of stories260K.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "run_kvbench.h"
#include "workers/engine/generate.h"

namespace kvb {
namespace {
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTok = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

// A copy of stories260K with every weight set to `value` (llama2.c: 7 int32 of config, then f32).
std::string model_filled_with(float value, const std::string& name) {
  const std::string path = std::string(KVB_BINARY_DIR) + "/test_nonfinite_logits_" + name + ".bin";
  fs::copy_file(kModel, path, fs::copy_options::overwrite_existing);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = fs::file_size(path);
  f.seekp(7 * 4);
  for (uint64_t off = 7 * 4; off + 4 <= size; off += 4) {
    f.write(reinterpret_cast<const char*>(&value), 4);
  }
  return path;
}

class NonFiniteLogits : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  }
};

// The check itself, at the first step (the prompt's logits) and at a later one.
TEST(GenerationLogits, NonFiniteLogitsStopTheLoopNamingModelAndStep) {
  engine::GenerateOptions o;
  o.max_new_tokens = 4;
  o.model = "m.gguf";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  engine::Generation first({0.5f, nan, 1.0f}, o, nullptr);
  try {
    first.next();
    ADD_FAILURE() << "sampled from NaN logits";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("model 'm.gguf': the logits for generated token 1 (after "
                                         "the prompt) are not finite (token 1: nan); the model's "
                                         "weights hold NaN or Inf"),
              std::string::npos)
        << e.what();
  }
  engine::Generation later({0.5f, 0.25f, 1.0f}, o, nullptr);
  EXPECT_EQ(later.next(), 2);  // greedy: the largest logit
  *later.logits() = {0.0f, -std::numeric_limits<float>::infinity(), 0.0f};
  later.stepped(1.0);
  try {
    later.next();
    ADD_FAILURE() << "sampled from -inf logits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the logits for generated token 2 (after token 1) are "
                                         "not finite (token 1: -inf)"),
              std::string::npos)
        << e.what();
  }
  // Finite logits run as before: the same tokens, to the limit.
  engine::Generation ok({0.5f, 0.25f, 1.0f}, o, nullptr);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ok.next(), 2);
    ok.stepped(1.0);
  }
  EXPECT_EQ(ok.next(), -1);
  EXPECT_EQ(ok.result().tokens, (std::vector<int32_t>{2, 2, 2, 2}));
}

TEST_F(NonFiniteLogits, GenerateExitsOneWithoutPrintingTokens) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [value, name] : {std::pair<float, std::string>{std::nanf(""), "nan"},
                                    {inf, "inf"}}) {
    const std::string m = model_filled_with(value, name);
    std::string out, err;
    EXPECT_EQ(testing::kvbench({"generate", "--model", m, "--tokenizer", kTok, "--prompt",
                                "Once upon a time", "--max-new-tokens", "8"},
                               &out, &err),
              1)
        << name << ": " << out;
    EXPECT_NE(err.find("model '" + m + "': the logits for generated token 1 (after the prompt) "
                       "are not finite (token 0: "),
              std::string::npos)
        << err;
    EXPECT_EQ(out, "") << name;
  }
}

TEST_F(NonFiniteLogits, EvalFailsEverySampleAndExitsOne) {
  const std::string m = model_filled_with(std::nanf(""), "eval_nan");
  std::string out, err;
  EXPECT_EQ(testing::kvbench({"eval", "--model", m, "--tokenizer", kTok, "--task", "niah",
                              "--task-opt", "context_lengths=256", "--task-opt", "depths=0,100",
                              "--task-opt", "haystack=noise", "--task-opt", "chat=false"},
                             &out, &err),
            1)
      << out << err;
  for (const char* sample : {"len256_depth0_s0", "len256_depth100_s0"}) {
    EXPECT_NE(out.find("| " + std::string(sample) + " "), std::string::npos) << out;
    EXPECT_NE(out.find("sample " + std::string(sample) +
                       ": the logits after the prompt's prefill are not finite (token 0: nan)"),
              std::string::npos)
        << out;
  }
  EXPECT_NE(out.find("| niah | full   |         0 |   0 |      2 |"), std::string::npos) << out;
  EXPECT_EQ(out.find("| ok |"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvb
