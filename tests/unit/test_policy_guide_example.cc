// The guide's example policy, `prompt_heavy` (examples/policies/cpp/prompt_heavy.cc; the walk
// through it is kernels/policies/README.md). This binary compiles the example itself (or the
// build has it among KVBENCH_EXTRA_POLICIES), so it runs in every build:
//  - a hand-computed case (expectations worked out below, not by the policy's code): prefill
//    by GQA-mean column sums with ties, the gqa_reduce=max variant, then decode steps that evict
//    by the frozen prompt scores and let generated tokens go once they leave the window, a
//    second prefill block, and a decode-only run (a sliding window);
//  - the hook-level laws of POLICIES.md "What every policy must pass": a budget that never
//    forces an eviction keeps everything; no head above the budget after any hook; determinism
//    (twice, and a clone after prefill); state bytes = retained slots x 4. The engine-level laws
//    (logits bit-identical to `full`, on real models) are tests/model/test_policy_laws.cc, which
//    includes this policy; CPU/CUDA parity is tests/cuda/test_cuda_policy_guide_example.cc;
//  - its options, and the registry's checks of extra policies (extra_policies.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/policies/extra_policies.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/policy.h"

namespace kvb::policies {
PolicyInfo prompt_heavy_policy_info();  // examples/policies/cpp/prompt_heavy.cc
namespace {

const PolicyInfo& example() {
  static const PolicyInfo info = prompt_heavy_policy_info();
  return info;
}

std::unique_ptr<Policy> make(int budget, std::map<std::string, std::string> opts = {},
                             int layers = 1, int heads = 4, int kv_heads = 2) {
  PolicyConfig c;
  c.name = "prompt_heavy";
  c.kv_budget = budget;
  c.shape = {layers, heads, kv_heads, 4, 4096};
  c.options = PolicyOptions(std::move(opts));
  return make_policy(example(), c);
}

// `layers` x `kv_heads` heads of head_dim 4 holding positions 0..n-1.
kernels::KvCache prompt_cache(int n, int kv_heads = 2, int layers = 1) {
  kernels::KvCache cache({layers, kv_heads, 4}, 64);
  float kv[4] = {};
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < kv_heads; ++h) {
      for (int t = 0; t < n; ++t) {
        kv[0] = static_cast<float>(t);
        cache.append(l, h, kv, kv, t);
      }
    }
  }
  cache.advance_position(n);
  return cache;
}

// Appends the next position to every head of every layer (the engine's decode append).
void append_token(kernels::KvCache& cache) {
  const float kv[4] = {};
  for (int l = 0; l < cache.shape().num_layers; ++l) {
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      cache.append(l, h, kv, kv, cache.next_position());
    }
  }
  cache.advance_position(1);
}

std::vector<int> positions(kernels::KvCache& cache, int head, int layer = 0) {
  kernels::LayerKvView v = cache.layer(layer);
  return std::vector<int>(v.position(head), v.position(head) + cache.length(layer, head));
}

LayerStats prefill_stats(const std::vector<float>& col_sums, int n, int num_heads, int layer = 0) {
  LayerStats s;
  s.layer = layer;
  s.n_new = n;
  s.num_heads = num_heads;
  s.stride = n;
  s.col_sums = col_sums.data();
  return s;
}

LayerStats decode_stats(int num_heads, int layer = 0) {  // the policy asks for nothing
  LayerStats s;
  s.layer = layer;
  s.n_new = 1;
  s.num_heads = num_heads;
  return s;
}

// 4 query heads over 2 KV heads (group 2), a prompt of 8 tokens, column sums per query head:
//   q0: 4.0 1.5 2.0 0.25 1.0 3.0 0.5 0.25      q2: 1.0 0.0 6.0 0.5 0.0 0.0 0.0 1.0
//   q1: 2.0 2.5 0.0 0.75 3.0 1.0 0.5 0.75      q3: 1.0 2.0 2.0 1.5 0.0 4.0 0.0 1.0
// KV head scores (GQA mean, exact in binary):
//   head 0: 3.0 2.0 1.0 0.5 2.0 2.0 0.5 0.5    head 1: 1.0 1.0 4.0 1.0 0.0 2.0 0.0 1.0
// kv_budget 5, heavy_fraction 0.5: heavy = floor(2.5) = 2, recent = 3, so positions 5, 6, 7 stay
// and each head keeps the top 2 of positions 0..4:
//   head 0: 3.0 (pos 0), then 2.0 at pos 1 and pos 4 tie -> the later, 4: keeps {0, 4, 5, 6, 7}
//   head 1: 4.0 (pos 2), then 1.0 at pos 0, 1, 3 tie -> the latest, 3:    keeps {2, 3, 5, 6, 7}
// with scores head 0: (3.0, 2.0, 2.0, 0.5, 0.5), head 1: (4.0, 1.0, 2.0, 0.0, 1.0).
const std::vector<float> kColSums = {4.0f, 1.5f, 2.0f, 0.25f, 1.0f, 3.0f, 0.5f, 0.25f,  // q0
                                     2.0f, 2.5f, 0.0f, 0.75f, 3.0f, 1.0f, 0.5f, 0.75f,  // q1
                                     1.0f, 0.0f, 6.0f, 0.5f,  0.0f, 0.0f, 0.0f, 1.0f,   // q2
                                     1.0f, 2.0f, 2.0f, 1.5f,  0.0f, 4.0f, 0.0f, 1.0f};  // q3

TEST(PromptHeavy, HandComputedPrefill) {
  std::unique_ptr<Policy> p = make(5);
  kernels::KvCache cache = prompt_cache(8);
  prefill_layer(*p, prefill_stats(kColSums, 8, 4), cache);
  EXPECT_EQ(positions(cache, 0), (std::vector<int>{0, 4, 5, 6, 7}));
  EXPECT_EQ(positions(cache, 1), (std::vector<int>{2, 3, 5, 6, 7}));
  EXPECT_EQ(p->state_bytes(), 10 * sizeof(float));  // one score per retained slot
}

// gqa_reduce=max: head 0's maxima over q0, q1 are 4.0 2.5 2.0 0.75 3.0 | ... -> top 2 of
// positions 0..4 are 0 (4.0) and 4 (3.0), as with the mean; head 1's over q2, q3 are
// 1.0 2.0 6.0 1.5 0.0 | ... -> 2 (6.0) and 1 (2.0): keeps {1, 2, 5, 6, 7} (the mean kept 3).
TEST(PromptHeavy, HandComputedPrefillGqaMax) {
  std::unique_ptr<Policy> p = make(5, {{"gqa_reduce", "max"}});
  kernels::KvCache cache = prompt_cache(8);
  prefill_layer(*p, prefill_stats(kColSums, 8, 4), cache);
  EXPECT_EQ(positions(cache, 0), (std::vector<int>{0, 4, 5, 6, 7}));
  EXPECT_EQ(positions(cache, 1), (std::vector<int>{1, 2, 5, 6, 7}));
}

// Decode after HandComputedPrefill: each step appends one position (score 0) and the head,
// now 6 slots, loses the lowest-scored slot outside its last 3 (ties: the older goes).
//   step 1 (pos 8):  head 0 candidates 0 (3.0), 4 (2.0), 5 (2.0) -> 4 goes (tie, the older)
//                    head 1 candidates 2 (4.0), 3 (1.0), 5 (2.0) -> 3 goes
//   step 2 (pos 9):  head 0: 0 (3.0), 5 (2.0), 6 (0.5) -> 6;  head 1: 2, 5, 6 (0.0) -> 6
//   step 3 (pos 10): head 0: 0, 5, 7 (0.5) -> 7;            head 1: 2, 5, 7 (1.0) -> 7
//   step 4 (pos 11): position 8, generated, scores 0 and goes in both heads
//   step 5 (pos 12): position 9 goes: the heavy set {0, 5} / {2, 5} stays while tokens slide.
TEST(PromptHeavy, HandComputedDecodeKeepsThePromptRanking) {
  std::unique_ptr<Policy> p = make(5);
  const StatsRequest req = p->decode_request();
  EXPECT_FALSE(req.col_sums || req.last_w > 0 || req.pre_rope_keys) << "decode asks for nothing";
  EXPECT_TRUE(p->prefill_request(8).col_sums);
  kernels::KvCache cache = prompt_cache(8);
  prefill_layer(*p, prefill_stats(kColSums, 8, 4), cache);
  const std::vector<std::vector<int>> want0 = {
      {0, 5, 6, 7, 8}, {0, 5, 7, 8, 9}, {0, 5, 8, 9, 10}, {0, 5, 9, 10, 11}, {0, 5, 10, 11, 12}};
  const std::vector<std::vector<int>> want1 = {
      {2, 5, 6, 7, 8}, {2, 5, 7, 8, 9}, {2, 5, 8, 9, 10}, {2, 5, 9, 10, 11}, {2, 5, 10, 11, 12}};
  for (size_t step = 0; step < want0.size(); ++step) {
    SCOPED_TRACE(testing::Message() << "decode step " << step + 1);
    append_token(cache);
    decode_layer(*p, decode_stats(4), cache);
    EXPECT_EQ(positions(cache, 0), want0[step]);
    EXPECT_EQ(positions(cache, 1), want1[step]);
    EXPECT_EQ(p->state_bytes(), 10 * sizeof(float));
  }
}

// A second prefill block on a compressed cache adds its column sums to the survivors' scores.
// After HandComputedPrefill head 0 holds positions
// 0 4 5 6 7 with scores 3.0 2.0 2.0 0.5 0.5; a block of 2 (positions 8, 9) whose column sums
// over the 7 slots are, for q0 and q1 alike, 0 0 0 4.0 0 1.0 0 gives head 0 the scores
// 3.0 2.0 2.0 4.5 0.5 1.0 0.0: 7 slots, budget 5, window = positions 7 8 9, candidates
// 0 4 5 6 -> keep 6 (4.5) and 0 (3.0): {0, 6, 7, 8, 9}. Head 1 (q2, q3 all zero) holds 2 3 5 6 7
// with 4.0 1.0 2.0 0.0 1.0, then 0 0: candidates 2 3 5 6 -> 2 (4.0) and 5 (2.0): {2, 5, 7, 8, 9}.
TEST(PromptHeavy, SecondPromptBlockAddsToTheSurvivors) {
  std::unique_ptr<Policy> p = make(5);
  kernels::KvCache cache = prompt_cache(8);
  prefill_layer(*p, prefill_stats(kColSums, 8, 4), cache);
  append_token(cache);
  append_token(cache);
  std::vector<float> block(4 * 7, 0.0f);
  for (int q = 0; q < 2; ++q) {
    block[q * 7 + 3] = 4.0f;
    block[q * 7 + 5] = 1.0f;
  }
  LayerStats st = prefill_stats(block, 2, 4);
  st.stride = 7;
  prefill_layer(*p, st, cache);
  EXPECT_EQ(positions(cache, 0), (std::vector<int>{0, 6, 7, 8, 9}));
  EXPECT_EQ(positions(cache, 1), (std::vector<int>{2, 5, 7, 8, 9}));
}

// Tokens that come only through the decode hook (a perplexity run: no prefill) all score 0, so
// ties go to the more recent: budget 3 (heavy 1, recent 2) keeps the last 3 positions.
TEST(PromptHeavy, DecodeOnlyIsASlidingWindow) {
  std::unique_ptr<Policy> p = make(3);
  kernels::KvCache cache = prompt_cache(0);
  for (int t = 0; t < 7; ++t) {
    append_token(cache);
    decode_layer(*p, decode_stats(4), cache);
    const int first = std::max(0, t - 2);
    std::vector<int> want;
    for (int q = first; q <= t; ++q) want.push_back(q);
    EXPECT_EQ(positions(cache, 0), want) << "step " << t;
    EXPECT_EQ(positions(cache, 1), want) << "step " << t;
  }
}

// Seeded column sums for `layers` x 4 query heads over n slots, few distinct values (ties).
std::vector<float> sums(int n, int seed) {
  std::vector<float> v(4 * static_cast<size_t>(n));
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed);
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    f = static_cast<float>(x % 5) * 0.5f;
  }
  return v;
}

struct Trace {
  std::vector<std::vector<std::vector<int>>> keep;  // per hook: per (layer, head) positions
  int max_len = 0;
};

// A prompt of n through every layer's prefill, then `steps` decode steps; the keep-sets after
// each hook. From `fork_after_prefill`, the clone of the policy runs the decode steps.
Trace run(int budget, int n, int steps, const std::map<std::string, std::string>& opts = {},
          bool fork_after_prefill = false) {
  const int layers = 2, kv_heads = 2;
  std::unique_ptr<Policy> p = make(budget, opts, layers);
  kernels::KvCache cache = prompt_cache(n, kv_heads, layers);
  Trace r;
  auto record = [&] {
    std::vector<std::vector<int>> k;
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kv_heads; ++h) {
        k.push_back(positions(cache, h, l));
        r.max_len = std::max(r.max_len, cache.length(l, h));
      }
    }
    r.keep.push_back(k);
  };
  for (int l = 0; l < layers; ++l) {
    const std::vector<float> cs = sums(n, l);
    prefill_layer(*p, prefill_stats(cs, n, 4, l), cache);
  }
  record();
  if (fork_after_prefill) p = p->clone();
  for (int s = 0; s < steps; ++s) {
    append_token(cache);
    for (int l = 0; l < layers; ++l) decode_layer(*p, decode_stats(4, l), cache);
    record();
    EXPECT_EQ(p->state_bytes(), cache.total_slots() * sizeof(float));
  }
  return r;
}

// Law 1 at the hook level: a budget of at least prompt + generated tokens keeps everything.
TEST(PromptHeavyLaws, BudgetAboveEverythingKeepsEverything) {
  const int n = 30, steps = 10;
  for (const int budget : {n + steps, n + steps + 7}) {
    const Trace r = run(budget, n, steps);
    for (size_t s = 0; s < r.keep.size(); ++s) {
      std::vector<int> all(n + static_cast<int>(s));
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
      for (const auto& k : r.keep[s]) EXPECT_EQ(k, all) << "hook " << s << " evicted";
    }
  }
}

// Law 2 (a decode-evicting policy): no head above the budget after prefill and after any step,
// every head exactly at it here (the prompt is longer), for budgets down to 1 (recent 1).
TEST(PromptHeavyLaws, NoHeadAboveTheBudget) {
  for (const int budget : {1, 2, 3, 7, 16}) {
    for (const char* hf : {"0", "0.5", "0.9"}) {
      SCOPED_TRACE(testing::Message() << "budget " << budget << " heavy_fraction " << hf);
      const Trace r = run(budget, 23, 12, {{"heavy_fraction", hf}});
      EXPECT_EQ(r.max_len, budget);
      for (const auto& hook : r.keep) {
        for (const auto& k : hook) EXPECT_EQ(static_cast<int>(k.size()), budget);
      }
      // The recent window: the last `recent` positions are always there.
      const int recent = budget - static_cast<int>(budget * std::stod(hf));
      const std::vector<int>& last = r.keep.back()[0];
      for (int i = 0; i < recent; ++i) EXPECT_EQ(last[budget - 1 - i], 23 + 12 - 1 - i);
    }
  }
}

// Law 5: the same run twice, and a fork of the policy after prefill, decide the same.
TEST(PromptHeavyLaws, Deterministic) {
  const Trace a = run(9, 40, 15), b = run(9, 40, 15), c = run(9, 40, 15, {}, true);
  EXPECT_EQ(a.keep, b.keep);
  EXPECT_EQ(a.keep, c.keep);
}

TEST(PromptHeavy, Options) {
  const PolicyInfo& info = example();
  EXPECT_EQ(info.name, "prompt_heavy");
  ASSERT_EQ(info.params.size(), 2u);
  EXPECT_EQ(info.params[0].name, "heavy_fraction");
  EXPECT_EQ(info.params[0].default_value, "0.5");
  EXPECT_EQ(info.params[1].name, "gqa_reduce");
  EXPECT_EQ(info.params[1].choices, (std::vector<std::string>{"mean", "max"}));
  EXPECT_THROW(make(5, {{"heavy_fraction", "1"}}), Error);  // no recent window
  EXPECT_NO_THROW(make(1, {{"heavy_fraction", "0.99"}}));   // floor(0.99) = 0: recent 1
  EXPECT_THROW(make(5, {{"gqa_reduce", "median"}}), Error);
  EXPECT_THROW(make(5, {{"window", "4"}}), Error);  // not an option of this policy
  EXPECT_THROW(make(0), Error);                     // make_policy's budget check
}

// The registry: built-ins first, extras after them, a clash named with both sides.
PolicyInfo extra_a() { return {"extra_a", "", {}, prompt_heavy_policy_info().make}; }
PolicyInfo extra_h2o() { return {"h2o", "", {}, prompt_heavy_policy_info().make}; }
PolicyInfo extra_bad_name() { return {"Bad Name", "", {}, prompt_heavy_policy_info().make}; }
PolicyInfo extra_no_make() { return {"extra_b", "", {}, nullptr}; }

std::string error_of(std::span<const ExtraPolicy> extras) {
  try {
    append_extra_policies({full_policy_info(), h2o_policy_info()}, extras);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ExtraPolicies, AppendedAfterTheBuiltInsInOrder) {
  const ExtraPolicy extras[] = {{"/x/extra_a.cc", &extra_a},
                                {"/x/prompt_heavy.cc", &prompt_heavy_policy_info}};
  const std::vector<PolicyInfo> t =
      append_extra_policies({full_policy_info(), h2o_policy_info()}, extras);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].name, "full");
  EXPECT_EQ(t[1].name, "h2o");
  EXPECT_EQ(t[2].name, "extra_a");
  EXPECT_EQ(t[3].name, "prompt_heavy");
  EXPECT_EQ(append_extra_policies({full_policy_info()}, {}).size(), 1u);
}

TEST(ExtraPolicies, ClashesAndBadEntriesNameTheFile) {
  const ExtraPolicy builtin_clash[] = {{"/x/my_h2o.cc", &extra_h2o}};
  std::string msg = error_of(builtin_clash);
  EXPECT_NE(msg.find("/x/my_h2o.cc"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'h2o'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("built-in"), std::string::npos) << msg;
  const ExtraPolicy twice[] = {{"/x/extra_a.cc", &extra_a}, {"/y/extra_a.cc", &extra_a}};
  msg = error_of(twice);
  EXPECT_NE(msg.find("/y/extra_a.cc"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/x/extra_a.cc"), std::string::npos) << msg;
  const ExtraPolicy bad[] = {{"/x/bad.cc", &extra_bad_name}};
  EXPECT_NE(error_of(bad).find("snake_case"), std::string::npos) << error_of(bad);
  const ExtraPolicy no_make[] = {{"/x/no_make.cc", &extra_no_make}};
  EXPECT_NE(error_of(no_make).find("/x/no_make.cc"), std::string::npos);
}

// This build's registry: the built-ins, then exactly the extras CMake listed (none by default),
// each found by name.
TEST(ExtraPolicies, RegistryEndsWithThisBuildsExtras) {
  const std::vector<PolicyInfo>& reg = policy_registry();
  const std::span<const ExtraPolicy> extras = extra_policies();
  ASSERT_GE(reg.size(), extras.size() + 14);  // the 14 built-ins of registry.cc
  for (size_t i = 0; i < extras.size(); ++i) {
    const PolicyInfo& e = reg[reg.size() - extras.size() + i];
    EXPECT_EQ(e.name, extras[i].info().name) << extras[i].source;
    EXPECT_EQ(find_policy(e.name), &e);
  }
}

}  // namespace
}  // namespace kvb::policies
