// Every command of the README's "Examples" block runs as written (issue 34): the block's
// `build/kvbench ...` lines (with their `\` continuations) are read from README.md itself and run
// by bash from the source root, with only the build folder, the models folder and ../shared
// replaced by this build's own (CI's are build/, models/ and ../shared, the README's). Each must
// exit 0 and print what it is for. The block's `mpirun` lines run configs/ci_smoke.yaml and
// configs/ci_tp.yaml, which the mpi tests (test_sweep_mpi, test_sweep_tp) run under mpirun.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kSource = fs::path(KVB_FIXTURES_DIR) / ".." / "..";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// The indented lines of the README's "## Examples" section, continuations joined.
std::vector<std::string> example_commands() {
  const std::string readme = slurp(kSource / "README.md");
  const size_t at = readme.find("\n## Examples\n");
  EXPECT_NE(at, std::string::npos) << "README.md has no ## Examples section";
  if (at == std::string::npos) return {};
  const size_t end = readme.find("\n## ", at + 1);
  std::istringstream lines(readme.substr(at, end - at));
  std::vector<std::string> out;
  bool continued = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("    ", 0) != 0) {
      continued = false;
      continue;
    }
    std::string text = line.substr(4);
    const size_t first = text.find_first_not_of(' ');
    text = first == std::string::npos ? "" : text.substr(first);
    if (continued) {
      out.back() += " " + text;
    } else {
      out.push_back(text);
    }
    continued = !out.back().empty() && out.back().back() == '\\';
    if (continued) out.back().pop_back();
  }
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size())) {
    s.replace(i, from.size(), to);
  }
}

// Runs `cmd` by bash in the source root; returns its exit status, stdout and stderr together.
int run(const std::string& cmd, std::string* out) {
  const std::string full = "cd '" + kSource.string() + "' && (" + cmd + "\n) 2>&1";  // a # comment ends at the newline
  FILE* p = popen(full.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ReadmeCommands, EveryExampleRunsAsWritten) {
  const std::vector<std::string> commands = example_commands();
  // What each command prints when it did its job, in the README's order.
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"build/kvbench generate --model models/SmolLM2", "Paris"},
      {"build/kvbench generate --model ../shared/models/stories260K", "Once upon a time"},
      {"build/kvbench eval --model models/SmolLM2-135M-Instruct.Q4_1.gguf --task niah", "recall"},
      {"build/kvbench eval --model models/SmolLM2-135M-Instruct.Q4_1.gguf --task perplexity",
       "perplexity"},
      {"build/kvbench generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf --max-new-tokens 40",
       ""},
      {"build/kvbench validate configs/paper_adakv.yaml", "units:"},
      {"mpirun", ""},
      {"build/tests/kvb_make_tp_model", ""},
      {"mpirun", ""},
  };
  ASSERT_EQ(commands.size(), expected.size()) << "the README's Examples block changed: update "
                                                 "this test's list";
  const std::string build = KVB_BINARY_DIR, models = KVB_MODELS_DIR, shared = KVB_SHARED_DIR;
  const fs::path tp_model = fs::path(build) / "readme_random-llama-8kv.gguf";
  for (size_t i = 0; i < commands.size(); ++i) {
    std::string cmd = commands[i];
    EXPECT_EQ(cmd.rfind(expected[i].first, 0), 0u) << cmd;
    if (cmd.rfind("mpirun", 0) == 0) continue;  // the mpi tests run these configs under mpirun
    replace_all(cmd, "build/", build + "/");
    replace_all(cmd, "../shared/", shared + "/");
    replace_all(cmd, "models/random-llama-8kv.gguf", tp_model.string());
    replace_all(cmd, " models/", " " + models + "/");
    replace_all(cmd, "=models/", "=" + models + "/");
    std::string out;
    EXPECT_EQ(run(cmd, &out), 0) << cmd << "\n" << out;
    if (!expected[i].second.empty()) {
      EXPECT_NE(out.find(expected[i].second), std::string::npos) << cmd << "\n" << out;
    }
    if (cmd.find("policy python") != std::string::npos) {
      EXPECT_GT(out.size(), 40u) << "no text generated: " << out;
    }
  }
  // The random model the README makes is the one ci_tp.yaml reads (byte for byte).
  const std::string made = slurp(tp_model), used = slurp(fs::path(models) / "random-llama-8kv.gguf");
  EXPECT_TRUE(!made.empty() && made == used)
      << tp_model << " (" << made.size() << " bytes) differs from " << models
      << "/random-llama-8kv.gguf (" << used.size() << " bytes)";
  fs::remove(tp_model);
}

}  // namespace
