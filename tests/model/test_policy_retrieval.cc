// Retrieval under eviction (issue: "a retrieval prompt of about 1,500 tokens that SmolLM2 answers
// correctly with full"): a passkey at 25% depth in ~1,400 tokens of Paul Graham essays. With
// budget 128, SnapKV and Ada-SnapKV keep the needle (their observation window sees the question)
// and still answer; a recent window of 128 cannot, since the needle is ~1,000 tokens back.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "workers/engine/generate.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string passkey_prompt() {
  const std::string dir = std::string(KVB_SHARED_DIR) + "/data/paulgraham_essays/";
  std::string essay = read(dir + "addiction.txt") + read(dir + "aord.txt");
  essay = std::regex_replace(essay, std::regex("\\s+"), " ");
  // The first 1,050 space-separated words.
  size_t cut = 0;
  for (int w = 0; w < 1050 && cut != std::string::npos; ++w) cut = essay.find(' ', cut + 1);
  const std::string hay = essay.substr(0, cut);
  const size_t at = hay.find(". ", hay.size() * 25 / 100) + 2;
  return "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
         "it. I will quiz you about the important information there.\n\n" +
         hay.substr(0, at) + "The pass key is 71432. Remember it. 71432 is the pass key. " +
         hay.substr(at) + "\n\nWhat is the pass key? The pass key is";
}

TEST(Retrieval, PasskeyUnderEviction) {
  const std::string model = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::ifstream(model).good()) << model << " missing: run scripts/fetch_models.sh";
  workers::LoadedModel lm = workers::load_model_and_tokenizer(model, "");
  const std::vector<int32_t> prompt = workers::encode_prompt(lm, passkey_prompt(), false, "");
  EXPECT_GT(prompt.size(), 1300u);
  EXPECT_LT(prompt.size(), 1600u);
  engine::Engine eng(*lm.model);
  const auto& c = lm.model->config;
  auto answer = [&](const std::string& policy_name) {
    policies::PolicyConfig pc;
    pc.name = policy_name;
    pc.kv_budget = 128;
    pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
    auto policy = policies::make_policy(pc);
    kernels::KvCache cache = eng.new_cache(static_cast<int>(prompt.size()) + 12, policy.get());
    engine::GenerateOptions opt;
    opt.max_new_tokens = 8;
    opt.end_ids = lm.end_ids;
    engine::GenerateResult r = engine::generate(eng, cache, prompt, opt, nullptr, policy.get());
    const std::string text = lm.tokenizer->decode(r.tokens, true);
    std::cout << "[ retrieval ] " << policy_name << " @128 (" << prompt.size()
              << "-token prompt): \"" << text << "\"\n";
    return text;
  };
  EXPECT_NE(answer("full").find("71432"), std::string::npos);
  EXPECT_NE(answer("snapkv").find("71432"), std::string::npos);
  EXPECT_NE(answer("ada_snapkv").find("71432"), std::string::npos);
  EXPECT_EQ(answer("window").find("71432"), std::string::npos);
}

}  // namespace
}  // namespace kvb
