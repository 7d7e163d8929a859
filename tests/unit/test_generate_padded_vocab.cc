// `kvbench generate` on a model with more logits rows than its tokenizer has tokens: the tiny
// Qwen3 folder (tests/fixtures/hf/qwen3_bf16, 288 rows, random weights) with --tokenizer a copy of
// its tokenizer.json cut to the first kKept ids. Greedy decoding samples ids past the tokenizer;
// they must decode to "" with one warning (as HF tokenizers' decode skips unknown ids) instead of
// failing with "token id out of range", and the ids themselves stay those of the full model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "run_kvbench.h"

namespace kvb {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int kKept = 264;  // ids 0..263: 3 added tokens, 256 byte symbols, 5 merges
const std::string kFolder = std::string(KVB_FIXTURES_DIR) + "/hf/qwen3_bf16";

// The folder's tokenizer.json without ids >= kKept (and the merges that make them).
std::string write_cut_tokenizer() {
  std::ifstream in(kFolder + "/tokenizer.json");
  json t = json::parse(in);
  json vocab = json::object();
  for (auto& [text, id] : t["model"]["vocab"].items()) {
    if (id.get<int>() < kKept) vocab[text] = id;
  }
  json merges = json::array();
  for (const auto& m : t["model"]["merges"]) {
    const std::string a = m[0], b = m[1];
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(m);
  }
  EXPECT_EQ(merges.size(), 5u);
  t["model"]["vocab"] = vocab;
  t["model"]["merges"] = merges;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("kvb_padded_vocab_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tokenizer.json").string();
  std::ofstream(path) << t.dump();
  return path;
}

// The ids after "<what> ids (N): " in --show-ids' log.
std::vector<int> logged_ids(const std::string& err, const std::string& what) {
  const size_t at = err.find(what + " ids (");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no '" << what << " ids' in: " << err;
    return {};
  }
  std::istringstream s(err.substr(err.find("): ", at) + 3, err.find('\n', at) - at));
  std::vector<int> ids;
  for (int id; s >> id;) ids.push_back(id);
  return ids;
}

// Runs kvbench with stderr captured at the file descriptor (the logger writes there).
int run(const std::vector<std::string>& args, std::string* out, std::string* err) {
  ::testing::internal::CaptureStderr();
  const int rc = testing::kvbench(args, out, err);
  *err += ::testing::internal::GetCapturedStderr();
  return rc;
}

TEST(GeneratePaddedVocab, IdsPastTheTokenizerDecodeToNothing) {
  const std::string cut = write_cut_tokenizer();
  // Seeded sampling at temperature 100 (near-uniform over the random model's 288 rows): ids past
  // the cut (24 of 288) come up; the prompt tokenizes the same with both tokenizers.
  const std::vector<std::string> args = {
      "generate",      "--model", kFolder,  "--prompt", "hello",      "-n",        "32",
      "--temperature", "100",     "--seed", "1",        "--show-ids", "--threads", "1"};
  std::string full_out, full_err;
  ASSERT_EQ(run(args, &full_out, &full_err), 0) << full_err;
  auto cut_args = args;
  cut_args.insert(cut_args.end(), {"--tokenizer", cut});
  std::string out, err;
  ASSERT_EQ(run(cut_args, &out, &err), 0) << err;
  EXPECT_EQ(logged_ids(err, "prompt"), logged_ids(full_err, "prompt"));
  const std::vector<int> ids = logged_ids(err, "generated");
  EXPECT_EQ(ids, logged_ids(full_err, "generated"));  // sampling still sees every logit
  int past = 0;
  for (int id : ids) past += id >= kKept;
  ASSERT_GT(past, 0) << "no generated id is past the cut tokenizer: the test proves nothing";
  EXPECT_LT(past, static_cast<int>(ids.size())) << "every id is past the cut: nothing decodes";
  size_t warnings = 0;
  for (size_t at = 0; (at = err.find("is past the tokenizer's", at)) != std::string::npos; ++at) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << err;
  EXPECT_NE(err.find("past the tokenizer's 264 tokens (the model has 288)"), std::string::npos);
  EXPECT_EQ(err.find("out of range"), std::string::npos) << err;
}

}  // namespace
}  // namespace kvb
