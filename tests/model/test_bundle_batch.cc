// Batched decode of a bundle (issue 16 "a bundle decodes as one batch", RunSettings::decode_batch):
// the bundle's generation units step together through Engine::decode_batch, and every unit's
// prediction, token counts, cache occupancy and memory figures equal those of the same bundle run
// one unit at a time (decode_batch 1), bit for bit; units that finish early (end token, stop
// string, their own max_new_tokens) leave the batch; a unit that fails in the batch (its time
// limit) fails alone. Every unit records the batch it decoded in.
#include <gtest/gtest.h>

#include <fstream>

#include "workers/runner.h"

namespace kvb {
namespace {

struct Fixture {
  workers::LoadedModel lm;
  std::unique_ptr<engine::Engine> eng;
  tasks::Sample s;
  std::vector<policies::PolicyConfig> pcs;
};

Fixture make_fixture() {
  const std::string model = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  const std::string tok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";
  EXPECT_TRUE(std::ifstream(model).good()) << model;
  Fixture f{workers::load_model_and_tokenizer(model, tok), nullptr, {}, {}};
  f.eng = std::make_unique<engine::Engine>(*f.lm.model);
  f.s.id = "story";
  f.s.chat = false;
  f.s.context =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
  f.s.question = " Then Lily";
  f.s.max_new_tokens = 24;
  f.s.stop_strings = {"."};  // continuations end at their first sentence: at different steps
  const auto& c = f.lm.model->config;
  for (const char* name : {"full", "window", "streaming_llm", "h2o", "snapkv", "ada_snapkv",
                           "tova", "scissorhands", "subgen", "random"}) {
    for (int budget : {12, 24}) {
      policies::PolicyConfig pc;
      pc.name = name;
      pc.kv_budget = std::string(name) == "full" ? 0 : budget;
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
      pc.seed = 3;
      f.pcs.push_back(pc);
    }
  }
  return f;
}

void expect_same_outputs(const std::vector<workers::UnitOutput>& a,
                         const std::vector<workers::UnitOutput>& b,
                         const std::vector<policies::PolicyConfig>& pcs) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(pcs[i].name + " " + std::to_string(pcs[i].kv_budget));
    EXPECT_EQ(a[i].prediction.text, b[i].prediction.text);
    EXPECT_EQ(a[i].m.generated_tokens, b[i].m.generated_tokens);
    EXPECT_EQ(a[i].m.prompt_tokens, b[i].m.prompt_tokens);
    EXPECT_EQ(a[i].m.kv_bytes_final, b[i].m.kv_bytes_final);
    EXPECT_EQ(a[i].m.kv_bytes_peak, b[i].m.kv_bytes_peak);
    EXPECT_EQ(a[i].m.occupancy_mean, b[i].m.occupancy_mean);
    EXPECT_EQ(a[i].m.occupancy_final, b[i].m.occupancy_final);
    EXPECT_EQ(a[i].m.occupancy_peak, b[i].m.occupancy_peak);
    EXPECT_EQ(a[i].m.policy_state_bytes, b[i].m.policy_state_bytes);
    EXPECT_EQ(a[i].m.prefill_shared, b[i].m.prefill_shared);
  }
}

TEST(BundleBatch, BatchedDecodeEqualsOneAtATime) {
  Fixture f = make_fixture();
  for (bool share : {true, false}) {
    SCOPED_TRACE(share ? "shared prefill" : "own prefills");
    workers::RunSettings alone_rs, batch_rs, pairs_rs;
    batch_rs.decode_batch = 0;  // auto: the whole bundle
    pairs_rs.decode_batch = 3;  // groups of at most 3
    const auto alone = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, alone_rs, share);
    const auto batched = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, batch_rs, share);
    const auto pairs = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, pairs_rs, share);
    expect_same_outputs(alone, batched, f.pcs);
    expect_same_outputs(alone, pairs, f.pcs);
    int differ = 0, longest = 0, shortest = 1 << 30;
    for (size_t i = 0; i < f.pcs.size(); ++i) {
      EXPECT_EQ(alone[i].m.decode_batch, 1.0);
      // Everyone starts together; mean batch sizes lie in [1, the group's size].
      EXPECT_GE(batched[i].m.decode_batch, 1.0);
      EXPECT_LE(batched[i].m.decode_batch, static_cast<double>(f.pcs.size()));
      EXPECT_LE(pairs[i].m.decode_batch, 3.0);
      differ += alone[i].prediction.text != alone[0].prediction.text;
      longest = std::max(longest, alone[i].m.generated_tokens);
      shortest = std::min(shortest, alone[i].m.generated_tokens);
    }
    EXPECT_GT(differ, 0) << "the budgets must change some continuation";
    EXPECT_LT(shortest, longest) << "units must leave the batch at different steps";
    // The unit that decodes longest ran its first step with the whole bundle.
    double widest = 0;
    for (const auto& o : batched) widest = std::max(widest, o.m.decode_batch);
    EXPECT_GT(widest, 2.0);
  }
}

// A unit that fails inside the batch (a timeout at its 3rd token: RunFaults) fails alone, typed;
// the others finish with the same outputs as one at a time. Limits checked after the prompt end
// units before they join the batch.
TEST(BundleBatch, AUnitFailingInTheBatchFailsAlone) {
  Fixture f = make_fixture();
  {
    workers::RunSettings rs;
    rs.decode_batch = 0;
    rs.faults.timeout_unit = 4;  // snapkv@12
    rs.faults.timeout_at_token = 3;
    std::vector<std::optional<workers::UnitFailure>> failures;
    const auto out = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, rs, true, &failures);
    const auto alone = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, {}, true);
    ASSERT_EQ(failures.size(), f.pcs.size());
    for (size_t i = 0; i < f.pcs.size(); ++i) {
      SCOPED_TRACE(i);
      if (i == 4) {
        ASSERT_TRUE(failures[i].has_value());
        EXPECT_EQ(failures[i]->status, workers::FailureStatus::kTimeout);
        EXPECT_NE(failures[i]->message.find("timeout at token 3"), std::string::npos);
        continue;
      }
      EXPECT_FALSE(failures[i].has_value());
      EXPECT_EQ(out[i].prediction.text, alone[i].prediction.text);
      EXPECT_EQ(out[i].m.occupancy_mean, alone[i].m.occupancy_mean);
    }
  }
  workers::RunSettings rs;
  rs.decode_batch = 0;
  rs.time_limit_s = 1e-9;  // every unit is over its limit at its first check
  std::vector<std::optional<workers::UnitFailure>> failures;
  const auto out = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, rs, true, &failures);
  ASSERT_EQ(failures.size(), f.pcs.size());
  for (size_t i = 0; i < f.pcs.size(); ++i) {
    ASSERT_TRUE(failures[i].has_value()) << i;
    EXPECT_EQ(failures[i]->status, workers::FailureStatus::kTimeout) << failures[i]->message;
  }
  // A generous limit: nothing fails, same outputs as alone.
  rs.time_limit_s = 3600;
  const auto ok = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, rs, true, &failures);
  for (const auto& fl : failures) EXPECT_FALSE(fl.has_value());
  const auto alone = workers::run_bundle(f.lm, *f.eng, f.s, f.pcs, {}, true);
  expect_same_outputs(alone, ok, f.pcs);
}

}  // namespace
}  // namespace kvb
