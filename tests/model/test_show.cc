// `kvbench show` (issue 34 "Prompts you can see"): the prompt a unit ran, rebuilt from the
// config's inputs as they are now, equals the stored prompt_sha256 (an independent record: the
// worker hashed the token ids it fed the model); an edited data item makes its units' prompts
// unshowable (refused, naming why) while the others still show; dataset text that would drive a
// terminal is escaped. A user's project (YAML task + jsonl) with stories260K from KVB_SHARED_DIR.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "results/store.h"
#include "run_kvbench.h"

namespace kvb {
namespace {
namespace fs = std::filesystem;
using kvb::testing::kvbench;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTokenizer = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

void write_data(const std::string& path, const std::string& q1) {
  std::ofstream(path) << "{\"id\": \"q0\", \"question\": \"Where is the cat?\", \"answer\": \"home\"}\n"
                      << "{\"id\": \"q1\", \"question\": \"" << q1 << "\", \"answer\": \"park\"}\n";
}

std::string one(const std::string& db, const std::string& sql) {
  results::Store s = results::Store::open(db, results::Mode::kReadOnly);
  const results::QueryResult r = s.query(sql);
  return r.rows.empty() ? "" : r.rows[0][0].text;
}

TEST(Show, RebuildsTheStoredPromptAndRefusesChangedInputs) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string dir = std::string(KVB_BINARY_DIR) + "/test_show_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/tasks");
  std::ofstream(dir + "/tasks/myqa.yaml") << "task: myqa\ndata: myqa.jsonl\nid: id\nchat: false\n"
                                             "question: \"Q: {{question}}\\nA:\"\nreference: answer\n"
                                             "metric: qa_f1\nmax_new_tokens: 4\n";
  // The template in lm-eval's Jinja habit ({{question}}: the field, not literal braces). q1 holds
  // an ESC sequence (it would clear a terminal) and a C1 control character.
  write_data(dir + "/tasks/myqa.jsonl", "Where is \\u001b[2Jthe dog\\u0085?");
  const std::string config = dir + "/sweep.yaml";
  std::ofstream(config) << "models:\n  - {name: stories, path: " << kModel
                        << ", tokenizer: " << kTokenizer << "}\n"
                        << "tasks: [myqa]\npolicies: [full, window]\nkv_budget: [16]\n";
  const std::string db = dir + "/results.db";
  ASSERT_EQ(kvbench({"sweep", config, "--db", db}, nullptr), 0);
  const std::string q0 = one(db, "SELECT unit_key FROM units WHERE sample_id = 'q0' AND policy = "
                                 "'window'");
  const std::string q1 = one(db, "SELECT unit_key FROM units WHERE sample_id = 'q1' AND policy = "
                                 "'full'");
  const std::string q1_sha = one(db, "SELECT prompt_sha256 FROM measurements WHERE unit_key = '" +
                                         q1 + "'");
  ASSERT_EQ(q1_sha.size(), 64u);

  std::string out, err;
  ASSERT_EQ(kvbench({"show", "--config", config, "--db", db, q1.substr(0, 12)}, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("# unit " + q1 + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("SHA-256 " + q1_sha + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("equals the stored prompt_sha256"), std::string::npos) << out;
  EXPECT_NE(out.find("Q: Where is \\x1b[2Jthe dog\\u0085?\nA:"), std::string::npos) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos);

  // q1 edited: its units cannot be shown from these inputs; q0's still can.
  write_data(dir + "/tasks/myqa.jsonl", "Where is the bird?");
  out.clear();
  err.clear();
  EXPECT_EQ(kvbench({"show", "--config", config, "--db", db, q1}, &out, &err), 2);
  EXPECT_NE(err.find("is not a unit of " + config + " as its files are now"), std::string::npos)
      << err;
  out.clear();
  ASSERT_EQ(kvbench({"show", "--config", config, "--db", db, q0}, &out, &err), 0) << err;
  EXPECT_NE(out.find("Q: Where is the cat?\nA:"), std::string::npos) << out;

  // Bad keys are usage errors that say what a key is.
  err.clear();
  EXPECT_EQ(kvbench({"show", "--config", config, "--db", db, "xyz"}, nullptr, &err), 2);
  EXPECT_NE(err.find("is not a key"), std::string::npos) << err;
  EXPECT_EQ(kvbench({"show", "--config", config, "--db", db, std::string(64, '0')}, nullptr, &err),
            2);
  fs::remove_all(dir);
}

// A perplexity unit: the scored stream, hashed as the worker hashed it.
TEST(Show, PerplexityUnitsShowTheScoredStream) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string config = std::string(KVB_FIXTURES_DIR) + "/../../configs/ci_smoke.yaml";
  const std::string db =
      std::string(KVB_BINARY_DIR) + "/test_show_ppl_" + std::to_string(::getpid()) + ".db";
  for (const char* ext : {"", "-wal", "-shm"}) fs::remove(db + ext);
  ASSERT_EQ(kvbench({"sweep", config, "--db", db}, nullptr), 0);
  const std::string key = one(db, "SELECT unit_key FROM units WHERE task = 'perplexity' AND "
                                  "policy = 'h2o' LIMIT 1");
  std::string out, err;
  ASSERT_EQ(kvbench({"show", "--config", config, "--db", db, key}, &out, &err), 0) << err;
  EXPECT_NE(out.find("# prompt: 128 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("equals the stored prompt_sha256"), std::string::npos) << out;
  for (const char* ext : {"", "-wal", "-shm"}) fs::remove(db + ext);
}

}  // namespace
}  // namespace kvb
