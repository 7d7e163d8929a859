// `kvbench generate --device cuda` with the policies that replace the engine's attention (SubGen,
// weighted subgen_kcenter; issue 13 "Nothing refused on cuda that runs on the CPU"): the same
// command line runs on the CPU; on cuda it is never refused for the policy. Without a GPU it
// fails for the device only ("no GPU visible", or "this build has no CUDA" in a build without
// it); with one it runs and its prompt compression keeps what the CPU's keeps (--dtype f32).
// The model is the tiny random-weight Qwen3 folder (tests/fixtures/hf/qwen3_bf16).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "run_kvbench.h"
#include "workers/engine/engine_types.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;
const std::string kFolder = std::string(KVB_FIXTURES_DIR) + "/hf/qwen3_bf16";
const std::string kPrompt = "SubGen streams what leaves the window into its sketch.";

// Runs kvbench with stderr captured at the file descriptor (the logger writes there).
int run(const std::vector<std::string>& args, std::string* err) {
  ::testing::internal::CaptureStderr();
  std::string out;
  const int rc = testing::kvbench(args, &out, err);
  *err += ::testing::internal::GetCapturedStderr();
  return rc;
}

// Whether this process sees a GPU (false in a build without CUDA).
bool gpu_visible() {
  try {
    return engine::cuda_device_label(/*require_device=*/true).rfind("cuda: ", 0) == 0;
  } catch (const Error&) {
    return false;
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

TEST(ReplacedAttentionCli, CudaFailsForTheDeviceNeverForThePolicy) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("kvb_replaced_attention_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const bool gpu = gpu_visible();
  // Budget 12 of a ~60-token prompt (about a token per byte): both compress the prompt.
  const std::vector<std::vector<std::string>> policies = {
      {"--policy", "subgen", "--policy-opt", "sinks=1", "--policy-opt", "recent=2"},
      {"--policy", "subgen_kcenter", "--policy-opt", "weight_by_cluster_size=true"}};
  for (const std::vector<std::string>& policy : policies) {
    SCOPED_TRACE(policy[1]);
    auto args_for = [&](const std::string& device, const std::string& dump) {
      const std::string path = (dir / dump).string();
      std::vector<std::string> a = {
          "generate", "--model",          kFolder, "--prompt",    kPrompt, "-n",
          "1",        "--threads",        "1",     "--kv-budget", "12",    "--device",
          device,     "--dump-keep-sets", path};
      if (device == "cuda") a.insert(a.end(), {"--dtype", "f32"});
      a.insert(a.end(), policy.begin(), policy.end());
      return a;
    };
    std::string err;
    ASSERT_EQ(run(args_for("cpu", "cpu.json"), &err), 0) << err;
    const nlohmann::json cpu = read_json((dir / "cpu.json").string());
    size_t kept = 0;
    for (const auto& layer : cpu["positions"]) {
      for (const auto& head : layer) kept += head.size();
    }
    ASSERT_LT(kept, cpu["positions"].size() * cpu["prompt_ids"].size())
        << "the prompt was not compressed: the comparison proves little";

    err.clear();
    const int rc = run(args_for("cuda", "cuda.json"), &err);
    EXPECT_EQ(err.find("cpu only"), std::string::npos) << err;
    EXPECT_EQ(err.find("replaces the engine's attention"), std::string::npos) << err;
    if (!gpu) {
      EXPECT_NE(rc, 0);
#ifdef KVB_WITH_CUDA
      EXPECT_NE(err.find("--device cuda: no GPU visible"), std::string::npos) << err;
#else
      EXPECT_NE(err.find("--device cuda: this build has no CUDA"), std::string::npos) << err;
#endif
      continue;
    }
    ASSERT_EQ(rc, 0) << err;
    const nlohmann::json dev = read_json((dir / "cuda.json").string());
    EXPECT_EQ(dev["prompt_ids"], cpu["prompt_ids"]);
    EXPECT_EQ(dev["positions"], cpu["positions"]);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvb
