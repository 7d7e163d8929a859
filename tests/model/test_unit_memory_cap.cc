// --max-rss-gb judges a unit on its own memory (issue 31): after a worker ran a larger model
// (SmolLM2, about 0.6 GiB of f32 weights), the tiny model's units that pass a 0.2 GiB cap alone
// still pass it (before, the memory the larger model left resident was charged to them and they
// ended `oom`), while the larger model's units, which really are above the cap, end `oom`. One
// BundleRunner, as a sweep worker runs its bundles. In its own test program: the measure is this
// process's resident set.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "harness/bundle_runner.h"
#include "harness/sweep_config.h"
#include "workers/prefix_store.h"
#include "workers/runner.h"

namespace kvb {
namespace {

const std::string kSmol = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kStories = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
const std::string kTok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";

std::string write_config() {
  const std::string path = std::string(KVB_BINARY_DIR) + "/unit_memory_cap.yaml";
  std::ofstream out(path);
  out << "models:\n"
      << "  - name: smol\n"
      << "    path: " << kSmol << "\n"
      << "  - name: stories\n"
      << "    path: " << kStories << "\n"
      << "    tokenizer: " << kTok << "\n"
      << "tasks:\n"
      << "  - name: niah\n"
      << "    options: {context_lengths: [128], depths: [0], haystack: noise, chat: false}\n"
      << "policies: [full, h2o]\n"
      << "kv_budget: [16]\n";
  return path;
}

harness::WireBundle bundle(int model) {
  harness::WireBundle b;
  b.model = model;
  b.task = 0;
  b.sample.id = "story";
  b.sample.chat = false;
  b.sample.context =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball.";
  b.sample.question = " Then Lily";
  b.sample.references = {"ball"};
  b.sample.max_new_tokens = 6;
  for (const char* p : {"full", "h2o"}) {
    harness::WireUnit u;
    u.key = std::string("story/") + p + "/m" + std::to_string(model);
    u.policy = p;
    u.kv_budget = std::string(p) == "full" ? 0 : 16;
    b.units.push_back(u);
  }
  return b;
}

TEST(UnitMemoryCap, ALargerModelRunBeforeIsNotChargedToTheNextModelsUnits) {
  ASSERT_TRUE(std::ifstream(kSmol).good()) << kSmol << " missing: run scripts/fetch_models.sh";
  const harness::SweepConfig cfg = harness::load_sweep_config(write_config());
  harness::BundleRunner runner(cfg, true, engine::Device::kCpu, engine::DType::kF32, 0);
  runner.limit_rss(0.2);  // 204 MiB
  // stories260K alone: well under the cap.
  const std::vector<results::UnitResult> alone = runner.run(bundle(1));
  ASSERT_EQ(alone.size(), 2u);
  for (const auto& r : alone) {
    ASSERT_EQ(r.status, results::UnitStatus::kOk) << r.unit_key << ": " << r.error;
  }
  // SmolLM2: its f32 weights alone are above the cap, so its units really exceed it.
  const std::vector<results::UnitResult> smol = runner.run(bundle(0));
  ASSERT_EQ(smol.size(), 2u);
  for (const auto& r : smol) {
    EXPECT_EQ(r.status, results::UnitStatus::kOom) << r.unit_key << ": " << r.error;
    EXPECT_NE(r.error.find("sample story: the worker's resident memory, "), std::string::npos)
        << r.error;
    EXPECT_NE(r.error.find("MiB, is above the cap of 204 MiB (--max-rss-gb"), std::string::npos)
        << r.error;
  }
  // stories260K again, after SmolLM2: judged as alone (before the fix: `oom`, charged with what
  // SmolLM2 left resident), with the same outputs.
  const std::vector<results::UnitResult> after = runner.run(bundle(1));
  ASSERT_EQ(after.size(), 2u);
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after[i].status, results::UnitStatus::kOk)
        << after[i].unit_key << ": " << after[i].error;
    ASSERT_TRUE(after[i].prediction && alone[i].prediction);
    EXPECT_EQ(after[i].prediction->text, alone[i].prediction->text);
  }
  // And SmolLM2 again: still above the cap.
  for (const auto& r : runner.run(bundle(0))) {
    EXPECT_EQ(r.status, results::UnitStatus::kOom) << r.unit_key << ": " << r.error;
  }
}

// What the cap does not charge (RunSettings::rss_not_charged_bytes: what earlier models left;
// the prefix store's bytes) is taken off the resident set, and the message says how much; a
// unit is still charged everything else.
TEST(UnitMemoryCap, WhatIsNotChargedIsTakenOffAndNamed) {
  workers::LoadedModel lm = workers::load_model_and_tokenizer(kStories, kTok);
  engine::Engine eng(*lm.model);
  const auto& c = lm.model->config;
  policies::PolicyConfig pc;
  pc.name = "full";
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  tasks::Sample s = bundle(1).sample;
  workers::RunSettings rs;
  rs.max_rss_bytes = size_t{1} << 20;  // 1 MiB: below any process's resident set
  rs.rss_not_charged_bytes = size_t{3} << 20;
  try {
    workers::run_sample(lm, eng, s, pc, rs);
    ADD_FAILURE() << "a unit above the cap ended ok";
  } catch (const workers::UnitMemoryLimit& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "MiB, is above the cap of 1 MiB (--max-rss-gb; the model's weights count; not "
                  "counted: 3 MiB that earlier models left resident); "),
              std::string::npos)
        << e.what();
  }
  // Everything resident not charged (more than the process holds): the unit passes a 1 MiB cap.
  rs.rss_not_charged_bytes = workers::host_rss_bytes() + (size_t{1} << 30);
  EXPECT_EQ(workers::run_sample(lm, eng, s, pc, rs).m.generated_tokens, 6);
  // A prefix store holding an earlier prompt's rows: taken off too, and named.
  tasks::Sample a = s, b = s;
  for (int i = 0; i < 4; ++i) a.context += " " + s.context;
  b.context = a.context + " The ball was blue.";
  workers::PrefixStore store(size_t{64} << 20);
  workers::RunSettings with;
  with.prefix_store = &store;
  store.add_prompt(workers::shared_prefill_tokens(lm, a, with));
  store.add_prompt(workers::shared_prefill_tokens(lm, b, with));
  workers::run_bundle(lm, eng, a, {pc}, with, true);
  ASSERT_GT(store.bytes(), 0u);
  with.max_rss_bytes = size_t{1} << 20;
  std::vector<std::optional<workers::UnitFailure>> failures;
  workers::run_bundle(lm, eng, b, {pc}, with, true, &failures);
  ASSERT_TRUE(failures[0].has_value());
  EXPECT_EQ(failures[0]->status, workers::FailureStatus::kOom);
  const std::string kib = std::to_string((store.bytes() + 1023) >> 10) + " KiB of prefix store";
  EXPECT_NE(failures[0]->message.find(
                "(--max-rss-gb; the model's weights count; not counted: " + kib + "); "),
            std::string::npos)
      << failures[0]->message;
}

}  // namespace
}  // namespace kvb
