// Hostile command lines for `kvbench generate` and `kvbench eval` (issue 14): each must be a
// usage error (exit 2) naming the bad argument, before any model is loaded where it can be.
// Before the fix these crashed (--threads 100000), ran with the argument dropped or wrapped
// (--prompt Once upon a time, --seed -1), or ignored it (--system without --chat).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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
          {{"--prompt", "x", "--dtype", ""}, "--dtype must be f32, bf16 or native, got ''"},
          {{"--prompt", "x", "--dump-keep-sets", ""}, "--dump-keep-sets needs a file name"},
          {{"--prompt-file", KVB_BINARY_DIR "/test_cli_args/a_folder"},
           "--prompt-file '" KVB_BINARY_DIR "/test_cli_args/a_folder' is a directory"},
      });
  // --follow-ids (teacher forcing): ids within stories260K's vocabulary of 512, and the steps
  // are the ids, so --max-new-tokens is refused beside it.
  expect_usage_errors("generate", {"--model", kModel, "--tokenizer", kTokenizer, "--prompt", "x"},
                      {
                          {{"--follow-ids", "12 512"},
                           "--follow-ids: id 512 is outside the model's vocabulary [0, 512)"},
                          {{"--follow-ids", "99999999999999999999999"},
                           "--follow-ids: id 99999999999999999999999 is outside"},
                          {{"--follow-ids", "12 -3"}, "--follow-ids: '-3' is not a token id"},
                          {{"--follow-ids", "12 4x"}, "--follow-ids: '4x' is not a token id"},
                          {{"--follow-ids", " , "}, "--follow-ids: no token ids given"},
                          {{"--follow-ids", "12", "--max-new-tokens", "4"},
                           "--follow-ids sets the steps (one per id): drop --max-new-tokens"},
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
                          // Issue 31: both were taken as given (-1 prompt tokens: no cap).
                          {{"--max-prompt-tokens", "-1"},
                           "--max-prompt-tokens must be >= 0 (tokens; 0: the model's context), "
                           "got -1"},
                          {{"--show-prediction", "-1"},
                           "--show-prediction must be >= 0 (characters; 0: hide the column), got "
                           "-1"},
                          {{"--dtype", ""}, "--dtype must be f32, bf16 or native, got ''"},
                      });
}

// Issue 31: an empty data file said "task mc produced no samples", naming no file.
TEST_F(CliArgs, EvalNamesAnEmptyDataFile) {
  const std::string dir = KVB_BINARY_DIR "/test_cli_args";
  fs::create_directories(dir);
  const std::string data = dir + "/empty.jsonl";
  std::ofstream(data) << "\n  \n";  // blank lines only
  expect_usage_errors("eval", {"--model", kModel, "--tokenizer", kTokenizer, "--task", "mc"},
                      {{{"--task-opt", "data=" + data},
                        data + ": no items (only blank lines); a data file holds one JSON "
                               "object per line (task option data)"}});
}

// --follow-ids longer than the context: the steps stop at the context, the warning says so in
// the flag's own terms, and each step is printed. The log lines go to the process's stderr, so
// the binary runs as a process of its own.
TEST_F(CliArgs, FollowIdsPastTheContextAreCut) {
  const std::string bin = KVB_BINARY_DIR "/kvbench";
  ASSERT_TRUE(fs::exists(bin)) << bin;
  std::string ids;
  for (int i = 0; i < 700; ++i) ids += std::to_string(3 + i % 500) + " ";
  const std::string cmd = bin + " generate --model " + kModel + " --tokenizer " + kTokenizer +
                          " --prompt Tom --threads 1 --follow-ids '" + ids + "' 2>&1 >/dev/null";
  std::string err;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) err.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << err;
  EXPECT_NE(err.find("prompt (3) + --follow-ids (700) exceeds the model's context 512; following "
                     "at most 509"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("follow step 0: followed 3 logit "), std::string::npos) << err;
  EXPECT_NE(err.find("follow step 508: followed "), std::string::npos) << err;
  EXPECT_EQ(err.find("follow step 509:"), std::string::npos) << err;
  EXPECT_NE(err.find("followed 509 ids: own pick equal at "), std::string::npos) << err;
}

// Issue 31: the write error of --dump-keep-sets on a full disk was lost (exit 0, no file).
TEST_F(CliArgs, GenerateReportsAFailedKeepSetsWrite) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  std::string out, err;
  EXPECT_EQ(
      testing::kvbench({"generate", "--model", kModel, "--tokenizer", kTokenizer, "--prompt", "x",
                        "--max-new-tokens", "1", "--threads", "1", "--dump-keep-sets", "/dev/full"},
                       &out, &err),
      1);
  EXPECT_NE(err.find("kvbench generate: error: error writing --dump-keep-sets file '/dev/full': "
                     "No space left on device (the file is incomplete)"),
            std::string::npos)
      << err;
  EXPECT_EQ(testing::kvbench({"generate", "--model", kModel, "--tokenizer", kTokenizer, "--prompt",
                              "x", "--max-new-tokens", "1", "--dump-keep-sets",
                              KVB_BINARY_DIR "/test_cli_args/no_such_folder/k.json"},
                             &out, &err),
            2);
  EXPECT_NE(
      err.find("cannot open --dump-keep-sets file '" KVB_BINARY_DIR
               "/test_cli_args/no_such_folder/k.json' for writing: No such file or directory"),
      std::string::npos)
      << err;
}

// Options of validate and sweep, refused before any config, model or database is read (none of
// these files need to exist).
TEST(CliArgsNoModel, ValidateAndSweepRefuseHostileOptions) {
  expect_usage_errors(
      "validate", {"no_such.yaml"},
      {
          {{"--decode-tok-s", "inf"},
           "--decode-tok-s must be a positive, finite speed in tokens/s, got inf"},
          {{"--prefill-tok-s", "nan"},
           "--prefill-tok-s must be a positive, finite speed in tokens/s, got nan"},
          {{"--decode-tok-s", "0"}, "--decode-tok-s must be a positive, finite speed"},
          {{"--ranks", "0"}, "--ranks must be >= 1, got 0"},
      });
  const std::string db = KVB_BINARY_DIR "/test_cli_args_no_such.db";
  expect_usage_errors(
      "sweep", {"no_such.yaml"},
      {
          {{"--db", ""},
           "--db needs a file name (without --db, results go to out/<config name>.db)"},
          {{"--db", db, "--rerun-status", ""},
           "--rerun-status needs at least one status: ok, error, oom, timeout or crashed"},
          {{"--db", db, "--rerun-status", "oom,,timeout"},
           "--rerun-status oom,,timeout: '' is not"},
          {{"--db", db, "--dtype", ""}, "--dtype must be f32, bf16 or native, got ''"},
          {{"--db", db, "--dtype", "native", "--gpus-per-worker", "2"},
           "--dtype native runs a model on one rank; tensor-parallel groups (--gpus-per-worker 2) "
           "split f32 or bf16 weights: use --dtype f32 or bf16"},
          {{"--db", db, "--resume", "--rerun"},
           "--resume continues a run that did not finish and skips the units that were in flight "
           "when it crashed twice; --rerun would clear their crash counts and run them again: give "
           "one of them. To run the matrix again after a crash: --resume --rerun-status "
           "ok,error,oom,timeout"},
      });
  EXPECT_FALSE(fs::exists(db));
  EXPECT_FALSE(fs::exists("out/no_such.db"));
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
