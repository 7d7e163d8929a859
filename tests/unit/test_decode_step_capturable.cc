// Which decode steps may run as one captured CUDA graph (workers/engine/engine.h
// decode_step_capturable): those whose host code never waits for the device mid-step. The
// expected table is written from POLICIES.md's decode statistics per policy (h2o: column sums;
// tova and scissorhands: the last query's probabilities; knorm: pre-RoPE keys; the SnapKV
// family, window, streaming_llm, random, subgen_kcenter, keydiff, observed_attention, cur,
// lagkv, expected_attention, noncausal_attn, leverage, compactor, simlayerkv: none
// at decode) and from which
// policies replace attention (SubGen, weighted subgen_kcenter): on a device whose ops decide
// where the statistics are, everything but the replaced attentions qualifies; with host-side
// ops, the policies that read statistics do not; a cache with host rows never does.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "kernels/policies/policy.h"
#include "registry_options.h"
#include "workers/engine/engine.h"

namespace kvb {
namespace {

std::unique_ptr<policies::Policy> make(const std::string& name,
                                       const std::map<std::string, std::string>& opts = {}) {
  policies::PolicyConfig pc;
  pc.name = name;
  pc.kv_budget = name == "full" ? 0 : 64;
  pc.shape = {4, 8, 2, 16, 4096};
  pc.options = policies::PolicyOptions(opts);
  return policies::make_policy(pc);
}

bool capturable(const policies::Policy* p, bool host_rows, bool device_ops) {
  return engine::decode_step_capturable(p, p ? p->decode_request() : policies::StatsRequest{},
                                        host_rows, device_ops);
}

TEST(DecodeStepCapturable, EveryRegisteredPolicyOnADeviceAndOnTheHost) {
  const std::set<std::string> reads_stats = {"h2o", "tova", "scissorhands", "knorm"};
  const std::set<std::string> replaces = {"subgen"};
  int checked = 0;
  for (const auto& info : policies::policy_registry()) {
    SCOPED_TRACE(info.name);
    // The Python policy with a module that scores only after the prompt (no decode_score).
    std::unique_ptr<policies::Policy> p =
        info.name == "python"
            ? make(info.name, {{"file", std::string(KVB_EXAMPLES_DIR) + "/policies/knorm.py"}})
        : make(info.name, testing_registry::required_options(info.name, 4, 2, 16));
    EXPECT_EQ(capturable(p.get(), false, true), !replaces.count(info.name));
    EXPECT_EQ(capturable(p.get(), false, false),
              !replaces.count(info.name) && !reads_stats.count(info.name));
    EXPECT_FALSE(capturable(p.get(), true, true));  // host rows: each layer's rows come down
    ++checked;
  }
  EXPECT_EQ(checked, 29);  // the registry's size when the table above was written (kvzip: 29)
}

TEST(DecodeStepCapturable, VariantsAndNoPolicy) {
  EXPECT_TRUE(capturable(nullptr, false, true));
  EXPECT_TRUE(capturable(nullptr, false, false));
  EXPECT_FALSE(capturable(nullptr, true, true));
  // Weighted subgen_kcenter replaces attention; the plain one decides with ops and asks nothing
  // at decode.
  EXPECT_FALSE(
      capturable(make("subgen_kcenter", {{"weight_by_cluster_size", "true"}}).get(), false, true));
  EXPECT_TRUE(capturable(make("subgen_kcenter", {{"decode", "slide"}}).get(), false, true));
  EXPECT_TRUE(capturable(make("subgen_kcenter", {{"decode", "slide"}}).get(), false, false));
  // Rolling positions and eviction before attention ask nothing of the device.
  EXPECT_TRUE(capturable(
      make("streaming_llm", {{"positions", "rolling"}, {"evict", "before_attention"}}).get(), false,
      true));
  // A request the host reads: statistics or keys asked by a policy that decides on the host.
  std::unique_ptr<policies::Policy> window = make("window");
  EXPECT_FALSE(engine::decode_step_capturable(window.get(), {.col_sums = true}, false, true));
  EXPECT_FALSE(engine::decode_step_capturable(window.get(), {.last_w = 1}, false, true));
  EXPECT_FALSE(engine::decode_step_capturable(window.get(), {.pre_rope_keys = true}, false, true));
  EXPECT_FALSE(
      engine::decode_step_capturable(window.get(), {.pre_rope_queries = true}, false, true));
  EXPECT_TRUE(engine::decode_step_capturable(window.get(), {}, false, true));
}

}  // namespace
}  // namespace kvb
