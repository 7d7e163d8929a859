// Tests cmake/git_rev.cmake, the build step that names the revision a binary was built from
// (runs.git_rev, `kvbench --version`): on scratch git repositories, a commit, an untracked file,
// an edited and a staged tracked file, a second commit, a folder outside git; that an unchanged
// tree leaves the header alone (rewriting it would recompile and relink at every build); and
// that this binary reports what its build tree's header says.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "harness/git_rev.h"

namespace kvb::harness {
namespace {

namespace fs = std::filesystem;

int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string quoted(const fs::path& p) {
  std::string q = "'";  // appended, not "'" + s + "'" (GCC 12's false -Wrestrict, PR 105329)
  q += p.string();
  q += '\'';
  return q;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// The value of `#define KVB_GIT_REV "..."` in a header the script wrote ("" when absent).
std::string macro_value(const std::string& header) {
  std::smatch m;
  static const std::regex re("#define KVB_GIT_REV \"([^\"]*)\"");
  return std::regex_search(header, m, re) ? m[1].str() : "";
}

class GitRevScript : public testing::Test {
 protected:
  void SetUp() override {
    if (sh("git --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "git is not on PATH";
    const std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() / ("kvb_git_rev_" + std::to_string(getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(src());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path src() const { return dir_ / "src"; }
  fs::path header() const { return dir_ / "out" / "kvb_git_rev.h"; }

  // Runs the script as the build does; git looks no further up than dir_ (so that /tmp inside
  // some other work tree cannot change the answer).
  std::string run_script() {
    const fs::path script = fs::path(KVB_FIXTURES_DIR) / ".." / ".." / "cmake" / "git_rev.cmake";
    const std::string cmd = "GIT_CEILING_DIRECTORIES=" + quoted(dir_) + " " +
                            quoted(KVB_CMAKE_COMMAND) + " -DSRC=" + quoted(src()) +
                            " -DOUT=" + quoted(header()) + " -P " + quoted(script);
    EXPECT_EQ(sh(cmd), 0) << cmd;
    return macro_value(read_file(header()));
  }
  void git(const std::string& args) {
    ASSERT_EQ(sh("git -C " + quoted(src()) +
                 " -c user.name=kvbench -c user.email=kvbench@localhost -c commit.gpgsign=false " +
                 args + " >/dev/null 2>&1"),
              0)
        << args;
  }
  // A repository whose one commit holds a.txt = "one\n".
  void init_with_one_commit() {
    git("init -q");
    write_file(src() / "a.txt", "one\n");
    git("add a.txt");
    git("commit -q -m one");
  }
  std::string head() {
    const std::string cmd = "git -C " + quoted(src()) + " rev-parse HEAD";
    FILE* f = popen(cmd.c_str(), "r");
    char buf[128] = {};
    const bool got = f != nullptr && std::fgets(buf, sizeof buf, f) != nullptr;
    if (f != nullptr) pclose(f);
    return got ? std::string(buf).substr(0, 12) : "";
  }

  fs::path dir_;
};

TEST_F(GitRevScript, NamesTheCommitAndWhetherTrackedFilesDiffer) {
  init_with_one_commit();
  const std::string first = head();
  ASSERT_EQ(first.size(), 12u);
  EXPECT_EQ(run_script(), first);
  write_file(src() / "untracked.txt", "build output\n");  // untracked files do not count
  EXPECT_EQ(run_script(), first);
  write_file(src() / "a.txt", "two\n");  // an edited tracked file
  EXPECT_EQ(run_script(), first + "-dirty");
  git("add a.txt");  // staged, not committed: still not the commit's tree
  EXPECT_EQ(run_script(), first + "-dirty");
  git("commit -q -m two");
  const std::string second = head();
  ASSERT_EQ(second.size(), 12u);
  EXPECT_NE(second, first);
  EXPECT_EQ(run_script(), second);
  write_file(src() / "a.txt", "one\n");
  EXPECT_EQ(run_script(), second + "-dirty");
  write_file(src() / "a.txt", "two\n");  // the commit's content again, a newer file time
  EXPECT_EQ(run_script(), second);
}

TEST_F(GitRevScript, UnknownOutsideAGitWorkTree) {
  write_file(src() / "a.txt", "one\n");
  EXPECT_EQ(run_script(), "unknown");
}

TEST_F(GitRevScript, AnUnchangedTreeLeavesTheHeaderAlone) {
  init_with_one_commit();
  const std::string rev = run_script();
  ASSERT_EQ(rev, head());
  const auto past = fs::file_time_type::clock::now() - std::chrono::hours(24 * 365);
  fs::last_write_time(header(), past);
  EXPECT_EQ(run_script(), rev);
  EXPECT_EQ(fs::last_write_time(header()), past) << "an unchanged revision rewrote the header";
  write_file(src() / "a.txt", "two\n");
  EXPECT_EQ(run_script(), rev + "-dirty");
  EXPECT_NE(fs::last_write_time(header()), past);
}

TEST(GitRev, ThisBinaryReportsItsBuildTreesRevision) {
  const std::string rev = git_rev();
  EXPECT_TRUE(std::regex_match(rev, std::regex("[0-9a-f]{12}(-dirty|-unknown-state)?|unknown")))
      << rev;
  // The header the last build wrote: equal unless this binary is older than that build.
  const std::string header = read_file(fs::path(KVB_BINARY_DIR) / "generated" / "kvb_git_rev.h");
  ASSERT_FALSE(header.empty()) << "no generated/kvb_git_rev.h in " << KVB_BINARY_DIR;
  EXPECT_EQ(rev, macro_value(header));
}

}  // namespace
}  // namespace kvb::harness
