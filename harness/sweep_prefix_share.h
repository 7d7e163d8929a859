// Prefixes shared between the workers of an MPI sweep (DESIGN.md "Scheduling"). Each worker's
// prefix store (workers/prefix_store.h) serves the prompts it meets; with two or more workers a
// haystack's depths are split between them, and a worker that joins a haystack another worker
// began would prefill cold what the other's store holds (the quickstart under mpirun -np 3
// reused 88.5% of one process's tokens with prefix-affine hand-out alone). So a worker sends rank
// 0 each prefix its store keeps (PrefixStore::take_kept, after its bundle), rank 0 keeps the
// latest within a byte budget (prefix_cache_mib: rank 0 holds as much as one worker's store),
// and before it hands a worker a bundle it sends the kept prefix, of another worker, that shares
// the most leading blocks with the bundle's prompt, where that is at least kMinSharedBlocks
// and more than the worker's own recent prompts share (PrefixAffinity::last_shared_blocks).
// The worker's store imports it (PrefixStore::import checks it) and its prefill picks what
// serves best, as from its own prefixes: results do not change, bit for bit.
//
// Messages, both ways: "prefix <model index>\n" then take_kept()'s bytes. A worker sends its
// prefixes before its bundle's results (MPI keeps the order of one sender's messages, so rank 0
// has them before it hands out the next bundle); rank 0 sends one before the bundle it serves.
// Rank 0 spends the memory of one store and a copy per message; a worker, an export and an
// import per prefix kept or received (a 4K-token SmolLM2 prefix: 188 MB of f32 rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvb::harness {

// The head of a prefix message on the sweep's channel, and its parts.
inline constexpr std::string_view kPrefixMessageHead = "prefix ";
std::string prefix_message(int model, std::string_view body);
bool is_prefix_message(std::string_view msg);
struct PrefixMessage {
  int model = 0;
  std::string_view body;  // PrefixStore::take_kept()'s bytes
};
// Throws kvb::Error for a message whose head is not "prefix <model>\n".
PrefixMessage parse_prefix_message(std::string_view msg);

// Whole leading blocks two prefix chains share.
int common_blocks(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);

// The end of a sweep: an idle worker whose next bundle would start from `now_blocks` of prefix
// is better off waiting for a bundle in flight on another worker whose prompt shares
// `later_blocks` with it, when that bundle is expected to end (in `remaining_ms`) sooner than
// the prefill its deeper prefix saves: later_blocks >= now_blocks + SharedPrefixes::kMinShared
// and remaining_ms < ms_per_token * kPrefixBlock * (later_blocks - now_blocks). ms_per_token
// <= 0 (nothing measured yet) never waits. (The quickstart under mpirun -np 3: the worker that
// finished its haystack first took the last 4K bundle with 1,995 tokens of prefix, 5 s before
// the other worker's prompt would have given it 2,984.)
bool worth_waiting(double remaining_ms, double ms_per_token, int now_blocks, int later_blocks);

class SharedPrefixes {
 public:
  // chains: prefix_chain of each bundle's prompt (sweep_affinity.h), by bundle index.
  // max_bytes: the messages kept at once (the oldest go first); 0 keeps none.
  SharedPrefixes(std::vector<std::vector<uint64_t>> chains, size_t max_bytes);

  // A prefix `source` kept while it ran `bundle` (a bundle of `model`): its message as
  // prefix_message() framed it, and its tokens (PrefixStore::summarize).
  void add(int source, int bundle, int model, int tokens, std::string message);
  // The message to send `worker` before `bundle` (of `model`): the kept prefix of another worker,
  // of that model, not yet sent to it, that shares the most whole blocks with the bundle's prompt
  // (at most its tokens / kPrefixBlock; the latest kept among equals), where that is at least
  // kMinShared blocks and more than `own_blocks`, which the worker's own recent prompts share.
  // Null if none. The message stays valid until the next add().
  const std::string* pick(int worker, int bundle, int model, int own_blocks);
  // How many blocks the prefix pick() would send serves (0: none), without sending it.
  int best_blocks(int worker, int bundle, int model);

  static constexpr int kMinShared = 4;  // PrefixAffinity::kMinSharedBlocks: 256 tokens
  size_t bytes() const { return bytes_; }
  size_t size() const { return kept_.size(); }
  // Messages received (add) and sent (pick's non-null answers) so far, and their bytes: the
  // cost in copies.
  int64_t received() const { return received_; }
  size_t received_bytes() const { return received_bytes_; }
  int64_t sent() const { return sent_; }
  size_t sent_bytes() const { return sent_bytes_; }

 private:
  struct Kept {
    int64_t id = 0;
    int source = 0, bundle = 0, model = 0, blocks = 0;  // blocks: whole blocks of its tokens
    std::string message;
    std::set<int> sent_to;
  };
  // The kept prefix pick() sends and the blocks it serves (null: none above own_blocks).
  std::pair<Kept*, int> find(int worker, int bundle, int model, int own_blocks);
  std::vector<std::vector<uint64_t>> chains_;
  size_t max_bytes_ = 0, bytes_ = 0, sent_bytes_ = 0, received_bytes_ = 0;
  int64_t next_id_ = 0, sent_ = 0, received_ = 0;
  std::list<Kept> kept_;  // oldest first
};

}  // namespace kvb::harness
