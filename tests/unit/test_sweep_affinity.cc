// Prefix-affine hand-out of bundles (harness/sweep_affinity.h): prefix chains compare whole
// 64-token blocks, and an asking worker gets the bundle that shares the most blocks with its
// recent prompts, else the longest-first order, every bundle exactly once. Sequences below are
// worked by hand from the rules in the header.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "harness/sweep_affinity.h"

namespace kvb::harness {
namespace {

// A prompt of whole blocks: block letter c is 64 ids of value c.
std::vector<int32_t> blocks(const std::string& letters) {
  std::vector<int32_t> ids;
  for (char c : letters) ids.insert(ids.end(), kPrefixBlock, static_cast<int32_t>(c));
  return ids;
}

TEST(PrefixChain, ComparesWholeBlocksOnly) {
  EXPECT_TRUE(prefix_chain(std::vector<int32_t>(63, 1)).empty());  // no whole block
  std::vector<int32_t> a = blocks("ab"), b = blocks("ab");
  b[70] = 99;  // inside the second block
  const std::vector<uint64_t> ca = prefix_chain(a), cb = prefix_chain(b);
  ASSERT_EQ(ca.size(), 2u);
  ASSERT_EQ(cb.size(), 2u);
  EXPECT_EQ(ca[0], cb[0]);
  EXPECT_NE(ca[1], cb[1]);
  // Entry d holds the whole prefix: the same block after different ones differs.
  EXPECT_NE(prefix_chain(blocks("xb"))[1], ca[1]);
  // A partial last block is not compared.
  std::vector<int32_t> c = blocks("ab");
  c.resize(c.size() + 10, 7);
  EXPECT_EQ(prefix_chain(c), ca);
  EXPECT_EQ(prefix_chain(blocks(std::string(600, 'q'))).size(), static_cast<size_t>(kPrefixBlocks));
}

// Two families of prompts, A and X; the longest-first order interleaves them.
//   0: abcdefgh  1: abcdefqr  2: xyzwvut  3: xyzwvr  4: abcds  5: xyzw  6: abc  (6 shares only
//   3 blocks with the A prompts, fewer than kMinSharedBlocks)
std::vector<std::vector<uint64_t>> family_chains() {
  std::vector<std::vector<uint64_t>> c;
  for (const char* p : {"abcdefgh", "abcdefqr", "xyzwvut", "xyzwvr", "abcds", "xyzw", "abc"}) {
    c.push_back(prefix_chain(blocks(p)));
  }
  return c;
}

TEST(PrefixAffinity, AWorkerGetsTheBundleThatSharesMostWithItsRecentPrompts) {
  PrefixAffinity a({0, 1, 2, 3, 4, 5, 6}, family_chains());
  EXPECT_EQ(a.next(1), 0);  // nothing run yet: the order
  EXPECT_EQ(a.next(1), 1);  // shares abcdef (6 blocks) with 0
  EXPECT_EQ(a.next(1), 4);  // abcd with 0 and 1, ahead of 2 in the order
  EXPECT_EQ(a.next(2), 2);  // worker 2 has run nothing: the order's first left
  // No A prompt left that shares 4 blocks (6 shares 3). 3 and 5 share xyzwv and xyzw with
  // worker 2's 2, whose store serves them; 6 shares nothing with worker 2: the cold start
  // falls there (before 2026-12-06 the order gave worker 1 bundle 3, which then ran cold).
  EXPECT_EQ(a.next(1), 6);
  EXPECT_EQ(a.next(2), 3);  // xyzwv with 2
  EXPECT_EQ(a.left(), 1u);
  EXPECT_EQ(a.next(2), 5);  // xyzw with 2 and 3
  EXPECT_EQ(a.next(1), -1);
  EXPECT_EQ(a.next(2), -1);
}

// A bundle that another worker's recent prompts share more of is left to that worker, even when
// the asking worker shares kMinSharedBlocks with it; a worker with nothing of its own starts
// cold where no other worker's store would have served.
TEST(PrefixAffinity, ABundleStaysWithTheWorkerThatSharesMost) {
  std::vector<std::vector<uint64_t>> c;
  //  0: hhhhA  1: hhhhhhhB  2: hhhhhhhC  3: hhhhD
  for (const char* p : {"hhhhA", "hhhhhhhB", "hhhhhhhC", "hhhhD"}) {
    c.push_back(prefix_chain(blocks(p)));
  }
  PrefixAffinity a({1, 0, 2, 3}, c);
  EXPECT_EQ(a.next(1), 1);  // the order
  // Worker 2 has nothing of its own. Worker 1's 1 shares 7 blocks with 2 and 4 with 0 and 3:
  // the fewest, and 0 is first in the order.
  EXPECT_EQ(a.next(2), 0);
  // Worker 2 shares hhhh (4 blocks) with 2 and 3, but worker 1 shares 7 with 2: 2 is left to
  // worker 1, and 3 (4 blocks with each worker: a tie is the asking worker's) goes to worker 2.
  // Before 2026-12-06 worker 2 got 2, the earlier in the order.
  EXPECT_EQ(a.next(2), 3);
  EXPECT_EQ(a.next(1), 2);  // hhhhhhh with 1
  EXPECT_EQ(a.next(1), -1);
}

TEST(PrefixAffinity, LongestFirstOrderWhenNothingIsShared) {
  std::vector<std::vector<uint64_t>> c;
  for (const char* p : {"abcd", "efgh", "ijkl", "mnop"}) c.push_back(prefix_chain(blocks(p)));
  PrefixAffinity a({2, 0, 3, 1}, c);
  EXPECT_EQ(a.next(1), 2);
  EXPECT_EQ(a.next(2), 0);
  EXPECT_EQ(a.next(1), 3);
  EXPECT_EQ(a.next(1), 1);
  EXPECT_EQ(a.next(2), -1);
}

// Among equal depths the worker's latest prompt decides; within one prefix, the order.
TEST(PrefixAffinity, TiesGoToTheLatestPromptThenTheOrder) {
  std::vector<std::vector<uint64_t>> c;
  for (const char* p : {"aaaa1", "bbbb1", "aaaa2", "bbbb2", "bbbb3"}) {
    c.push_back(prefix_chain(blocks(p)));
  }
  PrefixAffinity a({0, 1, 2, 3, 4}, c);
  EXPECT_EQ(a.next(7), 0);
  EXPECT_EQ(a.next(8), 1);
  EXPECT_EQ(a.next(8), 3);  // bbbb with 1 (4 blocks), ahead of 4 in the order
  EXPECT_EQ(a.next(7), 2);  // aaaa with 0
  EXPECT_EQ(a.next(7), 4);  // nothing shared: the order
}

// Whatever the asking pattern, every bundle of the order is handed out exactly once.
TEST(PrefixAffinity, HandsOutEveryBundleOnce) {
  std::vector<std::vector<uint64_t>> c;
  std::vector<int> order;
  for (int i = 0; i < 60; ++i) {
    std::string p(static_cast<size_t>(4 + i % 5), static_cast<char>('a' + i % 3));
    p += static_cast<char>('A' + i % 26);
    c.push_back(prefix_chain(blocks(p)));
    order.push_back((i * 7) % 60);
  }
  PrefixAffinity a(order, c);
  std::set<int> seen;
  for (int step = 0; step < 60; ++step) {
    const int b = a.next(step % 3 == 0 ? 1 : step % 3 == 1 ? 2 : 5);
    ASSERT_GE(b, 0);
    EXPECT_TRUE(seen.insert(b).second) << b;
  }
  EXPECT_EQ(a.next(1), -1);
  EXPECT_EQ(seen.size(), 60u);
}

// peek() says what next() would hand out without handing it out; take() hands out that one (or
// another left), and shared_blocks / last_shared_blocks say what the worker's recent prompts
// hold of a bundle.
TEST(PrefixAffinity, PeekAndTakeAreNextInTwoSteps) {
  std::vector<std::vector<uint64_t>> c;
  for (const char* p : {"hhhhA", "hhhhhhhB", "hhhhhhhC", "hhhhD"}) {
    c.push_back(prefix_chain(blocks(p)));
  }
  PrefixAffinity a({1, 0, 2, 3}, c);
  EXPECT_EQ(a.peek(1), 1);
  EXPECT_EQ(a.peek(1), 1);
  EXPECT_EQ(a.left(), 4u);
  a.take(1, 1);
  EXPECT_EQ(a.last_shared_blocks(), 0);
  EXPECT_EQ(a.shared_blocks(1, 2), 7);
  EXPECT_EQ(a.shared_blocks(1, 0), 4);
  EXPECT_EQ(a.shared_blocks(2, 2), 0);
  EXPECT_EQ(a.peek(1), 2);  // hhhhhhh with 1
  a.take(1, 3);             // another one left
  EXPECT_EQ(a.last_shared_blocks(), 4);
  EXPECT_EQ(a.left(), 2u);
  EXPECT_THROW(a.take(2, 3), Error);  // handed out already
  EXPECT_EQ(a.next(1), 2);
  EXPECT_EQ(a.last_shared_blocks(), 7);
  EXPECT_EQ(a.next(2), 0);
  EXPECT_EQ(a.peek(2), -1);
}

}  // namespace
}  // namespace kvb::harness
