// kvb::Error messages (issue 31 "Errors written for the user"): a check's message is its text
// alone, written for the user; where it was raised ("file:line check failed: <cond>") travels in
// Error::origin for the debug log; a check without text and KVB_ASSERT say "internal error" and
// keep the location; a failed library call keeps its function. `kvbench -v` logs the origin.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/error.h"
#include "run_kvbench.h"

namespace kvb {
namespace {

Error caught(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no kvb::Error thrown";
  return Error("");
}

// "test_error.cc:<line>": the location a macro on `line` records.
std::string here(int line) { return "test_error.cc:" + std::to_string(line); }

TEST(ErrorMessage, CheckTextIsTheMessageAndTheLocationIsTheOrigin) {
  const int n = 3;
  const int line = __LINE__ + 1;
  const Error e = caught([&] { KVB_CHECK(n == 4) << "data.jsonl:7: key 'gold' is " << n; });
  EXPECT_STREQ(e.what(), "data.jsonl:7: key 'gold' is 3");
  EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
  EXPECT_EQ(e.origin(), here(line) + " check failed: n == 4");

  const int uline = __LINE__ + 1;
  const Error u = caught([&] { KVB_USAGE_CHECK(n < 0) << "--limit must be >= 0, got " << n; });
  EXPECT_STREQ(u.what(), "--limit must be >= 0, got 3");
  EXPECT_EQ(u.kind(), ErrorKind::kUsage);
  EXPECT_EQ(u.origin(), here(uline) + " check failed: n < 0");

  const int fline = __LINE__ + 1;
  const Error f = caught([] { KVB_FAIL() << "cannot open results database x.db: busy"; });
  EXPECT_STREQ(f.what(), "cannot open results database x.db: busy");
  EXPECT_EQ(f.origin(), here(fline));
  EXPECT_EQ(caught([] { KVB_USAGE_FAIL() << "bad flag"; }).kind(), ErrorKind::kUsage);
}

TEST(ErrorMessage, ChecksWithoutTextAndAssertsAreInternalErrors) {
  const int n = 3;
  const int line = __LINE__ + 1;
  const Error e = caught([&] { KVB_CHECK(n == 4); });
  EXPECT_EQ(std::string(e.what()),
            "internal error (a bug in kvbench): check failed: n == 4 (" + here(line) + ")");
  const int aline = __LINE__ + 1;
  const Error a = caught([&] { KVB_ASSERT(n > 5) << "layer " << n; });
  EXPECT_EQ(
      std::string(a.what()),
      "internal error (a bug in kvbench): check failed: n > 5: layer 3 (" + here(aline) + ")");
  EXPECT_EQ(a.kind(), ErrorKind::kRuntime);
  const int fline = __LINE__ + 1;
  const Error f = caught([] { KVB_FAIL(); });
  EXPECT_EQ(std::string(f.what()),
            "internal error (a bug in kvbench): unexpected failure (" + here(fline) + ")");
}

TEST(ErrorMessage, AFailedLibraryCallKeepsTheFunction) {
  // As KVB_CUDA_CHECK and KVB_SQLITE_CHECK raise them: the function names the failed operation,
  // the call with its C++ arguments is the origin.
  const int line = __LINE__ + 2;
  const Error e = caught([] {
    detail::ErrorBuilder(__FILE__, __LINE__, "cudaMalloc(&p, bytes)", ErrorKind::kOutOfMemory)
        << "cudaErrorMemoryAllocation: out of memory";
  });
  EXPECT_STREQ(e.what(), "cudaMalloc: cudaErrorMemoryAllocation: out of memory");
  EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
  EXPECT_EQ(e.origin(), here(line) + " cudaMalloc(&p, bytes)");
}

TEST(ErrorMessage, MultiRankMessagesNameRankAndHost) {
  set_process_identity(2, 4);
  const Error e = caught([] { KVB_CHECK(false) << "model.gguf: truncated"; });
  set_process_identity(0, 1);
  EXPECT_EQ(std::string(e.what()), "model.gguf: truncated [rank 2 host " + process_host() + "]");
}

// The CLI prints the message alone; with -v (before or after the command) the debug log adds
// where it was raised. The log writes to file descriptor 2, captured by gtest.
TEST(ErrorMessage, VerboseLogsTheOriginOfACliError) {
  auto run = [&](std::vector<std::string> args, std::string* err) {
    ::testing::internal::CaptureStderr();
    const int rc = testing::kvbench(std::move(args), nullptr, err);
    *err += ::testing::internal::GetCapturedStderr();
    return rc;
  };
  // validate checks --decode-tok-s before it reads the config: no model or file needed.
  const std::vector<std::string> bad = {"validate", "no_such.yaml", "--decode-tok-s", "inf"};
  const std::string message =
      "kvbench validate: error: --decode-tok-s must be a positive, finite speed in tokens/s, got "
      "inf\n";
  std::string err;
  EXPECT_EQ(run(bad, &err), 2);
  EXPECT_EQ(err, message);  // nothing else: no source location
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"-v", "validate", "no_such.yaml", "--decode-tok-s", "inf"},
        std::vector<std::string>{"validate", "no_such.yaml", "--decode-tok-s", "inf", "-v"},
        std::vector<std::string>{"validate", "--verbose", "no_such.yaml", "--decode-tok-s",
                                 "inf"}}) {
    err.clear();
    EXPECT_EQ(run(args, &err), 2);
    EXPECT_NE(err.find(message), std::string::npos) << err;
    EXPECT_NE(err.find("] kvbench validate: the error was raised at cmd_validate.cc:"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(" check failed: std::isfinite(rate) && rate > 0"), std::string::npos) << err;
  }
  // -v of one command does not make the next one verbose (tests run many in one process).
  err.clear();
  EXPECT_EQ(run(bad, &err), 2);
  EXPECT_EQ(err, message);
}

}  // namespace
}  // namespace kvb
