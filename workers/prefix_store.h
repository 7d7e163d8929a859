// Prefix reuse (DESIGN.md "Scheduling"): a worker's shared prefills whose prompts begin with the
// same tokens compute the common part once. NIAH's depths of one haystack cut are the case: the
// prompt with the needle at 75% repeats the first 75% of the one with the needle at 100%.
//
// The prompt's forward pass is causal, so the K/V rows of its first p tokens are those of any
// other prompt with the same first p tokens, and a prefill in pieces gives the rows, the logits
// and the statistics of one pass bit for bit (the CPU kernels' rows do not depend on how many
// rows a call takes; column sums add queries in order and a continued piece adds to the earlier
// pieces' sums: PrefillRecord::continues). The column sums after exactly p queries are not in a
// finished prefill's record, so a prefill stops at the places where another known prompt
// branches off (checkpoints) and keeps the sums there.
//
// On a model with sliding-window layers a checkpoint also keeps those layers' windows (the rows
// a window holds after that many tokens: the stored prompt's own windows moved on), so a
// prefill of such a model starts only at a checkpoint.
//
// Pre-RoPE keys and queries (knorm's, expected_attention's, noncausal_attn's, leverage's,
// compactor's) are a token's own rows: an entry keeps its prefix's, and a prefill joins them with
// each piece's (PrefillRecord holds a piece's own), so the record holds one pass's rows.
//
// A unit's results are those of its own full prefill, bit for bit; only its prefill time falls,
// and measurements.prefill_reused says by how many tokens. CPU engines only (continues_prefill);
// elsewhere prefill() is one forward pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/kv_cache.h"
#include "workers/engine/engine.h"

namespace kvb::workers {

class PrefixStore {
 public:
  // Prefixes of fewer tokens are not worth a checkpoint (a chat template's head, an instruction).
  static constexpr int kMinReuse = 128;

  // max_bytes: what the stored rows and checkpoints may hold (0: no reuse at all).
  explicit PrefixStore(size_t max_bytes = 0) : max_bytes_(max_bytes) {}

  size_t max_bytes() const { return max_bytes_; }
  // Whether prefill() can start from a stored prefix on this engine: a CPU engine that continues
  // a recorded prefill.
  static bool serves(const engine::Engine& engine);
  // Forgets every stored prefix and known prompt (another model, or another engine).
  void clear();
  // A prompt (the tokens a shared prefill runs) that this worker may prefill later: a prefill
  // of another prompt checkpoints where this one branches off. Duplicates are ignored.
  void add_prompt(std::vector<int32_t> tokens);

  // The shared prefill of `tokens` into `cache` (no slots yet, room for every token), recording
  // per record->request, with the last token's logits: what engine.forward(tokens, cache,
  // LogitsMode::kLast, logits, nullptr, PolicyHook::kNone, record) gives, bit for bit. Starts
  // from the longest stored prefix it can use and keeps this prompt's rows and checkpoints for
  // later prompts, within max_bytes (the oldest go first). Returns the tokens reused (0: none).
  int prefill(engine::Engine& engine, std::span<const int32_t> tokens, kernels::KvCache& cache,
              engine::PrefillRecord* record, std::vector<float>* logits);

  // Milliseconds the last prefill() spent keeping its prefix for later prompts (copies of rows,
  // sums and windows), which are not the prompt's forward pass: the runner leaves them out of
  // the shared prefill's time.
  double keep_ms() const { return keep_ms_; }

  // Sharing between worker processes (`kvbench sweep` under mpirun, harness/sweep_prefix_share.h):
  // a prefix one worker's prefill kept reaches another worker's store through rank 0, so that
  // a prompt whose prefix another worker computed starts from it there. Rows are those of the
  // same model and engine kind on the same ISA family (the coordinator ships a prefix only to a
  // worker of the model it was made on; import checks the shapes), and a prefill from them is
  // that prompt's own, bit for bit, as from one of its own (the CPU kernels' rows do not depend
  // on which process computed them).
  //
  // The prefixes this store kept since the last call, each as one self-contained message that
  // begins with `head` (the channel's framing; import() takes what follows it), oldest first;
  // an imported prefix is not given out again.
  std::vector<std::string> take_kept(std::string_view head = {});
  // Adds a prefix that another store's take_kept() gave, for prefills on `engine` (entries of
  // another engine are dropped first, as prefill() does). Checks the message before it keeps
  // anything: its format, the engine's K/V shape, the rows' positions (0..n-1 in every global
  // layer's head), the sizes of its checkpoints and pre-RoPE rows. A message that fails throws
  // kvb::Error naming what is wrong, and the store is unchanged. Returns false when it does not
  // fit within max_bytes (not kept).
  bool import(const engine::Engine& engine, std::string_view message);
  // The first fields of a take_kept() message, read without its rows (the coordinator's choice):
  // the prefix's tokens and its bytes in a store. Throws kvb::Error on a message that is not one.
  struct Summary {
    int tokens = 0;
    size_t bytes = 0;
  };
  static Summary summarize(std::string_view message);

  // What the store holds now: prefixes, checkpoints and bytes (tests, logs).
  size_t entries() const { return entries_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Checkpoint {
    std::vector<std::vector<float>> col_sums;  // [layer][num_heads, strides[layer]] (if recorded)
    std::vector<int> strides;
    kernels::KvCache windows;  // the sliding layers' rows after these tokens (if the model has)
  };
  struct Entry {
    std::vector<int32_t> tokens;            // the prefix whose rows `rows` holds
    kernels::KvCache rows;                  // its global layers' rows (capacity: tokens.size())
    bool col_sums = false;                  // whether its checkpoints hold column sums
    std::map<int, Checkpoint> checkpoints;  // by tokens before it
    // The prefix's pre-RoPE keys and queries per layer, [tokens, heads, head_dim], where the
    // prompt that kept it recorded them (empty otherwise).
    std::vector<std::vector<float>> pre_keys, pre_queries;
    size_t bytes = 0;
    bool kept_here = false;  // kept by this store's own prefill and not yet given out (take_kept)
  };
  static std::string export_entry(const Entry& e, std::string_view head);

  // Where `tokens` branches off a known prompt, within (from, limit] and where that prompt
  // could start from it (its own last piece holds last_w rows), ascending.
  std::vector<int> branch_points(std::span<const int32_t> tokens, int from, int limit,
                                 int last_w) const;
  void keep(Entry entry);
  // The bytes an entry of this prompt holds with checkpoints at `points` (ascending, not empty):
  // the slots of its global layers' rows, its tokens, its pre-RoPE keys and queries where `req`
  // records them, and per checkpoint the column sums and the sliding layers' windows (a cache's
  // untouched capacity is not resident). What the entry is
  // sized by before the prefill and counted as in the store.
  static size_t entry_bytes(const engine::ModelConfig& c, const kernels::KvCache& cache,
                            const policies::StatsRequest& req, const std::vector<int>& points);

  size_t max_bytes_ = 0;
  size_t bytes_ = 0;
  double keep_ms_ = 0;
  const engine::Engine* engine_ = nullptr;  // whose rows the entries hold
  std::vector<std::vector<int32_t>> prompts_;
  std::unordered_multimap<uint64_t, size_t> prompt_index_;  // hash of a prompt -> its index
  std::list<Entry> entries_;  // oldest first
};

}  // namespace kvb::workers
