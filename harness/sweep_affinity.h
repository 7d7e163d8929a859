// Which bundle an idle worker gets next under mpirun (DESIGN.md "Scheduling"): bundles go longest
// prompt first, except that a worker is handed the bundle whose prompt begins with the most
// tokens of a prompt it ran lately, so that its prefix store (prefix_cache_mib) serves it. One
// process meets every prompt in one store; without this, N workers each met a share of a
// haystack's depths and started more prefills cold (the quickstart under `mpirun -np 3`: 121
// units reused a prefix, against 143 in one process; 132 and 157,861 tokens with this
// affinity, 168,740 since a worker also leaves to another the bundles that worker's store
// serves better, 187,913 with the workers' prefixes passed between them, sweep_prefix_share.h;
// one process: 190,685). Only who runs what changes: every unit's results are its own full
// prefill's, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>
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

  // The bundle `worker` runs next:
  // - the one that shares the most whole prefix blocks (at least kMinSharedBlocks) with one of
  //   the worker's kHistory most recent bundles, and no more with another worker's (among equal
  //   depths, through its latest; then the earliest in order);
  // - else, the one that shares the fewest blocks with any other worker's recent bundles, the
  //   earliest in order among those: a bundle another worker's store can serve is left to it,
  //   and the cold start falls where it costs least (the quickstart under mpirun -np 3: two
  //   workers that took the longest bundle left started a 4K haystack cold that the other
  //   worker's store held, 83% of one process's reused tokens).
  // -1 when none is left. Cost: the bundles left times the workers, per call.
  int next(int worker);
  // What next(worker) would return, without handing it out; take() then hands it out.
  int peek(int worker);
  void take(int worker, int bundle);
  size_t left() const { return left_; }
  // How many whole blocks `bundle` (not yet handed out) shares with `worker`'s recent prompts:
  // what that worker's own store may serve.
  int shared_blocks(int worker, int bundle);
  // The same for the bundle take() (or next()) handed out last, before it joined the worker's
  // recent prompts.
  int last_shared_blocks() const { return last_shared_blocks_; }

 private:
  // How much of a bundle's prefix one worker's recent prompts hold: whole blocks, and the
  // hand-out stamp of the latest prompt that shares them (the later the more likely stored).
  struct Share {
    int depth = 0;
    int64_t stamp = -1;
    bool operator<(const Share& o) const {
      return depth != o.depth ? depth < o.depth : stamp < o.stamp;
    }
  };
  struct Worker {
    std::deque<std::pair<int, int64_t>> history;  // (bundle, stamp), the latest first
    std::vector<Share> share;                     // by bundle index
  };
  Worker& worker_state(int worker);
  // Raises w.share for every bundle whose prefix shares blocks with bundle b's.
  void add_prompt(Worker& w, int b, int64_t stamp);

  std::vector<int> order_;
  std::vector<std::vector<uint64_t>> chains_;
  std::vector<bool> taken_;  // by bundle index
  size_t cursor_ = 0;        // order_ before it is taken
  size_t left_ = 0;
  int64_t stamp_ = 0;
  int last_shared_blocks_ = 0;
  std::unordered_map<uint64_t, std::vector<int>> buckets_;  // chain hash at any depth -> bundles
  std::map<int, Worker> workers_;
};

}  // namespace kvb::harness
