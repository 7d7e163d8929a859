// Prefixes shared between an MPI sweep's workers (harness/sweep_prefix_share.h): the message
// framing, and which kept prefix rank 0 sends a worker before a bundle, worked by hand on small
// prefix chains (one entry per 64-token block).
#include <gtest/gtest.h>

#include "common/error.h"
#include "harness/sweep_prefix_share.h"

namespace kvb::harness {
namespace {

TEST(PrefixMessage, FramesAModelIndexAndTheBytesAfterIt) {
  const std::string body("KVB\0\nbytes", 10);
  const std::string m = prefix_message(7, body);
  EXPECT_TRUE(is_prefix_message(m));
  const PrefixMessage p = parse_prefix_message(m);
  EXPECT_EQ(p.model, 7);
  EXPECT_EQ(p.body, body);
  EXPECT_FALSE(is_prefix_message("[{\"unit_key\": 1}]"));
  EXPECT_FALSE(is_prefix_message("ready"));
  for (const std::string bad : {"prefix \n", "prefix x\n", "prefix -1\n", "prefix 1", "prefix 1 \n",
                                "prefix 99999999999999999999\nab"}) {
    EXPECT_THROW(parse_prefix_message(bad), Error) << bad;
  }
}

// Bundles' chains: 0 and 1 share 6 blocks, 0 and 2 share 3, 3 shares nothing with them, 4
// shares 8 blocks with 0.
std::vector<std::vector<uint64_t>> chains() {
  return {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
          {1, 2, 3, 4, 5, 6, 70, 80},
          {1, 2, 3, 40, 50, 60},
          {11, 12, 13, 14, 15},
          {1, 2, 3, 4, 5, 6, 7, 8, 90}};
}

TEST(SharedPrefixes, AWorkerGetsAnotherWorkersDeepestPrefixOnce) {
  SharedPrefixes s(chains(), 1 << 20);
  EXPECT_EQ(s.pick(2, 1, 0, 0), nullptr);  // nothing kept yet
  s.add(/*source=*/1, /*bundle=*/0, /*model=*/0, /*tokens=*/640, "m0");
  const std::string* p = s.pick(2, 1, 0, 0);  // 6 blocks shared
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, "m0");
  EXPECT_EQ(s.pick(2, 1, 0, 0), nullptr);  // sent to worker 2 already
  EXPECT_NE(s.pick(3, 1, 0, 5), nullptr);  // 6 > worker 3's own 5 blocks
  EXPECT_EQ(s.pick(4, 1, 0, 6), nullptr);  // worker 4's own prompts share as much
  EXPECT_EQ(s.pick(1, 1, 0, 0), nullptr);  // its own prefix
  EXPECT_EQ(s.pick(5, 1, 1, 0), nullptr);  // a bundle of another model
  EXPECT_EQ(s.pick(5, 2, 0, 0), nullptr);  // 3 blocks: below kMinShared (4)
  EXPECT_EQ(s.pick(5, 3, 0, 0), nullptr);  // nothing shared
  EXPECT_EQ(s.sent(), 2);
  EXPECT_EQ(s.sent_bytes(), 4u);
}

TEST(SharedPrefixes, DepthIsBoundByThePrefixTokensAndTheLatestOfEqualsWins) {
  SharedPrefixes s(chains(), 1 << 20);
  // Worker 1 kept 300 tokens of bundle 0 (4 whole blocks): bundle 4 shares 8 blocks with bundle
  // 0's prompt, but the prefix serves 4 of them.
  s.add(1, 0, 0, 300, "short");
  EXPECT_EQ(s.pick(2, 4, 0, 4), nullptr);
  ASSERT_NE(s.pick(3, 4, 0, 3), nullptr);
  // For bundle 4, bundle 1's prefix serves 6 blocks and bundle 0's two prefixes 8 each: the
  // deepest wins, the latest of equals first.
  s.add(2, 1, 0, 1000, "six");    // bundle 1 shares 6 blocks with bundle 4
  s.add(3, 0, 0, 1000, "eight");  // bundle 0 shares 8
  s.add(1, 0, 0, 1000, "eight too");
  const std::string* p = s.pick(5, 4, 0, 0);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, "eight too");
  p = s.pick(1, 4, 0, 0);  // worker 1's own are not sent back to it
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, "eight");
}

TEST(SharedPrefixes, KeepsTheLatestWithinItsBytes) {
  SharedPrefixes s(chains(), 10);
  s.add(1, 0, 0, 640, "aaaa");
  s.add(1, 0, 0, 640, "bbbb");
  s.add(1, 0, 0, 640, "cccc");  // 12 bytes: the oldest goes
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.bytes(), 8u);
  s.add(1, 0, 0, 640, std::string(11, 'x'));  // larger than the budget: not kept
  EXPECT_EQ(s.size(), 2u);
  const std::string* p = s.pick(2, 1, 0, 0);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, "cccc");
  p = s.pick(2, 4, 0, 0);  // worker 2 holds cccc now: the other
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, "bbbb");
  EXPECT_EQ(s.pick(2, 4, 0, 0), nullptr);
  SharedPrefixes off(chains(), 0);
  off.add(1, 0, 0, 640, "m");
  EXPECT_EQ(off.size(), 0u);
  EXPECT_EQ(off.pick(2, 1, 0, 0), nullptr);
  EXPECT_THROW(s.add(1, 9, 0, 640, "m"), Error);  // no such bundle
}

TEST(SharedPrefixes, BestBlocksIsWhatPickWouldSendWithoutSendingIt) {
  SharedPrefixes s(chains(), 1 << 20);
  EXPECT_EQ(s.best_blocks(2, 1, 0), 0);
  s.add(1, 0, 0, 640, "m0");
  EXPECT_EQ(s.best_blocks(2, 1, 0), 6);
  EXPECT_EQ(s.best_blocks(2, 1, 0), 6);  // still not sent
  EXPECT_EQ(s.best_blocks(2, 2, 0), 0);  // 3 blocks: below kMinShared
  EXPECT_EQ(s.best_blocks(1, 1, 0), 0);  // its own
  EXPECT_EQ(s.sent(), 0);
  ASSERT_NE(s.pick(2, 1, 0, 0), nullptr);
  EXPECT_EQ(s.best_blocks(2, 1, 0), 0);  // sent: worker 2 holds it
}

TEST(SharedPrefixes, CommonBlocksAndWhenWaitingIsWorthIt) {
  const auto c = chains();
  EXPECT_EQ(common_blocks(c[0], c[1]), 6);
  EXPECT_EQ(common_blocks(c[0], c[4]), 8);
  EXPECT_EQ(common_blocks(c[0], c[3]), 0);
  EXPECT_EQ(common_blocks(c[0], c[0]), 10);
  EXPECT_EQ(common_blocks(c[1], {}), 0);
  // 15 blocks more (960 tokens) at 10 ms a token save 9.6 s: a bundle in flight expected to end
  // in 5 s is worth waiting for, one expected in 10 s is not.
  EXPECT_TRUE(worth_waiting(5000, 10, 31, 46));
  EXPECT_FALSE(worth_waiting(10000, 10, 31, 46));
  EXPECT_TRUE(worth_waiting(-200, 10, 31, 46));  // overdue: ends any moment
  // Fewer than kMinShared (4) blocks more, or nothing measured yet: no wait.
  EXPECT_FALSE(worth_waiting(0, 10, 31, 34));
  EXPECT_TRUE(worth_waiting(0, 10, 31, 35));
  EXPECT_FALSE(worth_waiting(0, 0, 0, 46));
  EXPECT_FALSE(worth_waiting(0, 10, 46, 31));
}

}  // namespace
}  // namespace kvb::harness
