// Task definitions found by name (issue 34 F5: `eval --task myqa` looked under the source
// checkout's path, compiled into the binary): --include-path DIR, a sweep's include_path:, the
// environment variable KVBENCH_TASK_PATH and the working directory's configs/tasks, in that
// order; no compiled-in path. A user's project folder with stories260K from KVB_SHARED_DIR.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/task_file.h"
#include "run_kvbench.h"

namespace kvb {
namespace {
namespace fs = std::filesystem;
using kvb::testing::kvbench;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTok = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

std::string project() {
  const std::string dir = fs::canonical(KVB_BINARY_DIR).string() + "/test_task_search_path_" +
                          std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/mytasks");
  std::ofstream(dir + "/mytasks/myqa.yaml")
      << "task: myqa\ndata: myqa.jsonl\nchat: false\nquestion: \"Q: {{ question }}\\nA:\"\n"
         "reference: answer\nmetric: qa_f1\nmax_new_tokens: 4\n";
  std::ofstream(dir + "/mytasks/myqa.jsonl")
      << "{\"question\": \"Where is the cat?\", \"answer\": \"home\"}\n";
  return dir;
}

TEST(TaskSearchPath, IncludePathEnvironmentAndWorkingDirectory) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  ::unsetenv("KVBENCH_TASK_PATH");
  const std::string dir = project();
  const std::vector<std::string> eval = {"eval", "--model", kModel, "--tokenizer", kTok,
                                         "--task", "myqa", "-o", "csv"};
  std::string out, err;
  // Not on the path: the error names the folders searched and how to add one.
  EXPECT_EQ(kvbench(eval, &out, &err), 2);
  EXPECT_NE(err.find("or a task definition myqa.yaml under a folder of the task search path ("),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("--include-path DIR"), std::string::npos) << err;
  // --include-path.
  std::vector<std::string> with = eval;
  with.insert(with.end(), {"--include-path", dir + "/mytasks"});
  ASSERT_EQ(kvbench(with, &out, &err), 0) << err;
  EXPECT_NE(out.find("myqa-0,"), std::string::npos) << out;
  // KVBENCH_TASK_PATH (':'-separated; a folder that does not exist is skipped).
  ::setenv("KVBENCH_TASK_PATH", (dir + "/nowhere:" + dir + "/mytasks").c_str(), 1);
  ASSERT_EQ(kvbench(eval, &out, &err), 0) << err;
  ::unsetenv("KVBENCH_TASK_PATH");
  // The working directory's configs/tasks.
  fs::create_directories(dir + "/configs");
  fs::copy(dir + "/mytasks", dir + "/configs/tasks", fs::copy_options::recursive);
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  const int rc = kvbench(eval, &out, &err);
  std::string listed;
  kvbench({"ls", "tasks"}, &listed, nullptr);
  fs::current_path(cwd);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(listed.find("myqa\n"), std::string::npos) << listed;
  // ls tasks --include-path lists a folder's definitions.
  ASSERT_EQ(kvbench({"ls", "tasks", "--include-path", dir + "/mytasks"}, &listed, &err), 0) << err;
  EXPECT_NE(listed.find("myqa\n"), std::string::npos) << listed;
  fs::remove_all(dir);
}

// A sweep's include_path: (relative to the config) finds the definition by name; a folder that
// does not exist is an error naming the key.
TEST(TaskSearchPath, SweepConfigIncludePath) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  ::unsetenv("KVBENCH_TASK_PATH");
  const std::string dir = project();
  std::ofstream(dir + "/sweep.yaml") << "include_path: mytasks\nmodels:\n  - {name: s, path: "
                                     << kModel << ", tokenizer: " << kTok
                                     << "}\ntasks: [myqa]\npolicies: [full]\n";
  std::string out, err;
  EXPECT_EQ(kvbench({"validate", dir + "/sweep.yaml"}, &out, &err), 0) << err;
  harness::set_task_include_paths({});
  std::ofstream(dir + "/bad.yaml") << "include_path: [mytasks, missing]\nmodels:\n  - {name: s, "
                                      "path: "
                                   << kModel << ", tokenizer: " << kTok
                                   << "}\ntasks: [myqa]\npolicies: [full]\n";
  EXPECT_EQ(kvbench({"validate", dir + "/bad.yaml"}, &out, &err), 2);
  EXPECT_NE(err.find("include_path[1]"), std::string::npos) << err;
  EXPECT_NE(err.find("missing' does not exist"), std::string::npos) << err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvb
