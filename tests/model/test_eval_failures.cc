// `kvbench eval` runs each sample through the sweep's BundleRunner, so a unit that fails with any
// exception type ends as the sweep would record it (status and message in its row, the other
// samples still run, exit 1) instead of ending eval. Here a std::bad_alloc (not a kvb::Error),
// injected after one sample's prefill (KVB_FAULT_BAD_ALLOC, harness/sweep_faults.h): before, it
// escaped eval, which printed no table. On stories260K.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "run_kvbench.h"

namespace kvb {
namespace {
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTok = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

TEST(EvalFailures, AnOutOfMemoryUnitIsItsRowAndEvalGoesOn) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  ::setenv("KVB_FAULT_BAD_ALLOC", "len256_depth0_s0/full/0", 1);
  std::string out, err;
  const int rc = testing::kvbench({"eval", "--model", kModel, "--tokenizer", kTok, "--task", "niah",
                                   "--task-opt", "context_lengths=256", "--task-opt", "depths=0,100",
                                   "--task-opt", "haystack=noise", "--task-opt", "chat=false",
                                   "--threads", "1"},
                                  &out, &err);
  ::unsetenv("KVB_FAULT_BAD_ALLOC");
  EXPECT_EQ(rc, 1) << out << err;
  // The failed sample's row says oom and why; the other sample ran.
  EXPECT_NE(out.find("| len256_depth0_s0 "), std::string::npos) << out;
  EXPECT_NE(out.find("oom: sample len256_depth0_s0, policy full: out of host memory"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("| len256_depth100_s0 "), std::string::npos) << out;
  EXPECT_NE(out.find("| ok "), std::string::npos) << out;
  EXPECT_NE(out.find("| niah | full   |         0 |   1 |      1 |"), std::string::npos) << out;
}

// finch's window is the prompt's question: with the question placed after compression there is
// none, and eval says so before any sample runs (a usage error, exit 2, naming the fix), rather
// than failing every sample with it. In the prompt it runs.
TEST(EvalFailures, FinchWithTheQuestionAfterCompressionIsRefusedUpFront) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::vector<std::string> args = {
      "eval", "--model", kModel, "--tokenizer", kTok, "--task", "niah", "--task-opt",
      "context_lengths=256", "--task-opt", "depths=50", "--task-opt", "haystack=noise",
      "--task-opt", "chat=false", "--policy", "finch", "--kv-budget", "64", "--threads", "1"};
  std::vector<std::string> after = args;
  after.insert(after.end(), {"--question", "after_compression"});
  std::string out, err;
  EXPECT_EQ(testing::kvbench(after, &out, &err), 2) << out << err;
  EXPECT_NE(err.find("question: in_prompt"), std::string::npos) << err;
  EXPECT_EQ(out.find("| niah"), std::string::npos) << out;
  EXPECT_EQ(testing::kvbench(args, &out, &err), 0) << out << err;
  EXPECT_NE(out.find("| niah | finch "), std::string::npos) << out;
}

// A composition (then:, kvpress's ComposedPress) runs through eval, and its aggregate row names
// the second policy and the ratio, as the sweep's tables do; a first policy that evicts during
// decode is refused before any sample runs, naming why.
TEST(EvalFailures, ACompositionRunsAndIsNamedWithItsOptions) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::vector<std::string> base = {
      "eval", "--model", kModel, "--tokenizer", kTok, "--task", "niah", "--task-opt",
      "context_lengths=256", "--task-opt", "depths=50", "--task-opt", "haystack=noise",
      "--task-opt", "chat=false", "--kv-budget", "64", "--threads", "1",
      "--policy-opt", "then=keydiff", "--policy-opt", "first_compression_ratio=0.5"};
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--policy", "snapkv"});
  std::string out, err;
  EXPECT_EQ(testing::kvbench(args, &out, &err), 0) << out << err;
  EXPECT_NE(out.find("| niah | snapkv first_compression_ratio=0.5 then=keydiff |"),
            std::string::npos)
      << out;
  args = base;
  args.insert(args.end(), {"--policy", "h2o"});
  EXPECT_EQ(testing::kvbench(args, &out, &err), 2) << out << err;
  EXPECT_NE(err.find("policy h2o evicts during decode, so then: keydiff cannot follow it"),
            std::string::npos)
      << err;
  EXPECT_EQ(out.find("| niah"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvb
