// Prefill sharing (DESIGN.md "Scheduling"): a bundle of 6 policies x 2 budgets on one prompt runs
// the prompt's prefill once for the policies that allow it, and every unit's outputs equal those
// of running it alone, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "cache_check.h"
#include "kernels/policies/policy.h"
#include "registry_options.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "workers/runner.h"
#include "workers/unit_run.h"

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
  // Each unit's final cache (a shared unit's holds only what its policy kept of the shared
  // prefill's rows: KvCache::fill_layer).
  std::vector<kernels::KvCache> shared_caches(pcs.size()), alone_caches(pcs.size());
  workers::RunSettings rs_shared, rs_alone;
  rs_shared.on_final_cache = [&](size_t unit, const kernels::KvCache& cache,
                                 const policies::Policy&) { shared_caches[unit] = cache; };
  rs_alone.on_final_cache = [&](size_t unit, const kernels::KvCache& cache,
                                const policies::Policy&) { alone_caches[unit] = cache; };
  const int64_t before = eng.prefills();
  std::vector<workers::UnitOutput> shared = workers::run_bundle(lm, eng, s, pcs, rs_shared, true);
  const int64_t shared_prefills = eng.prefills() - before;
  EXPECT_EQ(shared_prefills, 1) << "prefills executed for a bundle of 12 shareable units";
  const int64_t before2 = eng.prefills();
  std::vector<workers::UnitOutput> alone = workers::run_bundle(lm, eng, s, pcs, rs_alone, false);
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
    EXPECT_EQ(shared[i].m.kv_bytes_peak, alone[i].m.kv_bytes_peak);
    EXPECT_EQ(shared[i].m.kv_physical_peak, alone[i].m.kv_physical_peak);
    EXPECT_EQ(shared[i].m.policy_state_bytes, alone[i].m.policy_state_bytes);
    expect_same_cache(shared_caches[i], alone_caches[i]);
    differ += shared[i].prediction.text != shared[0].prediction.text;
  }
  // The budgets bite: some policy's continuation differs from full's.
  EXPECT_GT(differ, 0);
}

// stories260K with its tokenizer (no chat template), and a story about Lily with `question`
// after it: the prompts of the finch and kvzip bundles below.
workers::LoadedModel stories260k() {
  return workers::load_model_and_tokenizer(
      std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin",
      std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin");
}

tasks::Sample lily(const std::string& question, int max_new_tokens) {
  tasks::Sample s;
  s.id = "story";
  s.chat = false;
  s.context =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
  s.question = question;
  s.max_new_tokens = max_new_tokens;
  return s;
}

// `finch`'s window is the prompt's question: the runner hands its length (the question and the
// template's tail) to the policy on the shared and the own prefill alike, so the unit keeps what
// finch with window_size = that length keeps, and not what a window one token longer keeps.
TEST(PrefillSharing, FinchTakesTheQuestionAsItsWindow) {
  workers::LoadedModel lm = stories260k();
  engine::Engine eng(*lm.model);
  const tasks::Sample s = lily(" Lily asked her mom for help. Then Lily", 4);
  const workers::detail::PromptTokens pt = workers::detail::build_prompt(lm, s, {});
  // No chat template: no tail, so the window is the question, all of whose queries score (the
  // question and the tail handed apart: Finch.TheQuestionsQueriesScoreAndTheTailStays).
  ASSERT_TRUE(pt.tail.empty());
  const int question = static_cast<int>(pt.question.size());
  ASSERT_GE(question, 5);
  const auto& c = lm.model->config;
  std::vector<policies::PolicyConfig> pcs;
  for (const int w : {0, question, question + 1}) {  // 0: the runner's question
    policies::PolicyConfig pc;
    pc.name = "finch";
    pc.kv_budget = 24;
    pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
    pc.options = policies::PolicyOptions(
        std::map<std::string, std::string>{{"window_size", std::to_string(w)},
                                           {"positions", "true"}});
    pcs.push_back(pc);
  }
  std::vector<kernels::KvCache> shared_caches;
  for (const bool share : {true, false}) {
    SCOPED_TRACE(share ? "shared prefill" : "own prefill");
    std::vector<kernels::KvCache> caches(pcs.size());
    workers::RunSettings rs;
    rs.on_final_cache = [&](size_t unit, const kernels::KvCache& cache,
                            const policies::Policy&) { caches[unit] = cache; };
    const std::vector<workers::UnitOutput> out = workers::run_bundle(lm, eng, s, pcs, rs, share);
    ASSERT_EQ(out.size(), 3u);
    expect_same_cache(caches[0], caches[1]);
    bool differs = false;
    for (int l = 0; l < c.num_layers; ++l) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const int n = caches[0].length(l, h);
        differs |= n != caches[2].length(l, h) ||
                   !std::equal(caches[0].layer(l).position(h),
                               caches[0].layer(l).position(h) + n,
                               caches[2].layer(l).position(h));
      }
    }
    EXPECT_TRUE(differs) << "a window one token longer kept the same slots";
    if (share) {
      shared_caches = caches;
    } else {
      for (size_t i = 0; i < caches.size(); ++i) expect_same_cache(caches[i], shared_caches[i]);
    }
  }
}

// `kvzip` in a bundle: the runner hands it the reconstruction prompt of the task's template (the
// head is not repeated, the tail follows each instruction), and its passes run on top of the
// shared prefill as on its own: the unit's cache is the one engine::prefill_prompt leaves with
// that prompt, whichever path ran it, and not the one of a prompt without the template's parts.
TEST(PrefillSharing, KvZipReconstructsTheSameContextOnBothPaths) {
  workers::LoadedModel lm = stories260k();
  engine::Engine eng(*lm.model);
  const tasks::Sample s = lily(" Then Lily", 3);
  const auto& c = lm.model->config;
  policies::PolicyConfig pc;
  pc.name = "kvzip";
  pc.kv_budget = 20;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.options = policies::PolicyOptions(std::map<std::string, std::string>{{"chunk_size", "32"}});
  std::vector<kernels::KvCache> caches(2);
  for (const bool share : {true, false}) {
    workers::RunSettings rs;
    rs.on_final_cache = [&](size_t, const kernels::KvCache& cache, const policies::Policy&) {
      caches[share] = cache;
    };
    const std::vector<workers::UnitOutput> out = workers::run_bundle(lm, eng, s, {pc}, rs, share);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].m.prefill_shared, share);
  }
  expect_same_cache(caches[1], caches[0]);
  // The same prompt through the engine alone, with the template's head and tail handed over.
  const workers::detail::PromptTokens pt = workers::detail::build_prompt(lm, s, {});
  std::vector<int32_t> prompt = pt.head;
  for (const auto* part : {&pt.context, &pt.question, &pt.tail}) {
    prompt.insert(prompt.end(), part->begin(), part->end());
  }
  auto own = [&](const policies::ReplayPrompt& rp) {
    std::unique_ptr<policies::Policy> p = policies::make_policy(pc);
    p->set_replay_prompt(rp);
    kernels::KvCache cache = eng.new_cache(static_cast<int>(prompt.size()) + 4, p.get());
    std::vector<float> logits;
    engine::prefill_prompt(eng, cache, prompt, p.get(), &logits);
    return cache;
  };
  const kernels::KvCache direct =
      own(workers::replay_prompt(lm, static_cast<int>(pt.head.size()), pt.tail));
  const kernels::KvCache bare = own({});
  int differ = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const int n = direct.length(l, h);
      ASSERT_EQ(n, caches[0].length(l, h) - 2);  // the unit decoded 2 more
      EXPECT_TRUE(std::equal(direct.layer(l).position(h), direct.layer(l).position(h) + n,
                             caches[0].layer(l).position(h)));
      differ += n != bare.length(l, h) ||
                !std::equal(direct.layer(l).position(h), direct.layer(l).position(h) + n,
                            bare.layer(l).position(h));
    }
  }
  EXPECT_GT(differ, 0) << "the reconstruction prompt changed nothing";
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

// The engine's side of sharing, for every registered policy that can share: the cache
// apply_recorded_prefill makes from a recorded prefill (only the kept rows copied, the hooks
// reading the shared cache) is the cache of the policy's own prefill, bit for bit, with the
// same capacity, and both decode the same logits afterwards. Gemma 3 tiny has sliding-window
// layers (copied whole; policies act on the global layers).
void expect_shared_equals_own(const engine::Model& m, const std::vector<int32_t>& prompt,
                              int budget) {
  engine::Engine eng(m);
  const auto& c = m.config;
  const int n = static_cast<int>(prompt.size());
  const int extra = 3;
  int shared_policies = 0;
  // Every registered policy with its defaults, and ThinK's key channels alone and after a
  // policy (the channel hook runs on the recorded path too).
  std::vector<std::pair<std::string, std::map<std::string, std::string>>> entries;
  for (const auto& entry : policies::policy_registry()) entries.push_back({entry.name, {}});
  entries.push_back({"think", {{"key_channel_compression_ratio", "0.5"}}});
  entries.push_back({"snapkv", {{"think", "0.5"}}});
  entries.push_back({"keydiff", {{"think", "0.25"}, {"think_window", "3"}}});
  // KeyRerotationPress: the recorded path re-rotates and continues at the same position.
  entries.push_back({"snapkv", {{"positions", "rerotate"}}});
  entries.push_back({"keydiff", {{"positions", "rerotate"}, {"think", "0.5"}}});
  // Composition (then:, kvpress's ComposedPress): the first policy's request is its widest
  // budget's, since the record is made before begin_sequence sets the budget.
  entries.push_back({"snapkv", {{"then", "keydiff"}, {"first_compression_ratio", "0.5"}}});
  entries.push_back({"knorm",
                     {{"then", "lagkv"},
                      {"first_compression_ratio", "0.25"},
                      {"then.lag", "4"},
                      {"think", "0.5"}}});
  bool sliding = false;
  for (int l = 0; l < c.num_layers; ++l) sliding |= c.sliding(l);
  for (const auto& [name, options] : entries) {
    // Refused there: rerotate (RerotateRefusesSlidingLayers), kvzip (its passes).
    if (sliding && (options.count("positions") || name == "kvzip")) continue;
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = policies::budgeted(name) ? budget : 0;
    pc.options = policies::PolicyOptions(options);
    pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
    pc.seed = 5;
    pc.shape.sliding_layers = sliding;
    if (options.empty()) {
      pc.options = policies::PolicyOptions(
          testing_registry::required_options(name, c.num_layers, c.num_kv_heads, c.head_dim));
    }
    if (name == "python") {  // reads the queries, the last rows and the column sums
      pc.options = policies::PolicyOptions(
          {{"file", std::string(KVB_FIXTURES_DIR) + "/python/every_statistic.py"},
           {"window_queries", "5"}});
    }
    std::unique_ptr<policies::Policy> mine = policies::make_policy(pc);
    if (!engine::can_share_prefill(*mine)) continue;
    ++shared_policies;
    SCOPED_TRACE(name + (options.empty() ? "" : " " + options.begin()->first));
    engine::PrefillRecord rec;
    rec.request = mine->prefill_stats(n);
    kernels::KvCache full = eng.new_cache(n + extra);
    std::vector<float> full_logits;
    eng.forward(prompt, full, engine::LogitsMode::kLast, &full_logits, nullptr,
                engine::PolicyHook::kNone, &rec);
    const kernels::KvCache full_before = full;
    std::unique_ptr<policies::Policy> shared_policy = policies::make_policy(pc);
    shared_policy->begin_sequence(n);
    kernels::KvCache shared;
    eng.apply_recorded_prefill(*shared_policy, full, extra, rec, shared);
    // KVzip's passes on top of the recorded prefill, as the runner runs them.
    if (shared_policy->reconstructs_context()) {
      eng.reconstruct_context(*shared_policy, shared, prompt);
    }
    kernels::KvCache own = eng.new_cache(n + extra, mine.get());
    std::vector<float> own_logits;
    engine::prefill_prompt(eng, own, prompt, mine.get(), &own_logits);
    EXPECT_EQ(own_logits, full_logits);
    expect_same_cache(shared, own);
    expect_same_cache(full, full_before);  // untouched: the bundle's next unit reads it
    std::vector<float> a_logits, b_logits;
    for (int32_t t : {prompt[1], prompt[2], prompt[0]}) {
      eng.forward({&t, 1}, shared, engine::LogitsMode::kLast, &a_logits, shared_policy.get(),
                  engine::PolicyHook::kDecode);
      eng.forward({&t, 1}, own, engine::LogitsMode::kLast, &b_logits, mine.get(),
                  engine::PolicyHook::kDecode);
      EXPECT_EQ(a_logits, b_logits);
    }
  }
  EXPECT_GE(shared_policies, 10);
}

TEST(PrefillSharing, RecordedPrefillGivesTheOwnPrefillsCacheStories260K) {
  const std::string path = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 47; ++i) prompt.push_back(static_cast<int32_t>(3 + (i * 37) % 500));
  expect_shared_equals_own(*m, prompt, 12);
}

TEST(PrefillSharing, RecordedPrefillGivesTheOwnPrefillsCacheGemma3Tiny) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  ASSERT_TRUE(m->config.sliding(0));
  const std::string text = "Sliding layers keep a window; only the global layer is evicted.";
  const std::vector<int32_t> prompt(text.begin(), text.end());
  expect_shared_equals_own(*m, prompt, 20);
}

// `positions: rerotate` on a model with sliding-window layers is a usage error at the prompt: the
// windows keep the tokens' own positions, which the next tokens would precede.
TEST(PrefillSharing, RerotateRefusesSlidingLayers) {
  const std::string path = std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf";
  std::unique_ptr<engine::Model> m = engine::load_model(path);
  engine::Engine eng(*m);
  const auto& c = m->config;
  policies::PolicyConfig pc;
  pc.name = "snapkv";
  pc.kv_budget = 8;
  pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
  pc.options = policies::PolicyOptions(
      std::map<std::string, std::string>{{"positions", "rerotate"}});
  auto policy = policies::make_policy(pc);
  kernels::KvCache cache = eng.new_cache(0, policy.get());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(70 + i);
  std::vector<float> logits;
  try {
    engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
    ADD_FAILURE() << "rerotate ran on sliding-window layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window layers"), std::string::npos) << e.what();
  }
}

// Engine::trim_storage on the CPU changes nothing (the spare capacity of a calloc'd cache
// is not resident): the cache after it equals a copy taken before, capacity and physical bytes
// included, and both decode the same logits.
TEST(PrefillSharing, TrimStorageIsANoOpOnTheCpu) {
  const std::string model = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  ASSERT_TRUE(std::ifstream(model).good()) << model;
  std::unique_ptr<engine::Model> m = engine::load_model(model);
  engine::Engine eng(*m);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((5 + 37 * i) % m->config.vocab_size);
  kernels::KvCache cache = eng.new_cache(200);
  std::vector<float> logits;
  engine::prefill_prompt(eng, cache, prompt, nullptr, &logits);
  const kernels::KvCache before = cache;
  eng.trim_storage(cache, 3);
  expect_same_cache(before, cache);
  EXPECT_EQ(eng.kv_physical_bytes(cache), eng.kv_physical_bytes(before));
  kernels::KvCache twin = before;
  std::vector<float> a, b;
  const int32_t token = 7;
  eng.forward({&token, 1}, cache, engine::LogitsMode::kLast, &a);
  eng.forward({&token, 1}, twin, engine::LogitsMode::kLast, &b);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace kvb
