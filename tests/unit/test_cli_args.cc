// Hostile command lines for `kvbench generate` and `kvbench eval` (issue 14): each must be a
// usage error (exit 2) naming the bad argument, before any model is loaded where it can be.
// Before the fix these crashed (--threads 100000), ran with the argument dropped or wrapped
// (--prompt Once upon a time, --seed -1), or ignored it (--system without --chat).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "run_kvbench.h"

namespace kvb::harness {
namespace {
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTokenizer = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

struct Case {
  std::vector<std::string> args;  // after the subcommand's model arguments
  std::string expect;             // a substring of stderr
};

void expect_usage_errors(const std::string& command, const std::vector<std::string>& base,
                         const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    std::vector<std::string> args = {command};
    args.insert(args.end(), base.begin(), base.end());
    args.insert(args.end(), c.args.begin(), c.args.end());
    std::string out, err;
    EXPECT_EQ(testing::kvbench(args, &out, &err), 2) << c.expect << "\n" << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
  }
}

class CliArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  }
};

TEST_F(CliArgs, GenerateRefusesHostileArguments) {
  fs::create_directories(KVB_BINARY_DIR "/test_cli_args/a_folder");
  expect_usage_errors(
      "generate", {"--model", kModel, "--tokenizer", kTokenizer, "--max-new-tokens", "1"},
      {
          {{"--prompt", "x", "--threads", "100000"},
           "--threads must be in [0, 1024] (0: all cores), got 100000"},
          {{"--prompt", "x", "--threads", "-1"}, "--threads must be in [0, 1024]"},
          {{"--prompt", "Once", "upon", "a", "time"}, "unexpected argument(s) 'upon' 'a' 'time'"},
          {{"--prompt", "x", "--seed", "-1"}, "--seed must be an integer in [0, "},
          {{"--prompt", "x", "--seed", "18446744073709551616"}, "--seed must be an integer"},
          {{"--prompt", "x", "--temperature", "inf"}, "--temperature must be in [0, 100]"},
          {{"--prompt", "x", "--temperature", "nan"}, "--temperature must be in [0, 100]"},
          {{"--prompt", "x", "--system", "be brief"}, "--system is the system message of --chat"},
          {{"--prompt-file", KVB_BINARY_DIR "/test_cli_args/a_folder"},
           "--prompt-file '" KVB_BINARY_DIR "/test_cli_args/a_folder' is a directory"},
      });
  expect_usage_errors("generate", {"--prompt", "x"},
                      {{{"--model", KVB_BINARY_DIR "/test_cli_args/a_folder"},
                        "model '" KVB_BINARY_DIR "/test_cli_args/a_folder' is a directory"}});
}

TEST_F(CliArgs, EvalRefusesHostileArguments) {
  expect_usage_errors("eval", {"--model", kModel, "--tokenizer", kTokenizer, "--task", "niah"},
                      {
                          {{"--threads", "100000"}, "--threads must be in [0, 1024]"},
                          {{"--limit", "-5"}, "--limit must be >= 0 (samples), got -5"},
                          {{"--seed", "-1"}, "--seed must be an integer"},
                          {{"stray"}, "unexpected argument(s) 'stray'"},
                      });
}

// The accepted forms still work: a quoted prompt, a seed, a thread count.
TEST_F(CliArgs, GenerateAcceptsWellFormedArguments) {
  std::string out, err;
  EXPECT_EQ(testing::kvbench({"generate", "--model", kModel, "--tokenizer", kTokenizer, "--prompt",
                              "Once upon a time", "--max-new-tokens", "2", "--seed",
                              "18446744073709551615", "--temperature", "0.5", "--threads", "1"},
                             &out, &err),
            0)
      << err;
  EXPECT_FALSE(out.empty());
}

}  // namespace
}  // namespace kvb::harness
