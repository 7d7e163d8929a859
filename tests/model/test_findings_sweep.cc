// A sweep whose config states claims (findings:), end to end: `kvbench query findings` reads them
// from the database's stored config, scripts/check_findings.py recomputes every verdict on its
// own from the same database and agrees, and the report shows the verdicts first. stories260K
// (../shared): streaming perplexity over six WikiText-2 segments and a NIAH whose baseline fails.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/run_kvbench.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTokenizer = KVB_SHARED_DIR "/models/stories260K/tok512.bin";
const std::string kText = KVB_SHARED_DIR "/data/wikitext-2/test.txt";

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(FindingsSweep, VerdictsAgreeWithTheIndependentScriptAndLeadTheReport) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_findings_sweep";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path cfg = dir / "paper.yaml";
  std::ofstream(cfg)
      << "models:\n"
         "  - {name: stories, path: "
      << kModel << ", tokenizer: " << kTokenizer
      << "}\n"
         "tasks:\n"
         "  - {name: perplexity, options: {file: "
      << kText
      << ", max_tokens: 128, segments: 6, ranges: \"0-64,64-128\"}}\n"
         "  - {name: niah, options: {context_lengths: [256], depths: [20, 80], chat: false}}\n"
         "policies: [full, window, h2o]\n"
         "kv_budget: [16, 48, {ratio: 0.5}]\n"
         "threads: 1\n"
         "findings:\n"
         "  paper: Toy paper\n"
         "  baselines:\n"
         "    - {task: niah, metric: recall, at_least: 0.9}\n"
         "  claims:\n"
         "    - id: window-worse\n"
         "      claim: a recent window loses perplexity against the full cache\n"
         "      task: perplexity\n"
         "      metric: ppl\n"
         "      compare: {policy: window, kv_budget: [16, 48]}\n"
         "      expect: worse\n"
         "      margin: 1%\n"
         "    - id: h2o-near-window\n"
         "      claim: H2O is no worse than the window at 16\n"
         "      task: perplexity\n"
         "      metric: ppl_64_128\n"
         "      compare: {policy: h2o, kv_budget: 16}\n"
         "      against: window\n"
         "      expect: at_least\n"
         "      margin: 0.5\n"
         "    - id: gain-shrinks\n"
         "      claim: H2O's gain over the window is larger at 16 than at 48\n"
         "      task: perplexity\n"
         "      metric: ppl\n"
         "      contrast:\n"
         "        - {weight: 1, policy: h2o, kv_budget: 16}\n"
         "        - {weight: -1, policy: window, kv_budget: 16}\n"
         "        - {weight: -1, policy: h2o, kv_budget: 48}\n"
         "        - {weight: 1, policy: window, kv_budget: 48}\n"
         "      expect: better\n"
         "    - id: needle\n"
         "      claim: H2O keeps the needle\n"
         "      task: niah\n"
         "      metric: recall\n"
         "      compare: {policy: h2o, kv_budget: 48}\n"
         "      expect: at_least\n"
         "      margin: 0.1\n";
  const std::string db = (dir / "r.db").string();
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"sweep", cfg.string(), "--db", db}, &out, &err), 0) << err;

  // A fraction of a perplexity sample is of the max_tokens it scores (128), not of its text.
  ASSERT_EQ(testing::kvbench({"query", "--db", db,
                              "SELECT DISTINCT task, kv_budget FROM units WHERE kv_budget_spec "
                              "= '0.5 ratio' ORDER BY task",
                              "-o", "csv"},
                             &out, &err),
            0)
      << err;
  EXPECT_EQ(out.substr(0, out.find('\n', out.find("perplexity"))).substr(out.find("perplexity")),
            "perplexity,64");
  ASSERT_EQ(testing::kvbench({"query", "--db", db, "findings", "-o", "jsonl"}, &out, &err), 0)
      << err;
  // 2 budgets + all, 1, 1, 1 rows.
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 6) << out;
  EXPECT_NE(out.find("\"id\":\"needle\""), std::string::npos);
  EXPECT_NE(out.find("\"why\":\"baseline: full's recall is"), std::string::npos) << out;
  EXPECT_NE(out.find("\"kv_budget\":\"all\""), std::string::npos);
  const fs::path jsonl = dir / "kvbench.jsonl";
  std::ofstream(jsonl) << out;
  const std::string cmd =
      "/usr/bin/python3 " KVB_EXAMPLES_DIR "/../scripts/check_findings.py --db " + db +
      " --kvbench-jsonl " + jsonl.string() + " > " + (dir / "check.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read(dir / "check.txt");
  EXPECT_NE(read(dir / "check.txt").find("agree: 6 rows"), std::string::npos)
      << read(dir / "check.txt");

  // The same claims from --config; the report's first section.
  std::string from_config;
  ASSERT_EQ(
      testing::kvbench({"query", "--db", db, "findings", "--config", cfg.string(), "-o", "jsonl"},
                       &from_config, &err),
      0)
      << err;
  EXPECT_EQ(from_config, out);
  ASSERT_EQ(
      testing::kvbench({"report", "--db", db, "--out", (dir / "report").string()}, &out, &err), 0)
      << err;
  const std::string html = read(dir / "report" / "index.html");
  const size_t findings = html.find("<section id=\"findings\">");
  const size_t scores = html.find("<section id=\"scores\">");
  ASSERT_NE(findings, std::string::npos);
  ASSERT_NE(scores, std::string::npos);
  EXPECT_LT(findings, scores);
  EXPECT_NE(html.find("Toy paper"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "report" / "csv" / "findings.csv"));
}

// A database swept from a config without findings: says so and how to give them.
TEST(FindingsSweep, ADatabaseWithoutFindingsNamesTheFix) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_findings_sweep_none";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path cfg = dir / "plain.yaml";
  std::ofstream(cfg) << "models:\n  - {path: " << kModel << ", tokenizer: " << kTokenizer
                     << "}\ntasks:\n  - {name: niah, options: {context_lengths: [256], depths: "
                        "[50], chat: false}}\npolicies: [full]\nthreads: 1\n";
  const std::string db = (dir / "r.db").string();
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"sweep", cfg.string(), "--db", db}, &out, &err), 0) << err;
  EXPECT_EQ(testing::kvbench({"query", "--db", db, "findings"}, &out, &err), 2);
  EXPECT_NE(err.find("give the config with --config FILE"), std::string::npos) << err;
  EXPECT_EQ(
      testing::kvbench({"query", "--db", db, "findings", "--config", cfg.string()}, &out, &err), 2);
  EXPECT_NE(err.find("has no findings: section"), std::string::npos) << err;
}

}  // namespace
}  // namespace kvb
