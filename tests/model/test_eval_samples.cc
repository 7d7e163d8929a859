// `kvbench eval -o jsonl` and `--log-samples` (issue 34 F3): one typed object per sample under
// plain keys, with the prediction, the references, the scores and the prompt's hash and token
// count, then the aggregate row with its interval's bounds as keys of their own. The prompt hash
// is checked against an independent record of the same prompt: the sweep's measurements of the
// same sample (the worker hashes the token ids it fed the model). On stories260K.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "results/store.h"
#include "run_kvbench.h"

namespace kvb {
namespace {
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTok = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

std::vector<nlohmann::json> lines_of(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) out.push_back(nlohmann::json::parse(l));  // each line is one JSON object
  }
  return out;
}

TEST(EvalSamples, JsonlRowsHavePlainKeysPredictionReferencesAndThePromptHash) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir =
      std::string(KVB_BINARY_DIR) + "/test_eval_samples_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> task = {"--task", "niah", "--task-opt", "context_lengths=128",
                                         "--task-opt", "depths=0,100", "--task-opt",
                                         "haystack=noise", "--task-opt", "chat=false"};
  std::vector<std::string> args = {"eval", "--model", kModel, "--tokenizer", kTok, "--policy",
                                   "window", "--kv-budget", "32", "-o", "jsonl", "--log-samples",
                                   dir + "/samples.jsonl"};
  args.insert(args.end(), task.begin(), task.end());
  std::string out, err;
  ASSERT_EQ(testing::kvbench(args, &out, &err), 0) << err;
  const std::vector<nlohmann::json> rows = lines_of(out);
  ASSERT_EQ(rows.size(), 3u) << out;
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json& r = rows[i];
    EXPECT_TRUE(r.at("sample_id").is_string());
    EXPECT_TRUE(r.at("prediction").is_string());  // text stays text, even "1e5"
    ASSERT_TRUE(r.at("references").is_array());
    EXPECT_EQ(r.at("references").at(0), "eat a sandwich and sit in Dolores Park on a sunny day.");
    EXPECT_TRUE(r.at("scores").at("recall").is_number());
    EXPECT_EQ(r.at("prompt_tokens"), 128);
    EXPECT_EQ(r.at("prompt_sha256").get<std::string>().size(), 64u);
    EXPECT_EQ(r.at("status"), "ok");
    EXPECT_EQ(r.at("kv_budget"), 32);
    EXPECT_EQ(r.at("fields").at("context_length"), "128");
    for (const auto& [k, v] : r.items()) {
      EXPECT_EQ(k.find_first_of(" ↑↓/"), std::string::npos) << "key '" << k << "' is not plain";
    }
  }
  const nlohmann::json& agg = rows[2];
  EXPECT_EQ(agg.at("task"), "niah");
  EXPECT_EQ(agg.at("n"), 2);
  EXPECT_TRUE(agg.at("recall").is_number());
  EXPECT_LE(agg.at("recall_ci95_lo").get<double>(), agg.at("recall").get<double>());
  EXPECT_GE(agg.at("recall_ci95_hi").get<double>(), agg.at("recall").get<double>());
  // --log-samples holds the same sample rows.
  std::ifstream f(dir + "/samples.jsonl");
  std::stringstream logged;
  logged << f.rdbuf();
  const std::vector<nlohmann::json> log_rows = lines_of(logged.str());
  ASSERT_EQ(log_rows.size(), 2u);
  EXPECT_EQ(log_rows[0], rows[0]);
  EXPECT_EQ(log_rows[1], rows[1]);

  // The same samples through a sweep: the same prompt hashes and references.
  std::ofstream(dir + "/sweep.yaml")
      << "models:\n  - {name: s, path: " << kModel << ", tokenizer: " << kTok << "}\n"
      << "tasks:\n  - name: niah\n    options: {context_lengths: [128], depths: [0, 100], "
         "haystack: noise, chat: false}\npolicies: [window]\nkv_budget: [32]\n";
  ASSERT_EQ(testing::kvbench({"sweep", dir + "/sweep.yaml", "--db", dir + "/r.db"}, nullptr), 0);
  results::Store store = results::Store::open(dir + "/r.db", results::Mode::kReadOnly);
  for (int i = 0; i < 2; ++i) {
    const results::QueryResult q = store.query(
        "SELECT m.prompt_sha256, p.prediction FROM units u JOIN measurements m USING (unit_key) "
        "JOIN predictions p USING (unit_key) WHERE u.sample_id = ?1",
        {rows[i].at("sample_id").get<std::string>()});
    ASSERT_EQ(q.rows.size(), 1u);
    EXPECT_EQ(q.rows[0][0].text, rows[i].at("prompt_sha256"));
    EXPECT_EQ(q.rows[0][1].text, rows[i].at("prediction"));
  }

  // md keeps its headers for people and labels the interval.
  out.clear();
  std::vector<std::string> md = {"eval", "--model", kModel, "--tokenizer", kTok};
  md.insert(md.end(), task.begin(), task.end());
  ASSERT_EQ(testing::kvbench(md, &out, &err), 0);
  EXPECT_NE(out.find("| recall ↑"), std::string::npos) << out;
  EXPECT_NE(out.find("(lo, hi): 95% intervals: Wilson"), std::string::npos) << out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvb
