// Which bundle an idle worker gets next under mpirun (DESIGN.md "Scheduling"): bundles go longest
// prompt first, except that a worker is handed the bundle whose prompt begins with the most
// tokens of a prompt it ran lately, so that its prefix store (prefix_cache_mib) serves it. One
// process meets every prompt in one store; without this, N workers each met a share of a
// haystack's depths and started more prefills cold (the quickstart under `mpirun -np 3`: 121
// units reused a prefix, against 143 in one process). Only who runs what changes: every unit's
// results are its own full prefill's, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <unordered_map>
#include <vector>

namespace kvb::harness {

// A prompt's prefix as chained hashes of its whole blocks of kPrefixBlock token ids: entry d is
// the hash of the first (d + 1) * kPrefixBlock ids, so two prompts share exactly as many leading
// entries as whole blocks of leading tokens (up to hash collisions, which cost only a worse
// choice). At most kPrefixBlocks entries (the rest of a long prompt is not compared).
constexpr int kPrefixBlock = 64;
constexpr int kPrefixBlocks = 512;
std::vector<uint64_t> prefix_chain(const std::vector<int32_t>& ids);

class PrefixAffinity {
 public:
  // A worker prefers a bundle that shares at least this many whole blocks with its recent
  // prompts (256 tokens: an instruction line common to every sample is not worth leaving the
  // longest-first order for).
  static constexpr int kMinSharedBlocks = 4;
  // The prompts a worker ran that count as its store's content: its most recent ones.
  static constexpr size_t kHistory = 32;

  // order: the bundles to hand out (indices into chains), in the order they go when none shares
  // a prefix with the asking worker's recent prompts. chains: prefix_chain of each bundle's
  // prompt, by bundle index.
  PrefixAffinity(std::vector<int> order, std::vector<std::vector<uint64_t>> chains);

  // The bundle `worker` runs next: the one that shares the most whole prefix blocks (at least
  // kMinSharedBlocks) with one of the worker's kHistory most recent bundles (among equal
  // depths, through its latest; within a prefix, the earliest in order); else the earliest left
  // in order. -1 when none is left.
  int next(int worker);
  size_t left() const { return left_; }

 private:
  struct Bucket {
    std::vector<int> bundles;  // in order
    size_t head = 0;           // bundles before it are taken
  };
  // The earliest bundle left in the bucket of chain hash h, or -1.
  int first_left(uint64_t h);

  std::vector<int> order_;
  std::vector<std::vector<uint64_t>> chains_;
  std::vector<bool> taken_;  // by bundle index
  size_t cursor_ = 0;        // order_ before it is taken
  size_t left_ = 0;
  std::unordered_map<uint64_t, Bucket> buckets_;  // chain hash at any depth -> bundles
  std::map<int, std::deque<int>> history_;        // worker -> its bundles, the latest first
};

}  // namespace kvb::harness
