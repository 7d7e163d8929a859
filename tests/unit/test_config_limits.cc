// Hostile sweep configs (issue 14 "Sweep integrity"): inputs that crashed `kvbench validate` or
// ran for minutes before any error. Each must fail fast with a usage error naming the key and the
// bound, or load fast when it is within the bounds. Configs and models go to KVB_BINARY_DIR.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "harness/sweep_config.h"
#include "run_kvbench.h"
#include "tp_test_model.h"

namespace kvb::harness {
namespace {
namespace fs = std::filesystem;

const std::string kDir = KVB_BINARY_DIR "/test_config_limits";

std::string write(const std::string& name, const std::string& text) {
  const std::string path = kDir + "/" + name;
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
}

// A tiny random-weight Llama GGUF with a long context (so that large budgets are in range).
const std::string& model_path() {
  static const std::string path = [] {
    const std::string p = kDir + "/long-context.gguf";
    fs::create_directories(kDir);
    testing::RandomLlamaShape s;
    s.dim = 16, s.hidden_dim = 32, s.layers = 1, s.heads = 2, s.kv_heads = 1, s.vocab = 32;
    s.context = 65536;
    EXPECT_TRUE(testing::write_random_llama_gguf(p, s));
    return p;
  }();
  return path;
}

std::string base_yaml(const std::string& policies = "policies: [full]\n") {
  return "models: [" + model_path() +
         "]\ntasks:\n  - name: niah\n    options: {context_lengths: [256], depths: [0], "
         "haystack: noise, chat: false}\n" +
         policies;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The usage error of loading `text`, which must come within `max_s` seconds.
std::string load_error(const std::string& name, const std::string& text, double max_s = 5) {
  const std::string path = write(name, text);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    load_sweep_config(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_LT(seconds_since(t0), max_s) << name;
    return e.what();
  }
  ADD_FAILURE() << name << " loaded without error";
  return "";
}

// Self-referencing alias: used to recurse until the stack overflowed (SIGSEGV).
TEST(ConfigLimits, SelfReferencingAliasIsAnError) {
  const std::string err = load_error("cycle.yaml", "x: &a [*a]\n");
  EXPECT_NE(err.find("cycle.yaml:1: x[0]: an alias refers to a node that contains it"),
            std::string::npos)
      << err;
  const std::string path = write("cycle_map.yaml", base_yaml() + "description: &d {a: *d}\n");
  std::string out, errs;
  EXPECT_EQ(testing::kvbench({"validate", path}, &out, &errs), 2) << errs;
  EXPECT_NE(errs.find("description.a: an alias refers to a node that contains it"),
            std::string::npos)
      << errs;
}

// "Billion laughs": ten levels of ten aliases each is 10^10 nodes, even under description:.
TEST(ConfigLimits, AliasExpansionIsBounded) {
  std::string laughs = "description:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 10; ++i) {
    const std::string p = "*l" + std::to_string(i - 1);
    laughs += "  l" + std::to_string(i) + ": &l" + std::to_string(i) + " [" + p;
    for (int k = 1; k < 10; ++k) laughs += ", " + p;
    laughs += "]\n";
  }
  const std::string err = load_error("laughs.yaml", base_yaml() + laughs);
  EXPECT_NE(err.find(": description.l"), std::string::npos) << err;
  EXPECT_NE(err.find("more than 100000 YAML nodes"), std::string::npos) << err;
}

// Include diamond: each level includes both files of the next, 2^24 loads without a bound.
TEST(ConfigLimits, IncludeDiamondIsBounded) {
  constexpr int kDepth = 24;
  for (int d = 0; d < kDepth; ++d) {
    for (const char* side : {"a", "b"}) {
      const std::string next = d + 1 < kDepth
                                   ? "include: [d" + std::to_string(d + 1) + "a.yaml, d" +
                                         std::to_string(d + 1) + "b.yaml]\n"
                                   : "limit: 1\n";
      write("diamond/d" + std::to_string(d) + side + ".yaml", next);
    }
  }
  const std::string err =
      load_error("diamond/top.yaml", base_yaml() + "include: [d0a.yaml, d0b.yaml]\n");
  EXPECT_NE(err.find(": include["), std::string::npos) << err;
  EXPECT_NE(err.find("more than 256 include files"), std::string::npos) << err;
  // A shallow diamond (each shared file read twice) is still fine.
  write("diamond2/x.yaml", "include: [y.yaml]\n");
  write("diamond2/z.yaml", "include: [y.yaml]\n");
  write("diamond2/y.yaml", "limit: 2\n");
  const SweepConfig cfg =
      load_sweep_config(write("diamond2/top.yaml", base_yaml() + "include: [x.yaml, z.yaml]\n"));
  EXPECT_EQ(cfg.limit, 2);
}

// budgets: ['1-40000'] took 27 s (duplicates were dropped by a linear scan per budget).
TEST(ConfigLimits, LongBudgetRangeLoadsFast) {
  const std::string path =
      write("budgets.yaml", base_yaml("policies: [window]\n") + "budgets: ['1-40000', 7]\n");
  const auto t0 = std::chrono::steady_clock::now();
  const SweepConfig cfg = load_sweep_config(path);
  EXPECT_LT(seconds_since(t0), 5);
  ASSERT_EQ(cfg.budgets.size(), 40000u);  // the 7 is a duplicate
  EXPECT_EQ(cfg.budgets.back().tokens, 40000);
}

// Seed ranges of 100k: the duplicate check was quadratic; past the cell bound it is an error.
TEST(ConfigLimits, SeedRangesLoadFastAndTheMatrixIsBounded) {
  const auto t0 = std::chrono::steady_clock::now();
  const SweepConfig cfg =
      load_sweep_config(write("seeds.yaml", base_yaml() + "seeds: ['0-99999']\n"));
  EXPECT_LT(seconds_since(t0), 5);
  EXPECT_EQ(cfg.seeds.size(), 100000u);
  const std::string err =
      load_error("seeds_cells.yaml", base_yaml("policies: [full, window]\n") +
                                         "budgets: [64, 128]\nseeds: ['0-99999']\n");
  EXPECT_NE(err.find(":1: seeds: the matrix has 300000 cells (1 models x 1 tasks x 3 policies x "
                     "budgets x 1 question x 100000 seeds), over the limit of 100000"),
            std::string::npos)
      << err;
}

// A 100 x 100 option product took 24 s; more than 1024 combinations of one entry is an error.
TEST(ConfigLimits, OptionProductIsBounded) {
  std::string a, b;
  for (int i = 0; i < 100; ++i) {
    a += (i ? ", " : "") + std::to_string(i + 1);
    b += (i ? ", " : "") + std::to_string(i);
  }
  const std::string err =
      load_error("product.yaml", base_yaml("policies:\n  - name: h2o\n    options: {sinks: [" + b +
                                           "], recent: [" + a + "]}\n") +
                                     "budgets: [64]\n");
  EXPECT_NE(err.find("product.yaml:6: policies[0].options: the option lists give more than 1024 "
                     "combinations (100 sinks x 100 recent)"),
            std::string::npos)
      << err;
}

TEST(ConfigLimits, SecondDocumentAndDirectoriesAreErrors) {
  std::string err = load_error("two_docs.yaml", base_yaml() + "---\nlimit: 3\n");
  EXPECT_NE(err.find("two_docs.yaml:"), std::string::npos) << err;
  EXPECT_NE(err.find("a second YAML document"), std::string::npos) << err;
  fs::create_directories(kDir + "/a_folder");
  err = load_error("dir_include.yaml", base_yaml() + "include: a_folder\n");
  EXPECT_NE(err.find("dir_include.yaml:6: include: '" + kDir + "/a_folder' is a directory"),
            std::string::npos)
      << err;
  err = load_error("dir_model.yaml",
                   "models: [a_folder]\n" + base_yaml().substr(base_yaml().find("tasks:")));
  EXPECT_NE(err.find("dir_model.yaml:1: models[0]: '" + kDir + "/a_folder' is a directory"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace kvb::harness
