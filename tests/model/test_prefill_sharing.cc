// Prefill sharing (DESIGN.md "Scheduling"): a bundle of 6 policies x 2 budgets on one prompt runs
// the prompt's prefill once for the policies that allow it, and every unit's outputs equal those
// of running it alone, bit for bit.
#include <gtest/gtest.h>

#include <fstream>

#include "workers/runner.h"

namespace kvb {
namespace {

TEST(PrefillSharing, OnePrefillForTheBundleSameResults) {
  const std::string model = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  const std::string tok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";
  ASSERT_TRUE(std::ifstream(model).good()) << model;
  workers::LoadedModel lm = workers::load_model_and_tokenizer(model, tok);
  engine::Engine eng(*lm.model);
  tasks::Sample s;
  s.id = "story";
  s.chat = false;
  s.context =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. "
      "Lily asked her mom for help. Her mom said, \"Let's try to get it together.\"";
  s.question = " Then Lily";
  s.max_new_tokens = 20;
  const auto& c = lm.model->config;
  std::vector<policies::PolicyConfig> pcs;
  for (const char* name : {"full", "window", "streaming_llm", "h2o", "snapkv", "ada_snapkv"}) {
    for (int budget : {16, 32}) {
      policies::PolicyConfig pc;
      pc.name = name;
      pc.kv_budget = std::string(name) == "full" ? 0 : budget;
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
      pcs.push_back(pc);
    }
  }
  const int64_t before = eng.prefills();
  std::vector<workers::UnitOutput> shared = workers::run_bundle(lm, eng, s, pcs, {}, true);
  const int64_t shared_prefills = eng.prefills() - before;
  EXPECT_EQ(shared_prefills, 1) << "prefills executed for a bundle of 12 shareable units";
  const int64_t before2 = eng.prefills();
  std::vector<workers::UnitOutput> alone = workers::run_bundle(lm, eng, s, pcs, {}, false);
  EXPECT_EQ(eng.prefills() - before2, 12);
  ASSERT_EQ(shared.size(), alone.size());
  int differ = 0;
  for (size_t i = 0; i < pcs.size(); ++i) {
    SCOPED_TRACE(pcs[i].name + " " + std::to_string(pcs[i].kv_budget));
    EXPECT_TRUE(shared[i].m.prefill_shared);
    EXPECT_FALSE(alone[i].m.prefill_shared);
    EXPECT_EQ(shared[i].prediction.text, alone[i].prediction.text);
    EXPECT_EQ(shared[i].m.kv_bytes_final, alone[i].m.kv_bytes_final);
    EXPECT_EQ(shared[i].m.occupancy_mean, alone[i].m.occupancy_mean);
    differ += shared[i].prediction.text != shared[0].prediction.text;
  }
  // The budgets bite: some policy's continuation differs from full's.
  EXPECT_GT(differ, 0);
}

// A policy that streams the prompt cannot share: it runs its own prefill.
TEST(PrefillSharing, StreamingPolicyRunsItsOwnPrefill) {
  const std::string model = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  const std::string tok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";
  workers::LoadedModel lm = workers::load_model_and_tokenizer(model, tok);
  engine::Engine eng(*lm.model);
  tasks::Sample s;
  s.id = "x";
  s.chat = false;
  s.context = "Tom had a red ball. He played with it every day in the garden.";
  s.question = " One day";
  s.max_new_tokens = 8;
  const auto& c = lm.model->config;
  policies::PolicyConfig a, b;
  a.name = "h2o";
  a.kv_budget = 8;
  a.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  b = a;
  b.options = policies::PolicyOptions(std::map<std::string, std::string>{{"prefill", "streaming"}});
  const int64_t before = eng.prefills();
  auto outs = workers::run_bundle(lm, eng, s, {a, b}, {}, true);
  EXPECT_EQ(eng.prefills() - before, 2);  // the shared one, and the streaming policy's own
  EXPECT_TRUE(outs[0].m.prefill_shared);
  EXPECT_FALSE(outs[1].m.prefill_shared);
}

}  // namespace
}  // namespace kvb
