// A bundle arrives at the runner's units resolved (harness/bundle_runner.h ResolvedBundle): its
// task is one the runner built once for the config, its policies are checked and configured
// before anything runs, and a bundle that names what the config lacks is refused before the
// model is loaded. No model is needed: the config's model file does not exist.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "harness/bundle_runner.h"

namespace kvb::harness {
namespace {

SweepConfig config() {
  SweepConfig cfg;
  cfg.path = "resolve.yaml";
  cfg.models = {ModelEntry{"absent", "/nonexistent/absent.gguf", "", ModelInfo{}}};
  cfg.tasks = {TaskEntry{"niah", {{"context_lengths", "128"}, {"haystack", "noise"}}}};
  cfg.policies = {PolicyEntry{"h2o", {}}};
  return cfg;
}

WireBundle bundle(const std::string& policy, int task = 0) {
  tasks::Sample s;
  s.id = "len128_depth0_s0";
  return WireBundle{0, task, s, {WireUnit{"key1", policy, {{"recent", "8"}}, 32, "in_prompt", 5}}};
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no kvb::Error thrown";
  return "";
}

TEST(BundleRunner, ResolvesTaskAndPoliciesBeforeRunning) {
  const SweepConfig cfg = config();
  BundleRunner runner(cfg, true, engine::Device::kCpu, engine::DType::kF32, 0);
  const WireBundle b = bundle("h2o");
  const ResolvedBundle one = runner.resolve(b);
  const ResolvedBundle two = runner.resolve(b);
  EXPECT_EQ(&one.task, &two.task);  // built once, with the runner
  EXPECT_EQ(one.task.name(), "niah");
  ASSERT_EQ(one.policies.size(), 1u);
  EXPECT_EQ(one.policies[0].name, "h2o");
  EXPECT_EQ(one.policies[0].kv_budget, 32);
  EXPECT_EQ(one.policies[0].seed, 5u);
  EXPECT_EQ(one.policies[0].options.values().at("recent"), "8");
  EXPECT_EQ(one.policies[0].shape.num_layers, 0);  // the loaded model's, at run time

  // Refused before the model is loaded: the message is the bundle's, not the missing file's.
  EXPECT_NE(usage_error([&] { runner.run_or_fail(bundle("no_such_policy")); })
                .find("no_such_policy"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { runner.run_or_fail(bundle("h2o", 3)); })
                .find("bundle of sample len128_depth0_s0: model 0 or task 3 is not in config "
                      "resolve.yaml (1 models, 1 tasks)"),
            std::string::npos);
}

}  // namespace
}  // namespace kvb::harness
