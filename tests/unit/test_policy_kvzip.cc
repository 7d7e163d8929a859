// Tests `kvzip` (kvpress KVzipPress; kernels/policies/kvzip.cc) and its op replay_attention_max
// against hand-computed cases: the op's softmax over the sinks, the chunk and the pass's own
// earlier keys; the reconstruction passes' tokens and chunks; the allocation across layers (and
// per layer with layerwise) with the sinks kept and ties taking the older slot first.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/eviction_plan.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policies.h"
#include "run_kvbench.h"

namespace kvb::policies {
namespace {

using V = std::vector<int32_t>;
using Opts = std::map<std::string, std::string>;
constexpr int kD = 4;

// One layer, one head: `keys` appended at positions 0, 1, ...
void append_keys(kernels::KvCache& cache, int layer, const std::vector<std::vector<float>>& keys) {
  const std::vector<float> v(kD, 0.0f);
  for (const auto& k : keys) {
    cache.append(layer, 0, k.data(), v.data(), cache.length(layer, 0));
  }
}

TEST(KvZipOps, ReplayAttentionMaxIsTheSoftmaxOverSinksChunkAndTheBlocksEarlierKeys) {
  // Slot 0 a sink, slots 1-2 the chunk, slots 3-4 the pass's two queries' own keys.
  kernels::KvCache cache({1, 1, kD}, 8);
  append_keys(cache, 0, {{0, 0, 0, 0}, {1, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 1, 0, 0}});
  // Query 0 (2, 0, 0, 0): logits (dot / sqrt(4)) 0, 1, 0 and its own key 0. Query 1 (0, 2, 0, 0):
  // 0, 0, 0, then 0 and 1 (its own key).
  const std::vector<float> q = {2, 0, 0, 0, 0, 2, 0, 0};
  LayerStats st;
  st.layer = 0;
  st.num_heads = 1;
  st.n_new = 2;
  st.n_queries = 2;
  st.last_queries = q.data();
  kernels::ops::CpuPolicyOps ops;
  std::unique_ptr<SlotRows> out = ops.make_rows(SlotType::kF32, 1, 1);
  ops.replay_attention_max(*out, 0, cache, 0, st, /*sinks=*/1, /*first=*/1, /*count=*/2);
  // e^(l - max) in f32, their sum in f64 in 8 lanes (here one key each: ((s0 + s1) + (s2 + s3))
  // + ((s4 + s5) + (s6 + s7))), p = e / sum.
  const float e1 = std::exp(-1.0f);
  const double z0 = (static_cast<double>(e1) + 1.0) + (static_cast<double>(e1) + e1);  // query 0
  const double z1 = ((static_cast<double>(e1) + e1) + (static_cast<double>(e1) + e1)) + 1.0;
  const float slot1 = std::max(static_cast<float>(1.0 / z0), static_cast<float>(e1 / z1));
  const float slot2 = std::max(static_cast<float>(e1 / z0), static_cast<float>(e1 / z1));
  EXPECT_EQ(ops.read_f32(*out, 0, 0), (std::vector<float>{slot1, slot2}));
  EXPECT_GT(slot1, 0.47f);  // e / (e + 3)
  // Without the sink, query 0's row is 1, 0, 0 over the chunk and its key.
  ops.replay_attention_max(*out, 0, cache, 0, st, 0, 1, 2);
  const double y0 = (1.0 + e1) + static_cast<double>(e1);
  EXPECT_EQ(ops.read_f32(*out, 0, 0)[0], static_cast<float>(1.0 / y0));
  // A chunk that runs into the block's keys is refused.
  EXPECT_THROW(ops.replay_attention_max(*out, 0, cache, 0, st, 1, 1, 3), Error);
}

std::unique_ptr<Policy> make(int budget, const Opts& opts, int layers = 2) {
  PolicyConfig c;
  c.name = "kvzip";
  c.kv_budget = budget;
  c.shape = {layers, /*num_heads=*/1, /*num_kv_heads=*/1, kD, /*max_seq_len=*/0};
  c.options = PolicyOptions(opts);
  return make_policy(c);
}

TEST(KvZip, PassesRepeatEachChunkAfterItsInstructionAndTheTail) {
  std::unique_ptr<Policy> p = make(2, {{"chunk_size", "3"}});
  ASSERT_TRUE(p->reconstructs_context());
  p->set_replay_prompt({.prefix = 2, .first = {100}, .next = {200, 201}, .suffix = {300}});
  const V prompt = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  p->begin_sequence(9);
  const std::vector<ReplayPass> passes = p->replay_passes(prompt);
  ASSERT_EQ(passes.size(), 3u);  // the template's head (0, 1) is not repeated
  EXPECT_EQ(passes[0].tokens, (V{100, 300, 2, 3, 4}));
  EXPECT_EQ(passes[1].tokens, (V{200, 201, 2, 3, 4, 300, 5, 6, 7}));  // the previous chunk's end
  EXPECT_EQ(passes[2].tokens, (V{200, 201, 5, 6, 7, 300, 8}));
  EXPECT_EQ((V{passes[0].first, passes[0].count, passes[1].first, passes[2].count}),
            (V{2, 3, 5, 1}));
  // A prompt within the budget loses nothing: no pass is run.
  EXPECT_TRUE(make(9, {})->replay_passes(prompt).empty());
  // positions: rerotate and think do not follow the reconstruction.
  EXPECT_THROW(make(2, {{"positions", "rerotate"}}), Error);
  EXPECT_THROW(make(2, {{"think", "0.5"}}), Error);
  EXPECT_THROW(make(2, {{"n_sink", "0"}}), Error);
}

// Two layers of one head, a 5-token prompt repeated in one pass of its 5 tokens (no instruction).
// Layer 0's queries are zero: every chunk slot gets 1/6 from the first query (sink 0 excluded:
// the first chunk has none). Layer 1's queries all point at slot 2 (logit 4): slot 2 scores about
// 1, the others 1/(e^4 + 5) at most. Budget 3: 2 x (5 - 3) = 4 slots leave, slot 0 (n_sink 1) never.
std::vector<V> decide(const Opts& opts) {
  std::unique_ptr<Policy> p = make(3, opts);
  kernels::KvCache cache({2, 1, kD}, 12);
  const std::vector<std::vector<float>> prompt_keys = {
      {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  p->begin_sequence(5);
  for (int l = 0; l < 2; ++l) {
    append_keys(cache, l, prompt_keys);
    LayerStats st;
    st.layer = l;
    prefill_layer(*p, st, cache);
  }
  cache.advance_position(5);
  const V prompt = {10, 11, 12, 13, 14};
  const std::vector<ReplayPass> passes = p->replay_passes(prompt);
  EXPECT_EQ(passes.size(), 1u);
  p->begin_replay(passes[0]);
  std::vector<float> zero(5 * kD, 0.0f), aligned(5 * kD, 0.0f);
  for (int t = 0; t < 5; ++t) aligned[t * kD] = 8;
  for (int l = 0; l < 2; ++l) {
    append_keys(cache, l, std::vector<std::vector<float>>(5, std::vector<float>(kD, 0.0f)));
    LayerStats st;
    st.layer = l;
    st.num_heads = 1;
    st.n_new = 5;
    st.n_queries = 5;
    st.last_queries = l == 0 ? zero.data() : aligned.data();
    prefill_layer(*p, st, cache);
    EXPECT_EQ(cache.length(l, 0), 5) << "the pass's slots leave after its layer";
  }
  p->end_replay();
  std::vector<V> kept;
  for (int l = 0; l < 2; ++l) {
    kernels::EvictionPlan plan;
    plan.reset(l, 1);
    p->on_replayed_layer(l, cache, plan);
    cache.apply(plan);
    const int32_t* pos = cache.layer(l).position(0);
    kept.push_back(V(pos, pos + cache.length(l, 0)));
  }
  return kept;
}

TEST(KvZip, TheLowestScoresOfEveryLayerLeaveAndTheSinksStay) {
  // Whole model: layer 1's three small scores and one of layer 0's equal 1/6 (the oldest, 1).
  EXPECT_EQ(decide({{"n_sink", "1"}}), (std::vector<V>{{0, 2, 3, 4}, {0, 2}}));
  // Layerwise: two per layer; equal scores take the older slot first.
  EXPECT_EQ(decide({{"n_sink", "1"}, {"layerwise", "true"}}),
            (std::vector<V>{{0, 3, 4}, {0, 2, 4}}));
}

// `kvbench ls policies` documents each policy's own options and the common ones it takes: kvzip
// and subgen refuse think and positions (PolicyInfo::composes), so they are not listed there;
// finch lists its own positions default (rerotate); snapkv lists the common ones.
TEST(KvZip, LsListsOnlyTheOptionsAPolicyTakes) {
  std::string out;
  ASSERT_EQ(testing::kvbench({"ls", "policies"}, &out), 0);
  auto block = [&](const std::string& name) {
    const size_t at = out.find("\n" + name + "\n");
    EXPECT_NE(at, std::string::npos) << name;
    if (at == std::string::npos) return std::string();
    size_t end = at + name.size() + 2;
    while (end < out.size()) {  // the block's lines are indented; the next policy's name is not
      const size_t nl = out.find('\n', end);
      if (nl == std::string::npos || out[end] != ' ') break;
      end = nl + 1;
    }
    return out.substr(at, end - at);
  };
  for (const std::string name : {"kvzip", "subgen"}) {
    const std::string b = block(name);
    EXPECT_EQ(b.find("--policy-opt think="), std::string::npos) << b;
    EXPECT_EQ(b.find("--policy-opt positions="), std::string::npos) << b;
    EXPECT_NE(b.find("--policy-opt gqa="), std::string::npos) << b;
  }
  EXPECT_NE(block("finch").find("--policy-opt positions=rerotate"), std::string::npos);
  EXPECT_NE(block("snapkv").find("--policy-opt think=0"), std::string::npos);
  EXPECT_NE(block("snapkv").find("--policy-opt positions=true"), std::string::npos);
}

}  // namespace
}  // namespace kvb::policies
