// ThinK (POLICIES.md `think`; kvpress ThinKPress): the key channels a head zeroes, on hand-computed
// cases (the query energy of the window's queries averaged over the GQA group, times the key
// energy of the head's slots; the lowest int(head_dim x r) go, equal scores the lower channel
// first), how a cache applies and counts them, and the option's refusals.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"

namespace kvb::policies {
namespace {

using kernels::EvictionPlan;
using kernels::KvCache;
using V = std::vector<int32_t>;

PolicyConfig config(const std::string& name, int budget, std::map<std::string, std::string> opts) {
  PolicyConfig c;
  c.name = name;
  c.kv_budget = budget;
  c.shape = {.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4,
             .max_seq_len = 64};
  c.options = PolicyOptions(std::move(opts));
  return c;
}

// Two KV heads of two slots each (positions 0, 1), head_dim 4:
//   head 0: k0 = (1, 2, 0, 1), k1 = (1, 0, 2, 1): key energy (1, 2, 2, 1);
//   head 1: k0 = (0, 3, 1, 1), k1 = (2, 1, 1, 1): key energy (2, 5, 1, 1).
KvCache two_heads() {
  KvCache cache({.num_layers = 1, .num_kv_heads = 2, .head_dim = 4}, 8);
  const std::vector<std::vector<float>> k0 = {{1, 2, 0, 1}, {1, 0, 2, 1}};
  const std::vector<std::vector<float>> k1 = {{0, 3, 1, 1}, {2, 1, 1, 1}};
  const std::vector<float> v = {1, 1, 1, 1};
  for (int s = 0; s < 2; ++s) {
    cache.append(0, 0, k0[s].data(), v.data(), s);
    cache.append(0, 1, k1[s].data(), v.data(), s);
  }
  cache.advance_position(2);
  return cache;
}

// The last two queries of the four query heads ([2, 4, 4]; heads 0 and 1 read KV head 0):
//   q head 0: (1, 1, 1, 1), (1, 1, 1, 3): energy over both (1, 1, 1, 5); the last alone (1,1,1,9)
//   q head 1: (2, 0, 1, 0), (0, 0, 1, 0): (2, 0, 1, 0); (0, 0, 1, 0)
//   q head 2: (1, 0, 2, 1), (1, 0, 0, 1): (1, 0, 2, 1)
//   q head 3: (1, 1, 0, 1), (1, 1, 0, 1): (1, 1, 0, 1)
const std::vector<float> kQueries = {
    1, 1, 1, 1, 2, 0, 1, 0, 1, 0, 2, 1, 1, 1, 0, 1,   // t = 0
    1, 1, 1, 3, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1};  // t = 1

LayerStats stats() {
  LayerStats st;
  st.layer = 0;
  st.n_new = 2;
  st.num_heads = 4;
  st.last_queries = kQueries.data();
  st.n_queries = 2;
  st.block_end = 2;
  return st;
}

EvictionPlan channels_of(const Policy& p, const KvCache& cache) {
  EvictionPlan plan;
  plan.reset(0, 2);
  p.on_prefill_channels(stats(), cache, plan);
  return plan;
}

// Scores over the window of two: head 0 (1.5, 0.5, 1, 2.5) x (1, 2, 2, 1) = (1.5, 1, 2, 2.5);
// head 1 (1, 0.5, 1, 1) x (2, 5, 1, 1) = (2, 2.5, 1, 1).
TEST(Think, ZeroesTheLowestScoringChannelsOfEachHead) {
  KvCache cache = two_heads();
  const auto half = make_policy(config("think", 0, {{"key_channel_compression_ratio", "0.5"},
                                                    {"window_size", "2"}}));
  ASSERT_TRUE(half->prunes_key_channels());
  const EvictionPlan plan = channels_of(*half, cache);
  EXPECT_EQ(plan.key_channels(0), (V{0, 1}));
  EXPECT_EQ(plan.key_channels(1), (V{2, 3}));
  EXPECT_FALSE(plan.changes_slots());
  // A quarter: one channel each; head 1's channels 2 and 3 tie at 1, the lower goes.
  const auto quarter = make_policy(config("snapkv", 2, {{"think", "0.25"}, {"think_window", "2"}}));
  const EvictionPlan q = channels_of(*quarter, cache);
  EXPECT_EQ(q.key_channels(0), (V{1}));
  EXPECT_EQ(q.key_channels(1), (V{2}));
  // int(4 x 0.2) = 0: nothing.
  const auto none = make_policy(config("snapkv", 2, {{"think", "0.2"}}));
  EXPECT_FALSE(channels_of(*none, cache).changes_any());
}

// The window is the prompt's last think_window queries: the last alone makes head 0's query
// energy (0.5, 0.5, 1, 4.5), its scores (0.5, 1, 2, 4.5): channel 0 goes instead of 1.
TEST(Think, ReadsTheLastWindowQueries) {
  KvCache cache = two_heads();
  const auto one = make_policy(config("think", 0, {{"key_channel_compression_ratio", "0.25"},
                                                   {"window_size", "1"}}));
  EXPECT_EQ(channels_of(*one, cache).key_channels(0), (V{0}));
  // The default window (32) clamps to the two queries the block has.
  const auto deflt = make_policy(config("think", 0, {{"key_channel_compression_ratio", "0.25"}}));
  EXPECT_EQ(channels_of(*deflt, cache).key_channels(0), (V{1}));
  EXPECT_EQ(deflt->prefill_stats(100).last_queries, 32);
  EXPECT_EQ(make_policy(config("snapkv", 2, {}))->prefill_stats(100).last_queries, 0);
}

TEST(Think, TheCacheZeroesAndCountsThePrunedChannels) {
  KvCache cache = two_heads();
  const auto half = make_policy(config("think", 0, {{"key_channel_compression_ratio", "0.5"},
                                                    {"window_size", "2"}}));
  const size_t before = cache.logical_bytes();
  cache.apply(channels_of(*half, cache));
  const kernels::LayerKvView v = cache.layer(0);
  EXPECT_EQ(std::vector<float>(v.key(0, 0), v.key(0, 0) + 4), (std::vector<float>{0, 0, 0, 1}));
  EXPECT_EQ(std::vector<float>(v.key(0, 1), v.key(0, 1) + 4), (std::vector<float>{0, 0, 2, 1}));
  EXPECT_EQ(std::vector<float>(v.key(1, 0), v.key(1, 0) + 4), (std::vector<float>{0, 3, 0, 0}));
  EXPECT_EQ(std::vector<float>(v.value(1, 0), v.value(1, 0) + 4),
            (std::vector<float>{1, 1, 1, 1}));  // values stay
  EXPECT_EQ(cache.logical_bytes(), before);     // the slots' bytes; the pruned ones apart:
  EXPECT_EQ(cache.pruned_key_channels(0, 0), 2);
  EXPECT_EQ(cache.pruned_key_elements(), 2u * 2 * 2);  // 2 heads x 2 slots x 2 channels
  // A token after the prompt keeps its channels and is not counted.
  const std::vector<float> k = {5, 5, 5, 5};
  cache.append(0, 0, k.data(), k.data(), 2);
  cache.append(0, 1, k.data(), k.data(), 2);
  EXPECT_EQ(cache.channel_pruned_slots(0, 0), 2);
  EXPECT_EQ(cache.pruned_key_elements(), 8u);
  // Evicting a prompt slot (a victim) and then keeping a list count what stays.
  EvictionPlan evict;
  evict.reset(0, 2);
  evict.evict(0, 0);
  evict.keep(1, {1, 2});
  cache.apply(evict);
  EXPECT_EQ(cache.channel_pruned_slots(0, 0), 1);
  EXPECT_EQ(cache.channel_pruned_slots(0, 1), 1);
  EXPECT_EQ(cache.pruned_key_elements(), 4u);
  // Copies and forks carry the counts; a second pruning of a head is a bug.
  EXPECT_EQ(KvCache(cache).pruned_key_elements(), 4u);
  EXPECT_EQ(cache.fork(3).pruned_key_elements(), 4u);
  EvictionPlan again;
  again.reset(0, 2);
  again.zero_key_channels(0, {3}, 3);
  EXPECT_THROW(cache.apply(again), Error);
  cache.clear();
  EXPECT_EQ(cache.pruned_key_elements(), 0u);
}

TEST(Think, PlansKeepChannelsApartFromTokens) {
  EvictionPlan plan;
  plan.reset(0, 2);
  plan.keep(0, {0});
  EXPECT_THROW(plan.zero_key_channels(1, {0}, 2), Error);
  plan.reset(0, 2);
  plan.zero_key_channels(1, {0}, 2);
  EXPECT_TRUE(plan.changes_any());
  EXPECT_FALSE(plan.changes_slots());
  EXPECT_THROW(plan.evict(0, 0), Error);
  EXPECT_THROW(plan.zero_key_channels(1, {1}, 2), Error);  // decided twice
  // Channels must be increasing and below head_dim (checked when applied).
  KvCache cache = two_heads();
  plan.reset(0, 2);
  plan.zero_key_channels(0, {2, 1}, 2);
  EXPECT_THROW(cache.apply(plan), Error);
  plan.reset(0, 2);
  plan.zero_key_channels(0, {4}, 2);
  EXPECT_THROW(cache.apply(plan), Error);
}

TEST(Think, RefusesWhatCannotBeMeant) {
  auto refused = [](const std::string& name, std::map<std::string, std::string> o,
                    const std::string& says, int budget = 8) {
    try {
      make_policy(config(name, budgeted(name) ? budget : 0, std::move(o)));
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("full", {{"think", "0.5"}}, "policy think is full's tokens");
  refused("think", {{"think", "0.5"}}, "key_channel_compression_ratio and window_size");
  refused("think", {{"key_channel_compression_ratio", "1"}}, "[0, 1)");
  refused("snapkv", {{"think", "1"}}, "[0, 1)");
  refused("snapkv", {{"think", "-0.1"}}, "think");
  refused("streaming_llm", {{"think", "0.5"}, {"positions", "rolling"}}, "before RoPE");
  refused("h2o", {{"think", "0.5"}, {"prefill", "streaming"}}, "streams the prompt");
  refused("subgen", {{"think", "0.5"}}, "replaces attention");
  // positions: rerotate (KeyRerotationPress) is refused where nothing moves or keys are not
  // cached after RoPE at their positions; rolling stays streaming_llm's.
  refused("full", {{"positions", "rerotate"}}, "nothing to move");
  refused("think", {{"positions", "rerotate"}}, "nothing to move");
  refused("subgen", {{"positions", "rerotate"}}, "replaces attention");
  refused("h2o", {{"positions", "rerotate"}, {"prefill", "streaming"}}, "streams the prompt");
  refused("snapkv", {{"positions", "rolling"}}, "streaming_llm's option");
  refused("snapkv", {{"positions", "sideways"}}, "positions");
  PolicyConfig sliding = config("snapkv", 8, {{"positions", "rerotate"}});
  sliding.shape.sliding_layers = true;  // Gemma 3: the sweep's validation refuses it up front
  try {
    make_policy(sliding);
    ADD_FAILURE() << "rerotate on sliding-window layers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window layers"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(make_policy(config("snapkv", 8, {{"positions", "rerotate"}}))->rerotates());
  EXPECT_TRUE(make_policy(config("streaming_llm", 8, {{"positions", "rerotate"}}))->rerotates());
  EXPECT_FALSE(make_policy(config("streaming_llm", 8, {{"positions", "rerotate"}}))
                   ->rolling_positions());
  // think and full keep every token: no budget needed; the others still need one.
  EXPECT_NO_THROW(make_policy(config("think", 0, {})));
  EXPECT_FALSE(budgeted("think"));
  EXPECT_FALSE(budgeted("full"));
  EXPECT_TRUE(budgeted("snapkv"));
  refused("snapkv", {{"think", "0.5"}}, "--kv-budget", 0);
}

}  // namespace
}  // namespace kvb::policies
