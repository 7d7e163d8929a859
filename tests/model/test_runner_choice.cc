// The runner's choice protocol (workers/runner.h) against the engine driven by hand, bit for bit:
// the prompt prefilled under the unit's policy, then each choice scored on its own copy of the
// cache and of the policy (sum of log softmax of the choice's tokens, the decode rule on every
// step after the first). Checked with the prefill shared and not, for policies that compress the
// prompt (snapkv), evict while decoding (h2o, window) and keep everything (full), and for a
// choice list in another order (the forks are independent of each other). stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "workers/engine/generate.h"
#include "workers/runner.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
const std::string kTok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";

// log softmax(logits)[id] in double, written here again on purpose: the expectation does not
// call the runner's own helpers.
double log_softmax_at(const std::vector<float>& logits, int32_t id) {
  double m = -INFINITY;
  for (float x : logits) m = std::max(m, static_cast<double>(x));
  double s = 0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - m);
  return static_cast<double>(logits[id]) - m - std::log(s);
}

// What the runner should give: the prompt as the runner assembles it for a plain (non-chat)
// sample with the question in the prompt, prefilled under the policy; a full copy of the cache
// and a clone of the policy per choice.
std::vector<double> by_hand(const workers::LoadedModel& lm, engine::Engine& eng,
                            const tasks::Sample& s, const policies::PolicyConfig& pc) {
  std::vector<int32_t> prompt =
      workers::encode_text(lm, "", true, workers::prompt_needs_bos(lm, false));
  for (const std::string& part : {s.context, s.question}) {
    const auto ids = workers::encode_text(lm, part, false, false);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  auto policy = policies::make_policy(pc);
  kernels::KvCache cache =
      eng.new_cache(static_cast<int>(prompt.size()) + std::max(1, s.max_new_tokens), policy.get());
  std::vector<float> logits;
  engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
  std::vector<double> out;
  for (const std::string& choice : s.choices) {
    const std::vector<int32_t> ids = workers::encode_text(lm, choice, false, false);
    kernels::KvCache fork = cache;
    auto fork_policy = policy->clone();
    std::vector<float> l = logits;
    double ll = log_softmax_at(l, ids[0]);
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      eng.forward({&ids[t], 1}, fork, engine::LogitsMode::kLast, &l, fork_policy.get(),
                  engine::PolicyHook::kDecode);
      ll += log_softmax_at(l, ids[t + 1]);
    }
    out.push_back(ll);
  }
  return out;
}

TEST(RunnerChoice, LogLikelihoodsEqualTheEngineByHand) {
  ASSERT_TRUE(std::ifstream(kModel).good()) << kModel;
  workers::LoadedModel lm = workers::load_model_and_tokenizer(kModel, kTok);
  engine::Engine eng(*lm.model);
  tasks::Sample s;
  s.id = "choice";
  s.kind = tasks::SampleKind::kChoice;
  s.chat = false;
  s.context =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
  s.question = " Lily asked her";
  // Multi-token choices, so that forks run decode steps (and h2o/window evict in them).
  s.choices = {" mom for help with the ball", " dog", " friend Tom to get the big red ball"};
  s.max_new_tokens = 12;
  const auto& c = lm.model->config;
  std::vector<policies::PolicyConfig> pcs;
  for (const char* name : {"full", "h2o", "window", "snapkv"}) {
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = std::string(name) == "full" ? 0 : 16;
    pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
    pcs.push_back(pc);
  }
  for (bool share : {true, false}) {
    const auto outs = workers::run_bundle(lm, eng, s, pcs, {}, share);
    ASSERT_EQ(outs.size(), pcs.size());
    for (size_t i = 0; i < pcs.size(); ++i) {
      SCOPED_TRACE(pcs[i].name + (share ? " shared" : " alone"));
      EXPECT_EQ(outs[i].prediction.choice_logliks, by_hand(lm, eng, s, pcs[i]));
      EXPECT_EQ(outs[i].m.generated_tokens, 0);
    }
  }
  // The budget bites: h2o's scores differ from full's somewhere.
  const auto outs = workers::run_bundle(lm, eng, s, pcs, {}, true);
  EXPECT_NE(outs[1].prediction.choice_logliks, outs[0].prediction.choice_logliks);
  // Reordered choices: each score follows its choice.
  tasks::Sample r = s;
  r.choices = {s.choices[2], s.choices[0], s.choices[1]};
  const auto re = workers::run_bundle(lm, eng, r, pcs, {}, true);
  for (size_t i = 0; i < pcs.size(); ++i) {
    const auto& a = outs[i].prediction.choice_logliks;
    EXPECT_EQ(re[i].prediction.choice_logliks, (std::vector<double>{a[2], a[0], a[1]}))
        << pcs[i].name;
  }
}

}  // namespace
}  // namespace kvb
