// Sweep config loading (harness/sweep_config.h, configs/README.md): list, range and option
// expansion, exclusions, includes, and errors that name file:line: key. Model: stories260K's
// header from KVB_SHARED_DIR (no weights are loaded); configs are written to KVB_BINARY_DIR.
#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "harness/cli.h"
#include "harness/model_info.h"
#include "harness/sweep_config.h"
#include "harness/sweep_roles.h"
#include "harness/task_file.h"
#include "results/analysis.h"
#include "results/store.h"

namespace kvb::harness {
namespace {

// The shipped definitions (configs/tasks) by name: kvbench finds them on the task search path
// (harness/task_file.h), never by a path compiled into it; these tests put them there.
const std::string kShippedTasks = std::string(KVB_FIXTURES_DIR) + "/../../configs/tasks";
[[maybe_unused]] const bool kShippedOnSearchPath = [] {
  return ::setenv("KVBENCH_TASK_PATH", kShippedTasks.c_str(), 1) == 0;
}();
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTokenizer = KVB_SHARED_DIR "/models/stories260K/tok512.bin";
const std::string kDir = KVB_BINARY_DIR "/test_sweep_config";

std::string write(const std::string& name, const std::string& text) {
  const std::string path = kDir + "/" + name;
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
}

std::string model_yaml() {
  return "models:\n  - {path: " + kModel + ", tokenizer: " + kTokenizer + "}\n";
}

// A valid config; each test overrides pieces. Lines: 1-2 models, 3-5 tasks, 6 policies.
std::string base_yaml(const std::string& policies = "policies: [full]\n") {
  return model_yaml() +
         "tasks:\n"
         "  - name: niah\n"
         "    options: {context_lengths: [256, 384], depths: [0, 50, 100], haystack: noise, "
         "chat: false}\n" +
         policies;
}

// The usage error message of loading `text` (fails the test if it loads).
std::string load_error(const std::string& name, const std::string& text) {
  const std::string path = write(name, text);
  try {
    load_sweep_config(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << name << " loaded without error";
  return "";
}

class SweepConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  }
};

TEST(SweepRange, Expands) {
  EXPECT_EQ(expand_int_range("64-512*2", "b"), (std::vector<int64_t>{64, 128, 256, 512}));
  EXPECT_EQ(expand_int_range("100-400+100", "b"), (std::vector<int64_t>{100, 200, 300, 400}));
  EXPECT_EQ(expand_int_range("64-500*2", "b"), (std::vector<int64_t>{64, 128, 256}));
  EXPECT_EQ(expand_int_range("4k-16k*2", "b"), (std::vector<int64_t>{4096, 8192, 16384}));
  EXPECT_EQ(expand_int_range("0-3", "b"), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(expand_int_range("7, 10-30+10", "b"), (std::vector<int64_t>{7, 10, 20, 30}));
  EXPECT_EQ(expand_int_range("256", "b"), (std::vector<int64_t>{256}));
  for (const char* bad : {"512-64*2", "a-b", "64-512*1", "64-512+0", "-5", "", "12x"}) {
    EXPECT_THROW(expand_int_range(bad, "budget"), Error) << bad;
  }
}

TEST_F(SweepConfigTest, ModelInfoFromHeader) {
  const ModelInfo i = read_model_info(kModel);
  EXPECT_EQ(i.format, "llama2c");
  EXPECT_EQ(i.max_seq_len, 512);
  EXPECT_EQ(i.num_layers, 5);
  EXPECT_EQ(i.num_heads, 8);
  EXPECT_EQ(i.num_kv_heads, 4);
  EXPECT_EQ(i.head_dim, 8);
  EXPECT_EQ(i.file_bytes, fs::file_size(kModel));
  EXPECT_GT(i.num_params, 200000u);
  EXPECT_LE(28 + 4 * i.num_params, i.file_bytes);
}

TEST_F(SweepConfigTest, ExpansionCounts) {
  const std::string path =
      write("expand.yaml",
            base_yaml("policies:\n"
                      "  - full\n"
                      "  - {name: h2o, options: {heavy_fraction: [0.25, 0.5]}}\n"
                      "  - {name: snapkv, options: {window: [8, 16], pool_kernel: [3, 5]}}\n") +
                "budgets: [64, \"64-256*2\", {ratio: 0.5}]\n"
                "question: [in_prompt, after_compression]\n"
                "seeds: [0, \"1-2\"]\n"
                "limit: 4\n"
                "exclude:\n"
                "  - {policy: h2o, kv_budget: 256}\n"
                "  - {policy: full, question: after_compression}\n"
                "  - {policy: snapkv, kv_ratio: 0.5, seed: [1, 2]}\n");
  const SweepConfig c = load_sweep_config(path);
  ASSERT_EQ(c.models.size(), 1u);
  EXPECT_EQ(c.models[0].name, "stories260K");
  EXPECT_EQ(c.models[0].info.max_seq_len, 512);
  ASSERT_EQ(c.tasks.size(), 1u);
  EXPECT_EQ(c.tasks[0].options.at("context_lengths"), "256,384");
  EXPECT_EQ(c.tasks[0].options.at("depths"), "0,50,100");
  EXPECT_EQ(c.tasks[0].options.count("limit"), 0u);
  EXPECT_EQ(task_options(c, c.tasks[0]).values().at("limit"), "4");
  // full + 2 h2o + 2x2 snapkv
  ASSERT_EQ(c.policies.size(), 7u);
  EXPECT_EQ(c.policies[1].spec(), "h2o heavy_fraction=0.25");
  EXPECT_EQ(c.policies[3].spec(), "snapkv pool_kernel=3 window=8");
  // 64 listed twice (plain and in the range) is kept once.
  ASSERT_EQ(c.budgets.size(), 4u);
  EXPECT_EQ(c.budgets[0].spec(), "64");
  EXPECT_EQ(c.budgets[2].spec(), "256");
  EXPECT_EQ(c.budgets[3].spec(), "0.5 ratio");
  EXPECT_EQ(c.questions, (std::vector<std::string>{"in_prompt", "after_compression"}));
  EXPECT_EQ(c.seeds, (std::vector<uint64_t>{0, 1, 2}));
  ASSERT_EQ(c.exclude.size(), 4u);  // the seed list made two rules
  // (1 full + 6 x 4 budgets) x 2 questions x 3 seeds = 150; minus h2o@256: 2 x 2 x 3 = 12,
  // full@after_compression: 3, snapkv@0.5 ratio seeds 1-2: 4 x 2 x 2 = 16.
  const std::vector<ConfigCell> cells = expand_config_cells(c);
  EXPECT_EQ(cells.size(), 150u - 12 - 3 - 16);
  for (const ConfigCell& cell : cells) {
    const auto axes = cell_axes(c, cell);
    EXPECT_FALSE(axes.at("policy") == "h2o" && axes.at("kv_budget") == "256");
    EXPECT_EQ(axes.count("kv_budget"), c.policies[cell.policy].name == "full" ? 0u : 1u);
  }
  EXPECT_TRUE(excluded(c, {{"policy", "h2o"}, {"kv_budget", "256"}, {"model", "x"}}));
  EXPECT_FALSE(excluded(c, {{"policy", "h2o"}, {"kv_budget", "128"}}));
  EXPECT_FALSE(excluded(c, {{"policy", "h2o"}}));  // a key the unit lacks does not match
}

TEST_F(SweepConfigTest, ChoiceOptionListsExpandTasksAndPathsResolve) {
  write("data/text.txt", "Once upon a time there was a little model.\n");
  const std::string path =
      write("paths.yaml", model_yaml() +
                              "tasks:\n"
                              "  - {name: perplexity, options: {file: data/text.txt}}\n"
                              "  - name: niah\n"
                              "    options: {haystack: [noise, kjv], context_lengths: 256}\n"
                              "policies: [full]\n");
  const SweepConfig c = load_sweep_config(path);
  ASSERT_EQ(c.tasks.size(), 3u);
  EXPECT_EQ(c.tasks[0].options.at("file"), (fs::path(kDir) / "data/text.txt").string());
  EXPECT_EQ(c.tasks[1].options.at("haystack"), "noise");
  EXPECT_EQ(c.tasks[2].options.at("haystack"), "kjv");
}

TEST_F(SweepConfigTest, IncludesMergeAndTheIncludingFileWins) {
  write("inc/common.yaml", model_yaml() +
                               "budgets: [128]\n"
                               "generation: {temperature: 0.5, max_new_tokens: 8}\n"
                               "seeds: [7]\n");
  const std::string path = write("with_include.yaml", "include: [inc/common.yaml]\n" +
                                                          base_yaml("policies: [window]\n") +
                                                          "budgets: [64]\n"
                                                          "generation: {max_new_tokens: 4}\n");
  const SweepConfig c = load_sweep_config(path);
  ASSERT_EQ(c.models.size(), 1u);  // from the include
  ASSERT_EQ(c.budgets.size(), 1u);
  EXPECT_EQ(c.budgets[0].tokens, 64);  // the including file wins
  EXPECT_EQ(c.generation.max_new_tokens, 4);
  EXPECT_FLOAT_EQ(c.generation.temperature, 0.5f);  // maps merge key by key
  EXPECT_EQ(c.seeds, (std::vector<uint64_t>{7}));
  EXPECT_EQ(c.text.rfind("include: [inc/common.yaml]\n", 0), 0u);
  EXPECT_NE(c.text.find("# --- include: " + kDir + "/inc/common.yaml\n"), std::string::npos);
  EXPECT_NE(c.text.find("temperature: 0.5"), std::string::npos);

  write("cycle_a.yaml", "include: cycle_b.yaml\n");
  write("cycle_b.yaml", "include: cycle_a.yaml\n");
  EXPECT_NE(load_error("cycle_a.yaml", "include: cycle_b.yaml\n").find("include cycle"),
            std::string::npos);
  // An error inside an included file names that file and its line.
  write("inc/bad.yaml", "budgets: [128]\nthreads: -1\n");
  const std::string e = load_error("inc_bad.yaml", "include: inc/bad.yaml\n" + base_yaml());
  EXPECT_NE(e.find(kDir + "/inc/bad.yaml:2: threads: -1 is outside [0, 4096]"), std::string::npos)
      << e;
}

// Each error names file:line: key and says what is wrong.
TEST_F(SweepConfigTest, ErrorsNameFileLineAndKey) {
  struct Case {
    const char* name;
    std::string text;
    std::vector<std::string> expect;  // substrings ("@" is replaced by the file's path)
  };
  const std::vector<Case> cases = {
      {"invalid.yaml", base_yaml() + "budgets: [64, 128\n", {"@:8:", "invalid YAML"}},
      {"unknown_top.yaml",
       base_yaml() + "polices: [h2o]\n",
       {"@:7: polices: unknown key 'polices'; allowed keys:", "policies", "budgets"}},
      {"unknown_policy.yaml",
       base_yaml("policies:\n  - full\n  - h3o\n") + "budgets: [64]\n",
       {"@:8: policies[1]: unknown policy 'h3o'; known policies:", "snapkv", "h2o"}},
      {"unknown_policy_option.yaml",
       base_yaml("policies:\n  - name: h2o\n    options: {heavy: 0.5}\n") + "budgets: [64]\n",
       {"@:8: policies[0].options.heavy:", "has no option 'heavy'", "heavy_fraction"}},
      {"bad_policy_value.yaml",
       base_yaml("policies:\n  - name: h2o\n    options:\n      heavy_fraction: [0.5, 2]\n") +
           "budgets: [64]\n",
       {"@:9: policies[0].options.heavy_fraction:", "outside [0, 1]"}},
      {"budget_zero.yaml",
       base_yaml("policies: [h2o]\n") + "budgets:\n  - 64\n  - 0\n",
       {"@:9: budgets[1]: a budget of 0 tokens is not allowed"}},
      {"ratio.yaml",
       base_yaml("policies: [h2o]\n") + "budgets: [{ratio: 1.5}]\n",
       {"@:7: budgets[0].ratio: 1.5 is outside (0, 1]"}},
      {"compression_ratio.yaml",
       base_yaml("policies: [h2o]\n") + "budgets: [{compression_ratio: 1}]\n",
       {"@:7: budgets[0].compression_ratio: 1 is outside [0, 1) (the fraction removed)"}},
      {"both_ratios.yaml",
       base_yaml("policies: [h2o]\n") + "budgets: [{ratio: 0.5, compression_ratio: 0.5}]\n",
       {"@:7: budgets[0]: give ratio (the fraction kept) or compression_ratio"}},
      {"budget_context.yaml",
       base_yaml("policies: [h2o]\n") + "budgets: [128, \"256-1024*2\"]\n",
       {"@:7: budgets[1]: kv_budget 1024 exceeds the context of model 'stories260K' (512 tokens)"}},
      {"no_budgets.yaml", base_yaml("policies: [h2o]\n"), {"@:1: budgets: required"}},
      {"missing_model.yaml",
       "models:\n  - name: m\n    path: nowhere/model.gguf\n" +
           base_yaml().substr(model_yaml().size()),
       {"@:3: models[0].path: model file '" + kDir + "/nowhere/model.gguf' does not exist"}},
      {"missing_tokenizer.yaml",
       "models:\n  - " + kModel + "\n" + base_yaml().substr(model_yaml().size()),
       {"@:2: models[0]: llama2.c model", "needs tokenizer:"}},
      {"missing_data.yaml",
       model_yaml() + "tasks:\n  - name: perplexity\n    options:\n      file: nope/wiki.txt\n" +
           "policies: [full]\n",
       {"@:6: tasks[0].options.file: file '" + kDir + "/nope/wiki.txt' does not exist"}},
      {"unknown_task.yaml",
       model_yaml() + "tasks: [niha]\npolicies: [full]\n",
       {"@:3: tasks[0]: unknown task 'niha'; known tasks:", "niah"}},
      {"unknown_task_option.yaml",
       model_yaml() + "tasks:\n  - name: niah\n    options: {depth: 50}\npolicies: [full]\n",
       {"@:5: tasks[0].options.depth:", "has no option 'depth'", "depths"}},
      {"unknown_model_key.yaml",
       "models:\n  - {path: " + kModel + ", tokeniser: x}\n" +
           base_yaml().substr(model_yaml().size()),
       {"@:2: models[0].tokeniser: unknown key 'tokeniser'; allowed keys: name, path, tokenizer"}},
      {"bad_question.yaml",
       base_yaml() + "question: [in_prompt, later]\n",
       {"@:7: question[1]: 'later' is not allowed"}},
      {"bad_exclude.yaml",
       base_yaml("policies: [full, h2o]\n") +
           "budgets: [64]\nexclude:\n  - {policy: h2o, kv_budget: 32}\n",
       {"@:9: exclude[0].kv_budget: '32' is not in this config; its values: 64"}},
      {"bad_range.yaml",
       base_yaml("policies: [h2o]\n") + "budgets: [\"512-64*2\"]\n",
       {"@:7: budgets[0]: budget range '512-64*2' runs backwards"}},
      {"missing_tasks.yaml", model_yaml() + "policies: [full]\n", {"@:1: tasks: required"}},
  };
  for (const Case& c : cases) {
    const std::string e = load_error(c.name, c.text);
    for (std::string want : c.expect) {
      const size_t at = want.find('@');
      if (at != std::string::npos) want.replace(at, 1, kDir + "/" + c.name);
      EXPECT_NE(e.find(want), std::string::npos)
          << c.name << "\n  error: " << e << "\n  wanted: " << want;
    }
  }
}

// Runs `kvbench ARGS...` in-process and captures stdout and stderr.
int run_kvbench(std::vector<std::string> args, std::string& out, std::string& err) {
  args.insert(args.begin(), "kvbench");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream o, e;
  std::streambuf* old_out = std::cout.rdbuf(o.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(e.rdbuf());
  const int rc = run_cli(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  out = o.str();
  err = e.str();
  return rc;
}

TEST_F(SweepConfigTest, ValidateCommand) {
  const std::string path =
      write("validate_ok.yaml",
            base_yaml("policies:\n  - full\n  - {name: snapkv, options: {window: [8, 16]}}\n") +
                "budgets: [\"64-256*2\"]\n"
                "seeds: [0, 1]\n"
                "exclude: [{policy: snapkv, kv_budget: 256, seed: 1}]\n");
  std::string out, err;
  ASSERT_EQ(run_kvbench({"validate", path}, out, err), 0) << err;
  // niah: 2 lengths x 3 depths = 6 samples; cells: (1 + 2 x 3) x 2 seeds - 2 = 12.
  EXPECT_NE(out.find("units: 72\n"), std::string::npos) << out;
  EXPECT_NE(out.find("12 cells"), std::string::npos) << out;
  EXPECT_NE(out.find("| stories260K |"), std::string::npos) << out;
  EXPECT_NE(out.find("approximate"), std::string::npos);
  EXPECT_NE(out.find("ASSUMING 400 prefill tok/s and 20 decode tok/s per rank"), std::string::npos);

  // The decode estimate under decode_batch: 12 cells, so each of the 6 samples is a bundle of
  // 12 generation units of 10 tokens. One at a time: 6 x 12 x 10 = 720 steps; all together
  // (auto): 6 x 10 x (1 + 0.3 x 11) = 258; up to 5: 6 x 10 x (2 x (1 + 0.3 x 4) + (1 + 0.3)) = 342.
  for (const auto& [batch, steps] : std::vector<std::pair<std::string, std::string>>{
           {"1", "720"}, {"auto", "258"}, {"5", "342"}}) {
    const std::string p = write("validate_batch_" + batch + ".yaml",
                                base_yaml("policies:\n  - full\n  - {name: snapkv, options: "
                                          "{window: [8, 16]}}\n") +
                                    "budgets: [\"64-256*2\"]\nseeds: [0, 1]\n"
                                    "exclude: [{policy: snapkv, kv_budget: 256, seed: 1}]\n"
                                    "generation: {max_new_tokens: 10}\ndecode_batch: " +
                                    batch + "\n");
    ASSERT_EQ(run_kvbench({"validate", p}, out, err), 0) << err;
    EXPECT_NE(out.find(": " + steps + " single-sequence steps\n"), std::string::npos)
        << batch << "\n"
        << out;
  }

  const std::string bad =
      write("validate_bad.yaml", base_yaml("policies: [h2o]\n") + "budgets: [0]\n");
  EXPECT_EQ(run_kvbench({"validate", bad}, out, err), 2);
  EXPECT_NE(err.find(bad + ":7: budgets[0]: a budget of 0"), std::string::npos) << err;
  EXPECT_EQ(run_kvbench({"validate"}, out, err), 2);
  EXPECT_EQ(run_kvbench({"validate", "--help"}, out, err), 0);

  EXPECT_NE(out.find("usage: kvbench validate CONFIG"), std::string::npos);

  // A task that wraps prompts in the chat template, on a model without one (stories260K): every
  // unit would fail, so validate refuses and names the way out.
  const std::string chat = write(
      "validate_chat.yaml",
      model_yaml() + "tasks: [{name: niah, options: {context_lengths: [256], depths: [0]}}]\n"
                     "policies: [full]\n");
  EXPECT_EQ(run_kvbench({"validate", chat}, out, err), 2);
  EXPECT_NE(err.find("has none kvbench recognizes"), std::string::npos) << err;
  EXPECT_NE(err.find("chat: false"), std::string::npos) << err;
}

// One name per axis (issue 14 item 4): kv_budget: and seed: at the top, kv_budget: {ratio: r}
// in exclude:, give exactly the matrix of the old spellings budgets:, seeds: and kv_ratio:; the
// old ones leave a note naming file:line and the new spelling, the new ones none.
TEST_F(SweepConfigTest, NewAndOldAxisNamesExpandAlike) {
  const std::string policies = "policies:\n  - full\n  - h2o\n  - snapkv\n";
  const std::string old_path =
      write("axes_old.yaml", base_yaml(policies) +
                                 "budgets: [64, \"128-256*2\", {ratio: 0.5}]\n"
                                 "seeds: [0, \"1-2\"]\n"
                                 "exclude:\n"
                                 "  - {policy: h2o, kv_budget: 256}\n"
                                 "  - {policy: snapkv, kv_ratio: [0.5], seed: 2}\n");
  const std::string new_path =
      write("axes_new.yaml", base_yaml(policies) +
                                 "kv_budget: [64, \"128-256*2\", {ratio: 0.5}]\n"
                                 "seed: [0, \"1-2\"]\n"
                                 "exclude:\n"
                                 "  - {policy: h2o, kv_budget: 256}\n"
                                 "  - {policy: snapkv, kv_budget: [{ratio: 0.5}], seed: 2}\n");
  const SweepConfig o = load_sweep_config(old_path);
  const SweepConfig n = load_sweep_config(new_path);
  auto specs = [](const SweepConfig& c) {
    std::vector<std::string> v;
    for (const BudgetEntry& b : c.budgets) v.push_back(b.spec());
    return v;
  };
  EXPECT_EQ(specs(n), (std::vector<std::string>{"64", "128", "256", "0.5 ratio"}));
  EXPECT_EQ(specs(o), specs(n));
  EXPECT_EQ(n.seeds, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(o.seeds, n.seeds);
  std::vector<std::map<std::string, std::string>> co, cn;
  for (const ConfigCell& c : expand_config_cells(o)) co.push_back(cell_axes(o, c));
  for (const ConfigCell& c : expand_config_cells(n)) cn.push_back(cell_axes(n, c));
  // (1 full + 2 x 4 budgets) x 3 seeds = 27, minus h2o@256 (3 seeds) and snapkv@0.5 ratio seed 2.
  EXPECT_EQ(cn.size(), 27u - 3 - 1);
  EXPECT_EQ(co, cn);
  EXPECT_TRUE(n.notes.empty());
  ASSERT_EQ(o.notes.size(), 3u);
  EXPECT_EQ(o.notes[0], old_path + ":11: seeds is a deprecated spelling; write seed: (same "
                                   "meaning, same unit keys)");
  EXPECT_EQ(o.notes[1], old_path + ":10: budgets is a deprecated spelling; write kv_budget: "
                                   "(same meaning, same unit keys)");
  EXPECT_EQ(o.notes[2], old_path + ":14: exclude[1].kv_ratio is a deprecated spelling; write "
                                   "kv_budget: {ratio: r} (same meaning, same unit keys)");
  // Both spellings of one axis: an error naming both places, also across an include.
  EXPECT_NE(load_error("axes_both.yaml", base_yaml("policies: [h2o]\n") +
                                             "kv_budget: [64]\nbudgets: [64]\n")
                .find(":8: budgets: the same axis as kv_budget ("),
            std::string::npos);
  write("axes_inc/old.yaml", "seeds: [1]\n");
  const std::string err = load_error(
      "axes_inc.yaml", "include: axes_inc/old.yaml\n" + base_yaml() + "seed: [0]\n");
  EXPECT_NE(err.find("axes_inc/old.yaml:1: seeds: the same axis as seed ("), std::string::npos)
      << err;
  // exclude: kv_budget: {ratio: r} must name a ratio of the config, like a token count.
  EXPECT_NE(load_error("axes_ratio.yaml",
                       base_yaml("policies: [h2o]\n") +
                           "kv_budget: [{ratio: 0.5}]\nexclude: [{kv_budget: {ratio: 0.25}}]\n")
                .find("'0.25 ratio' is not in this config; its values: 0.5 ratio"),
            std::string::npos);
}

// `kvbench validate` prints the deprecation notes on stderr and still accepts the config.
TEST_F(SweepConfigTest, ValidateNotesDeprecatedSpellings) {
  const std::string path = write("validate_old_axes.yaml",
                                 base_yaml("policies: [full, h2o]\n") + "budgets: [64]\n");
  std::string out, err;
  ASSERT_EQ(run_kvbench({"validate", path}, out, err), 0) << err;
  EXPECT_NE(err.find("kvbench validate: note: " + path +
                     ":7: budgets is a deprecated spelling; write kv_budget:"),
            std::string::npos)
      << err;
  const std::string now = write("validate_new_axes.yaml",
                                base_yaml("policies: [full, h2o]\n") + "kv_budget: [64]\n");
  ASSERT_EQ(run_kvbench({"validate", now}, out, err), 0) << err;
  EXPECT_EQ(err.find("deprecated"), std::string::npos) << err;
}

}  // namespace
}  // namespace kvb::harness

namespace kvb::harness {
namespace {

// decode_batch: auto (0: the whole bundle), a count, or 1 by default; bad values name the key;
// the command line's --decode-batch is parsed the same way.
TEST_F(SweepConfigTest, DecodeBatchSetting) {
  EXPECT_EQ(load_sweep_config(write("db_default.yaml", base_yaml())).decode_batch, 1);
  EXPECT_EQ(load_sweep_config(write("db_auto.yaml", base_yaml() + "decode_batch: auto\n"))
                .decode_batch,
            0);
  EXPECT_EQ(load_sweep_config(write("db_8.yaml", base_yaml() + "decode_batch: 8\n")).decode_batch,
            8);
  for (const char* bad : {"0", "-2", "many", "5000"}) {
    const std::string e =
        load_error(std::string("db_bad_") + bad + ".yaml",
                   base_yaml() + "decode_batch: " + bad + "\n");
    EXPECT_NE(e.find(":7: decode_batch"), std::string::npos) << e;
  }
  EXPECT_EQ(parse_decode_batch(""), -1);
  EXPECT_EQ(parse_decode_batch("auto"), 0);
  EXPECT_EQ(parse_decode_batch("12"), 12);
  for (const char* bad : {"0", "x", "3x", "-1", "99999"}) {
    try {
      parse_decode_batch(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find("--decode-batch"), std::string::npos) << e.what();
    }
  }
}

// prefix_cache_mib: the worker's prefix store in MiB, 1024 by default, 0 off; bad values name
// the key.
TEST_F(SweepConfigTest, PrefixCacheSetting) {
  EXPECT_EQ(load_sweep_config(write("pc_default.yaml", base_yaml())).prefix_cache_mib, 1024);
  EXPECT_EQ(
      load_sweep_config(write("pc_0.yaml", base_yaml() + "prefix_cache_mib: 0\n")).prefix_cache_mib,
      0);
  EXPECT_EQ(load_sweep_config(write("pc_64.yaml", base_yaml() + "prefix_cache_mib: 64\n"))
                .prefix_cache_mib,
            64);
  for (const char* bad : {"-1", "lots", "2000000", "1.5"}) {
    const std::string e = load_error(std::string("pc_bad_") + bad + ".yaml",
                                     base_yaml() + "prefix_cache_mib: " + bad + "\n");
    EXPECT_NE(e.find(":7: prefix_cache_mib"), std::string::npos) << e;
  }
}

// Task definitions (issue 17) are named in a matrix like built-in tasks: found by name under the
// config's tasks/ folder, then configs/tasks, or given as task_file: relative to the config.
TEST_F(SweepConfigTest, TaskDefinitionsAreFoundByNameOrFile) {
  const std::string ruler = KVB_FIXTURES_DIR "/tasks/ruler";
  write("defs_cfg/tasks/local_qa.yaml",
        "context: \"{input}\"\nreference: outputs\nmetric: string_match_part\n"
        "data: ../data/qa.jsonl\n");
  write("defs_cfg/data/qa.jsonl",
        "{\"input\": \"Where? Answer:\", \"outputs\": [\"here\"]}\n"
        "{\"outputs\": [\"there\"]}\n");
  write("defs_cfg/other/named.yaml",
        "task: by_file\ncontext: \"{input}\"\nreference: outputs\nmetric: string_match_all\n");
  const std::string path =
      write("defs_cfg/config.yaml", model_yaml() +
                                        "tasks:\n"
                                        "  - {name: ruler_jsonl_qa_1, options: {data_dir: " +
                                        ruler +
                                        ", chat: false}}\n"  // stories260K has no template
                                        "  - {name: local_qa, options: {chat: false}}\n"
                                        "  - {task_file: other/named.yaml, options: {data: " +
                                        ruler +
                                        "/qa_1.jsonl, chat: false}}\n"
                                        "policies: [full]\n"
                                        "exclude: [{task: by_file}]\n");
  const SweepConfig cfg = load_sweep_config(path);
  ASSERT_EQ(cfg.tasks.size(), 3u);
  EXPECT_EQ(cfg.tasks[0].name, "ruler_jsonl_qa_1");
  const std::string shipped = find_task_file("ruler_jsonl_qa_1", {kShippedTasks});
  EXPECT_EQ(cfg.tasks[0].options.at("task_file"), fs::weakly_canonical(shipped).string());
  EXPECT_EQ(cfg.tasks[0].options.at("task_sha256"), load_task_file(shipped).sha256);
  EXPECT_EQ(cfg.tasks[1].name, "local_qa");
  EXPECT_EQ(cfg.tasks[1].options.at("task_file"),
            fs::weakly_canonical(kDir + "/defs_cfg/tasks/local_qa.yaml").string());
  EXPECT_EQ(cfg.tasks[2].name, "by_file");
  EXPECT_EQ(expand_config_cells(cfg).size(), 2u);  // by_file excluded by its name
  // The config's limit reaches definitions too.
  SweepConfig limited = cfg;
  limited.limit = 1;
  EXPECT_EQ(task_options(limited, cfg.tasks[0]).values().at("limit"), "1");

  // validate reads the data: local_qa's line 2 lacks the field its template names.
  std::string out, err;
  EXPECT_EQ(run_kvbench({"validate", path}, out, err), 2);
  EXPECT_NE(
      err.find(kDir + "/defs_cfg/tasks/../data/qa.jsonl:2: field 'input' named by the context "
                      "template"),
      std::string::npos)
      << err;
  write("defs_cfg/data/qa.jsonl", "{\"input\": \"Where? Answer:\", \"outputs\": [\"here\"]}\n");
  ASSERT_EQ(run_kvbench({"validate", path}, out, err), 0) << err;
  EXPECT_NE(out.find("| stories260K | local_qa "), std::string::npos) << out;
}

// Issue 31: three items with one id used to count as 3 units in validate and run as 1 in the
// sweep. validate now refuses them (the sweep's planner reads the samples the same way), naming
// the data file, the id and both lines; LongBench's `_id` alike.
TEST_F(SweepConfigTest, ValidateRefusesRepeatedSampleIds) {
  write("dup_ids/tasks/dup_qa.yaml",
        "context: \"{input}\"\nreference: outputs\nmetric: string_match_part\nid: qid\n"
        "data: ../data/qa.jsonl\n");
  const std::string item = "\"input\": \"Where?\", \"outputs\": [\"here\"]}\n";
  const std::string data =
      write("dup_ids/data/qa.jsonl", "{\"qid\": \"q1\", " + item + "{\"qid\": \"q1\", " + item +
                                         "{\"qid\": \"q1\", " + item);
  const std::string lb = "\"input\": \"q\", \"context\": \"c\", \"answers\": [\"x\"]}\n";
  const std::string lb_data =
      write("dup_ids/lb/triviaqa.jsonl",
            "{\"_id\": \"a\", " + lb + "{\"_id\": \"b\", " + lb + "{\"_id\": \"b\", " + lb);
  const std::string path = write(
      "dup_ids/config.yaml",
      model_yaml() + "tasks:\n  - {name: dup_qa, options: {chat: false}}\npolicies: [full]\n");
  std::string out, err;
  EXPECT_EQ(run_kvbench({"validate", path}, out, err), 2);
  EXPECT_NE(err.find(kDir + "/dup_ids/tasks/../data/qa.jsonl:2: sample id \"q1\" (the field 'qid' "
                            "named by id: in "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(") repeats the id of line 1; sample ids key the results"), std::string::npos)
      << err;
  const std::string lb_path =
      write("dup_ids/lb_config.yaml",
            model_yaml() + "tasks:\n  - {name: longbench, options: {dataset: triviaqa, data_dir: " +
                kDir + "/dup_ids/lb}}\npolicies: [full]\n");  // triviaqa: no chat template
  EXPECT_EQ(run_kvbench({"validate", lb_path}, out, err), 2);
  EXPECT_NE(err.find(lb_data + ":3: sample id \"b\" (key '_id', or <dataset>-<item number> "
                               "without it) repeats the id of line 2"),
            std::string::npos)
      << err;
  // Distinct ids: 3 samples, 3 units.
  write("dup_ids/data/qa.jsonl",
        "{\"qid\": \"q1\", " + item + "{\"qid\": \"q2\", " + item + "{\"qid\": \"q3\", " + item);
  ASSERT_EQ(run_kvbench({"validate", path}, out, err), 0) << err;
  EXPECT_NE(out.find("units: 3\n"), std::string::npos) << out;
}

// A sweep whose matrix does not expand (here: repeated sample ids, found while the planner reads
// the samples, after the run was registered) ends its run `error`, with nothing run; it used to
// stay `running` until a later --resume called it crashed.
TEST_F(SweepConfigTest, SweepWhoseMatrixDoesNotExpandEndsItsRunAsError) {
  write("dup_run/tasks/dup_qa.yaml",
        "context: \"{input}\"\nreference: outputs\nmetric: string_match_part\nid: qid\n"
        "data: ../data/qa.jsonl\n");
  const std::string item = "\"input\": \"Where?\", \"outputs\": [\"here\"]}\n";
  write("dup_run/data/qa.jsonl", "{\"qid\": \"q1\", " + item + "{\"qid\": \"q1\", " + item);
  const std::string path = write(
      "dup_run/config.yaml",
      model_yaml() + "tasks:\n  - {name: dup_qa, options: {chat: false}}\npolicies: [full]\n");
  const std::string db = kDir + "/dup_run/results.db";
  std::filesystem::remove(db);
  std::string out, err;
  EXPECT_EQ(run_kvbench({"sweep", path, "--db", db}, out, err), 2);
  EXPECT_NE(err.find("repeats the id of line 1"), std::string::npos) << err;
  results::Store store = results::Store::open(db, results::Mode::kReadOnly);
  const results::QueryResult runs = store.query("SELECT status FROM runs ORDER BY run_id");
  ASSERT_EQ(runs.rows.size(), 1u);
  EXPECT_EQ(runs.rows[0][0].text, "error");
  EXPECT_EQ(store.query("SELECT COUNT(*) FROM units").rows[0][0].text, "0");
}

TEST_F(SweepConfigTest, TaskDefinitionErrorsNameFileLineAndKey) {
  auto cfg = [](const std::string& task) {
    return model_yaml() + "tasks:\n  - " + task + "\npolicies: [full]\n";
  };
  std::string e = load_error("td1.yaml", cfg("nope_task"));
  EXPECT_NE(e.find("td1.yaml:4: tasks[0]: unknown task 'nope_task'"), std::string::npos) << e;
  EXPECT_NE(e.find("or a task definition nope_task.yaml"), std::string::npos) << e;
  e = load_error("td2.yaml", cfg("{task_file: missing.yaml}"));
  EXPECT_NE(e.find("td2.yaml:4: tasks[0].task_file: task definition"), std::string::npos) << e;
  write("td_bad.yaml", "context: \"{x}\"\nreference: r\nmetric: bleu\n");
  e = load_error("td3.yaml", cfg("{task_file: td_bad.yaml}"));
  EXPECT_NE(e.find("td3.yaml:4: tasks[0].task_file: "), std::string::npos) << e;
  EXPECT_NE(e.find("td_bad.yaml:3: metric: unknown metric 'bleu'"), std::string::npos) << e;
  e = load_error("td4.yaml", cfg("{name: ruler_jsonl_vt, options: {task_sha256: abc}}"));
  EXPECT_NE(e.find("tasks[0].options.task_sha256: task_sha256 is set by the task item"),
            std::string::npos)
      << e;
  write("td_ok.yaml", "context: \"{x}\"\nreference: r\nmetric: qa_f1\n");
  e = load_error("td5.yaml", cfg("{name: other, task_file: td_ok.yaml}"));
  EXPECT_NE(e.find("tasks[0].name: "), std::string::npos) << e;
  EXPECT_NE(e.find("defines task 'td_ok', not 'other'"), std::string::npos) << e;
}

// A model whose every layer slides (Mistral's window on all layers): the window alone bounds the
// cache and policies act on global layers only (POLICIES.md "Sliding-window layers"), so a policy
// other than full would run exactly as full under its own name: refused, naming the policy entry.
// kvpress's compression_ratio (the fraction removed) beside ratio (the fraction kept): its spec
// labels it, it resolves as kvpress's compute_n_kept, exclusion rules name it, and budget axes
// order both by the fraction kept.
TEST_F(SweepConfigTest, CompressionRatioIsKvpressFractionRemoved) {
  const std::string path =
      write("compression.yaml", base_yaml("policies: [full, snapkv]\n") +
                                    "kv_budget: [64, {ratio: 0.5}, {compression_ratio: 0.75}]\n"
                                    "exclude:\n"
                                    "  - {policy: snapkv, kv_budget: [{compression_ratio: 0.75}]}\n");
  const SweepConfig c = load_sweep_config(path);
  ASSERT_EQ(c.budgets.size(), 3u);
  EXPECT_EQ(c.budgets[2].spec(), "0.75 compression_ratio");
  EXPECT_EQ(expand_config_cells(c).size(), 1u + 2);  // full + snapkv@64, snapkv@0.5 ratio
  // kvpress: max(1, int(n * (1 - c))); ratio: max(1, int(r * n)).
  EXPECT_EQ(c.budgets[2].tokens_for(1255), 313);
  EXPECT_EQ(c.budgets[1].tokens_for(1255), 627);
  EXPECT_EQ(c.budgets[0].tokens_for(1255), 64);
  EXPECT_EQ((BudgetEntry{0, 0.99, true}.tokens_for(50)), 1);
  EXPECT_EQ((BudgetEntry{0, 0.0, true}.tokens_for(50)), 50);
  EXPECT_FALSE((BudgetEntry{0, 0.0, true}.none()));
}

// finch's window is the prompt's question: a cell that streams the question after compression
// is refused when the config loads (naming the policy entry, the fix and the exclusion), unless
// window_size gives the window or the cell is excluded.
TEST_F(SweepConfigTest, FinchRefusesAQuestionAfterCompressionAtLoad) {
  const std::string both = "kv_budget: [64]\nquestion: [in_prompt, after_compression]\n";
  const std::string e =
      load_error("finch_after.yaml", base_yaml("policies: [full, finch]\n") + both);
  EXPECT_NE(e.find("finch_after.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("question: in_prompt"), std::string::npos) << e;
  EXPECT_NE(e.find("exclude {policy: finch, question: after_compression}"), std::string::npos)
      << e;
  const SweepConfig in_prompt = load_sweep_config(
      write("finch_in.yaml", base_yaml("policies: [finch]\n") + "kv_budget: [64]\n"));
  EXPECT_EQ(expand_config_cells(in_prompt).size(), 1u);
  const SweepConfig excluded = load_sweep_config(write(
      "finch_excluded.yaml", base_yaml("policies: [full, finch]\n") + both +
                                 "exclude:\n  - {policy: finch, question: after_compression}\n"));
  EXPECT_EQ(expand_config_cells(excluded).size(), 3u);  // full x 2, finch in the prompt
  const SweepConfig sized = load_sweep_config(
      write("finch_sized.yaml",
            base_yaml("policies: [{name: finch, options: {window_size: 16}}]\n") + both));
  EXPECT_EQ(expand_config_cells(sized).size(), 2u);
}

TEST(BudgetFlags, TokensFractionsAndCompressionRatios) {
  EXPECT_EQ(parse_budget_flags("256", "").tokens, 256);
  EXPECT_TRUE(parse_budget_flags("", "").none());
  EXPECT_TRUE(parse_budget_flags("0", "").none());  // --policy full's default
  const BudgetEntry half = parse_budget_flags("0.5", "");
  EXPECT_EQ(half.spec(), "0.5 ratio");
  EXPECT_EQ(half.tokens_for(1001), 500);
  const BudgetEntry c = parse_budget_flags("", "0.25");
  EXPECT_EQ(c.spec(), "0.25 compression_ratio");
  EXPECT_EQ(c.tokens_for(1255), 941);
  auto fails = [](const std::string& b, const std::string& cr, const std::string& needle) {
    try {
      parse_budget_flags(b, cr);
      ADD_FAILURE() << "no error for '" << b << "' / '" << cr << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails("1.5", "", "is a fraction outside (0, 1]");
  fails("half", "", "--kv-budget 'half' is not a number");
  fails("-3", "", "is not a token count >= 0");
  fails("99999999999", "", "is more tokens than kvbench takes (at most 2147483647)");
  fails("", "1", "--compression-ratio 1 is outside [0, 1)");
  fails("64", "0.5", "give --kv-budget or --compression-ratio, not both");
  fails("64x", "", "is not a number");
}

// A report's budget axis: none first, token counts ascending, then fractions by the share kept
// (kvpress's compression_ratio c keeps 1 - c).
TEST(BudgetFlags, ReportAxesOrderFractionsByTheShareKept) {
  const std::vector<std::string> want = {"-", "64", "256", "0.75 compression_ratio",
                                         "0.5 ratio", "0.25 compression_ratio", "1 ratio"};
  std::vector<std::string> got = {"0.5 ratio", "256", "0.25 compression_ratio", "-", "1 ratio",
                                  "64", "0.75 compression_ratio"};
  std::stable_sort(got.begin(), got.end(), [](const std::string& a, const std::string& b) {
    return results::budget_order(a) < results::budget_order(b);
  });
  EXPECT_EQ(got, want);
  // The axis says which convention it shows.
  EXPECT_EQ(results::budget_axis_label({"-", "64", "256"}), "KV budget (tokens per head)");
  EXPECT_EQ(results::budget_axis_label({"0.5 ratio", "1 ratio"}),
            "KV budget (ratio: fraction of the prompt kept)");
  EXPECT_EQ(results::budget_axis_label({"0.25 compression_ratio"}),
            "kvpress compression_ratio (fraction of the prompt removed)");
  EXPECT_NE(results::budget_axis_label({"64", "0.25 compression_ratio"}).find("fraction removed"),
            std::string::npos);
}

TEST(SweepConfigWindow, AllSlidingModelRunsFullOnly) {
  const std::string mistral = std::string(KVB_FIXTURES_DIR) + "/engine/mistral_tiny.gguf";
  const std::string head = "models:\n  - {path: " + mistral + "}\n" +
                           "tasks:\n  - name: niah\n    options: {context_lengths: [64], "
                           "depths: [0], haystack: noise, chat: false}\n";
  const std::string e =
      load_error("all_sliding.yaml", head + "policies: [full, snapkv]\nkv_budget: [16]\n");
  EXPECT_NE(e.find(":6: policies[1]"), std::string::npos) << e;
  EXPECT_NE(e.find("policy 'snapkv' on model 'mistral_tiny'"), std::string::npos) << e;
  EXPECT_NE(e.find("every layer of the model slides over a window of 8 tokens"), std::string::npos)
      << e;
  EXPECT_NE(e.find("would run exactly as full"), std::string::npos) << e;
  EXPECT_NO_THROW(load_sweep_config(write("all_sliding_full.yaml", head + "policies: [full]\n")));
}

}  // namespace
}  // namespace kvb::harness
