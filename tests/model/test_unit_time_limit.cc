// The unit time limit during a prompt's prefill (issue 31): the limit is checked at the start of
// every forward pass and between the layers of a pass over several tokens, so a prefill much
// longer than the limit stops within one layer instead of finishing first (a unit ran 10.4 s
// against a 0.5 s limit). On SmolLM2 (30 layers) and a prompt of about 850 tokens: one layer of
// that prefill is gigaflops, far above a 5 ms limit on any CPU, so where the pass stopped (the
// layer the message names) is well before its last layer whatever the machine's speed; the test
// reads that counter, not a wall time. (Without the checks: 7.1 s against the 5 ms limit for the
// prefill, 77 s for a streamed one, on 2 loaded cores.)
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>

#include "workers/engine/engine.h"
#include "workers/prefix_store.h"
#include "workers/runner.h"

namespace kvb {
namespace {

const std::string kSmol = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

tasks::Sample long_sample() {
  tasks::Sample s;
  s.id = "long";
  s.chat = false;
  for (int i = 0; i < 60; ++i) {
    s.context += "The quick brown fox jumps over the lazy dog near the river bank. ";
  }
  s.question = " What did the fox jump over?";
  s.max_new_tokens = 4;
  return s;
}

policies::PolicyConfig policy(const workers::LoadedModel& lm, const std::string& name,
                              const std::string& prefill = "") {
  const auto& c = lm.model->config;
  policies::PolicyConfig pc;
  pc.name = name;
  pc.kv_budget = name == "full" ? 0 : 32;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  if (!prefill.empty()) pc.options = policies::PolicyOptions({{"prefill", prefill}});
  return pc;
}

// The layer before which the message says the pass stopped, and the pass's layers; -1 when the
// message names none (the limit was seen only after the prompt).
std::pair<int, int> stopped_before(const std::string& message, const std::string& where) {
  std::smatch m;
  const std::regex re("stopped " + where + " before layer ([0-9]+) of ([0-9]+)");
  if (!std::regex_search(message, m, re)) return {-1, -1};
  return {std::stoi(m[1]), std::stoi(m[2])};
}

class UnitTimeLimit : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::ifstream(kSmol).good()) << kSmol << " missing: run scripts/fetch_models.sh";
    lm_ = new workers::LoadedModel(workers::load_model_and_tokenizer(kSmol, ""));
  }
  static void TearDownTestSuite() {
    delete lm_;
    lm_ = nullptr;
  }
  static workers::LoadedModel* lm_;
};
workers::LoadedModel* UnitTimeLimit::lm_ = nullptr;

// A unit's own prefill (no sharing) stops between two layers, well before the last one.
TEST_F(UnitTimeLimit, OwnPrefillStopsBetweenLayers) {
  engine::Engine eng(*lm_->model);
  workers::RunSettings rs;
  rs.time_limit_s = 0.005;
  try {
    workers::run_sample(*lm_, eng, long_sample(), policy(*lm_, "full"), rs);
    ADD_FAILURE() << "the unit ended ok past its time limit";
  } catch (const workers::UnitTimeout& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sample long: unit time limit of 0.005 s exceeded after "),
              std::string::npos)
        << msg;
    const auto [layer, layers] = stopped_before(msg, "in the prompt's prefill");
    EXPECT_EQ(layers, 30) << msg;
    // Before the fix the pass ran all 30 layers and the limit was seen after the prompt.
    EXPECT_GE(layer, 0) << msg;
    EXPECT_LT(layer, 15) << msg;
  }
  // No check is left on the engine, and it gives a fresh engine's results after a pass it
  // abandoned (a unit without a limit runs to its end).
  EXPECT_FALSE(eng.layer_check());
  tasks::Sample shorter = long_sample();
  shorter.context = "The capital of France is Paris. The capital of Italy is";
  shorter.question = "";
  const workers::UnitOutput out = workers::run_sample(*lm_, eng, shorter, policy(*lm_, "full"), {});
  engine::Engine fresh(*lm_->model);
  const workers::UnitOutput ref =
      workers::run_sample(*lm_, fresh, shorter, policy(*lm_, "full"), {});
  EXPECT_GT(out.m.generated_tokens, 0);
  EXPECT_EQ(out.m.generated_tokens, ref.m.generated_tokens);
  EXPECT_EQ(out.prediction.text, ref.prediction.text);
}

// The shared prefill stops between layers once it alone is past the limit; every unit that
// would have started from it ends `timeout` saying so, a unit with its own (streamed) prefill
// runs and stops at the start of one of its one-token passes, and the bundle returns. Without
// `failures` (eval's path) the timeout propagates.
TEST_F(UnitTimeLimit, SharedPrefillStopsBetweenLayersAndFailsTheUnitsThatUseIt) {
  engine::Engine eng(*lm_->model);
  const std::vector<policies::PolicyConfig> pcs = {policy(*lm_, "full"), policy(*lm_, "snapkv"),
                                                   policy(*lm_, "h2o"),
                                                   policy(*lm_, "h2o", "streaming")};
  workers::RunSettings rs;
  rs.time_limit_s = 0.005;
  std::vector<std::optional<workers::UnitFailure>> failures;
  workers::run_bundle(*lm_, eng, long_sample(), pcs, rs, true, &failures);
  ASSERT_EQ(failures.size(), pcs.size());
  for (size_t i = 0; i < pcs.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(failures[i].has_value());
    EXPECT_EQ(failures[i]->status, workers::FailureStatus::kTimeout);
    const std::string& msg = failures[i]->message;
    if (i < 3) {
      const auto [layer, layers] =
          stopped_before(msg, "in the prefill shared with the sample's other policies");
      EXPECT_EQ(layers, 30) << msg;
      EXPECT_GE(layer, 0) << msg;
      EXPECT_LT(layer, 15) << msg;
    } else {
      // Streamed token by token: one-token passes are checked at their start.
      EXPECT_EQ(stopped_before(msg, "in the prompt's prefill"), std::make_pair(0, 30)) << msg;
    }
  }
  EXPECT_FALSE(eng.layer_check());
  EXPECT_THROW(workers::run_bundle(*lm_, eng, long_sample(), pcs, rs, true), workers::UnitTimeout);
  EXPECT_FALSE(eng.layer_check());
}

// A shared prefill in pieces (prefix reuse) stopped by the limit keeps nothing in the store, and
// the store then serves the same prompts as if it had never run: the next prompt starts from the
// one after it and both equal their prefills without a store.
TEST_F(UnitTimeLimit, APrefixStorePrefillStoppedKeepsNothing) {
  engine::Engine eng(*lm_->model);
  tasks::Sample a = long_sample(), b = long_sample();
  a.context.resize(a.context.size() / 2);  // about 300 tokens, then the two prompts differ
  b.context = a.context + "A cat sat on the warm mat and watched the birds in the garden.";
  a.id = "a";
  b.id = "b";
  const std::vector<policies::PolicyConfig> pcs = {policy(*lm_, "full"), policy(*lm_, "snapkv")};
  workers::PrefixStore store(size_t{256} << 20);
  workers::RunSettings with, without;
  with.prefix_store = &store;
  store.add_prompt(workers::shared_prefill_tokens(*lm_, a, with));
  store.add_prompt(workers::shared_prefill_tokens(*lm_, b, with));
  workers::RunSettings limited = with;
  limited.time_limit_s = 0.005;
  std::vector<std::optional<workers::UnitFailure>> failures;
  workers::run_bundle(*lm_, eng, a, pcs, limited, true, &failures);
  for (const auto& f : failures) {
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->status, workers::FailureStatus::kTimeout);
    const auto [layer, layers] =
        stopped_before(f->message, "in the prefill shared with the sample's other policies");
    EXPECT_GE(layer, 0) << f->message;
    EXPECT_LT(layer, 15) << f->message;
  }
  EXPECT_EQ(store.entries(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
  for (const tasks::Sample* s : {&a, &b}) {
    SCOPED_TRACE(s->id);
    const auto x = workers::run_bundle(*lm_, eng, *s, pcs, with, true);
    const auto y = workers::run_bundle(*lm_, eng, *s, pcs, without, true);
    for (size_t i = 0; i < pcs.size(); ++i) {
      EXPECT_EQ(x[i].m.prefill_reused > 0, s == &b);
      EXPECT_EQ(x[i].prediction.text, y[i].prediction.text);
      EXPECT_EQ(x[i].m.generated_tokens, y[i].m.generated_tokens);
      EXPECT_EQ(x[i].m.kv_bytes_final, y[i].m.kv_bytes_final);
      EXPECT_EQ(x[i].m.occupancy_mean, y[i].m.occupancy_mean);
    }
  }
  EXPECT_EQ(store.entries(), 1u);
}

}  // namespace
}  // namespace kvb
