// PrefixStore (workers/prefix_store.h): reuse of a stored prefix, pieces between checkpoints,
// and the bounded store of prefixes.
#include "workers/prefix_store.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <new>

#include "common/error.h"

namespace kvb::workers {
namespace {

// Tokens the two sequences share from the start.
int common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

// Layer l slides (ModelConfig::sliding): 1, else 0.
std::vector<uint8_t> sliding_layers(const engine::ModelConfig& c) {
  std::vector<uint8_t> s(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) s[l] = c.sliding(l) ? 1 : 0;
  return s;
}

// Appends the sliding layers' slots of `from` to those of `to` (rows, positions, in order).
void copy_windows(const kernels::KvCache& from, const std::vector<uint8_t>& sliding,
                  kernels::KvCache& to) {
  for (size_t l = 0; l < sliding.size(); ++l) {
    if (!sliding[l]) continue;
    const kernels::LayerKvView v = from.rows_f32(static_cast<int>(l));
    for (int h = 0; h < v.num_kv_heads; ++h) {
      for (int s = 0; s < from.length(static_cast<int>(l), h); ++s) {
        to.append(static_cast<int>(l), h, v.key(h, s), v.value(h, s), v.position(h)[s]);
      }
    }
  }
}

// The sliding layers' rows of `cache` now, in a cache of their own.
kernels::KvCache window_rows(const kernels::KvCache& cache, const std::vector<uint8_t>& sliding) {
  int longest = 1;
  for (size_t l = 0; l < sliding.size(); ++l) {
    if (!sliding[l]) continue;
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      longest = std::max(longest, cache.length(static_cast<int>(l), h));
    }
  }
  kernels::KvCache w(cache.shape(), longest, /*host_rows=*/true);
  copy_windows(cache, sliding, w);
  return w;
}


}  // namespace

void PrefixStore::clear() {
  entries_.clear();
  prompts_.clear();
  prompt_index_.clear();
  bytes_ = 0;
  engine_ = nullptr;
}

void PrefixStore::add_prompt(std::vector<int32_t> tokens) {
  if (max_bytes_ == 0) return;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (int32_t t : tokens) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  const auto [lo, hi] = prompt_index_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (prompts_[it->second] == tokens) return;
  }
  prompt_index_.emplace(h, prompts_.size());
  prompts_.push_back(std::move(tokens));
}

bool PrefixStore::serves(const engine::Engine& engine) { return engine.continues_prefill(); }

std::vector<int> PrefixStore::branch_points(std::span<const int32_t> tokens, int from, int limit,
                                            int last_w) const {
  std::vector<int> points;
  for (const auto& other : prompts_) {
    const int shared = common_prefix(tokens, other);
    if (shared == static_cast<int>(tokens.size()) && other.size() == tokens.size()) continue;
    // The other prompt's own last piece must hold its last_w rows too.
    const int other_limit = static_cast<int>(other.size()) - std::max(1, last_w);
    const int at = std::min({shared, limit, other_limit});
    if (at > from && at >= kMinReuse) points.push_back(at);
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  return points;
}

int PrefixStore::prefill(engine::Engine& engine, std::span<const int32_t> tokens,
                         kernels::KvCache& cache, engine::PrefillRecord* record,
                         std::vector<float>* logits) {
  KVB_CHECK(record != nullptr) << "PrefixStore::prefill: no record";
  keep_ms_ = 0;
  if (engine_ != &engine) {  // rows of another engine (or model) are not this one's
    entries_.clear();
    bytes_ = 0;
    engine_ = &engine;
  }
  const int n = static_cast<int>(tokens.size());
  const policies::StatsRequest req = record->request;
  // The last piece holds the recorded last_w probability rows and last_queries queries.
  const int last_w = std::max({1, req.last_w, req.last_queries});
  const int limit = n - last_w;
  if (max_bytes_ == 0 || !serves(engine) || limit < kMinReuse) {
    engine.forward(tokens, cache, engine::LogitsMode::kLast, logits, nullptr,
                   engine::PolicyHook::kNone, record);
    return 0;
  }
  // The longest stored prefix this prefill can start from: its rows, and with column sums or
  // sliding windows a checkpoint (the sums after exactly that many queries, the windows then).
  const std::vector<uint8_t> sliding = sliding_layers(engine.config());
  const bool windows = std::find(sliding.begin(), sliding.end(), 1) != sliding.end();
  const bool at_checkpoints = req.col_sums || windows;
  auto best = entries_.end();
  int reused = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (req.col_sums && !it->col_sums) continue;
    if ((req.pre_rope_keys && it->pre_keys.empty()) ||
        (req.pre_rope_queries && it->pre_queries.empty())) {
      continue;
    }
    int at = std::min(common_prefix(tokens, it->tokens), limit);
    if (at_checkpoints) {
      auto c = it->checkpoints.upper_bound(at);
      if (c == it->checkpoints.begin()) continue;
      at = std::prev(c)->first;
    }
    if (at >= kMinReuse && at > reused) {
      reused = at;
      best = it;
    }
  }
  std::vector<int> points = branch_points(tokens, reused, limit, last_w);
  // Keep only what fits: the largest checkpoints go first (each takes its rows with it).
  while (!points.empty() && entry_bytes(engine.config(), cache, req, points) > max_bytes_) {
    points.pop_back();
  }
  if (best == entries_.end() && points.empty()) {
    engine.forward(tokens, cache, engine::LogitsMode::kLast, logits, nullptr,
                   engine::PolicyHook::kNone, record);
    return 0;
  }
  // The pre-RoPE keys and queries of the prompt so far, per layer: the stored prefix's first
  // `reused` tokens, then each piece's (a token's pre-RoPE rows are those of one pass).
  const engine::ModelConfig& mc = engine.config();
  const size_t key_row = static_cast<size_t>(mc.num_kv_heads) * mc.head_dim;
  const size_t query_row = static_cast<size_t>(mc.num_heads) * mc.head_dim;
  std::vector<std::vector<float>> pre_keys(req.pre_rope_keys ? mc.num_layers : 0);
  std::vector<std::vector<float>> pre_queries(req.pre_rope_queries ? mc.num_layers : 0);
  if (best != entries_.end()) {
    for (size_t l = 0; l < pre_keys.size(); ++l) {
      pre_keys[l].assign(best->pre_keys[l].begin(), best->pre_keys[l].begin() + reused * key_row);
    }
    for (size_t l = 0; l < pre_queries.size(); ++l) {
      pre_queries[l].assign(best->pre_queries[l].begin(),
                            best->pre_queries[l].begin() + reused * query_row);
    }
  }
  auto join_piece = [&] {
    for (size_t l = 0; l < pre_keys.size(); ++l) {
      pre_keys[l].insert(pre_keys[l].end(), record->pre_rope_keys[l].begin(),
                         record->pre_rope_keys[l].end());
    }
    for (size_t l = 0; l < pre_queries.size(); ++l) {
      pre_queries[l].insert(pre_queries[l].end(), record->pre_rope_queries[l].begin(),
                            record->pre_rope_queries[l].end());
    }
  };
  if (best != entries_.end()) {
    cache.assign_prefix(best->rows, reused, sliding);
    if (at_checkpoints) {
      const Checkpoint& c = best->checkpoints.at(reused);
      if (req.col_sums) {
        record->col_sums = c.col_sums;
        record->strides = c.strides;
      }
      copy_windows(c.windows, sliding, cache);
    }
    entries_.splice(entries_.end(), entries_, best);  // the most recently used goes last
  }
  // Pieces end at the checkpoints (only column sums and windows need them: the global layers'
  // rows are kept whole) and at n.
  // What is kept for later prompts is bookkeeping, not this prompt's forward pass: timed apart
  // (keep_ms) and dropped, results unchanged, when memory runs out.
  Entry mine;
  mine.col_sums = req.col_sums;
  bool keeping = !points.empty();
  auto bookkeeping = [&](auto&& f) {
    if (!keeping) return;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f();
    } catch (const std::bad_alloc&) {
      keeping = false;
      mine = Entry();
    }
    keep_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
  };
  std::vector<int> ends;
  if (at_checkpoints) ends = points;
  ends.push_back(n);
  int at = reused;
  for (int end : ends) {
    record->request = req;
    if (end < n) {
      record->request.last_w = 0;
      record->request.last_queries = 0;
    }
    record->continues = at > 0 && req.col_sums;
    engine.forward(tokens.subspan(at, end - at), cache,
                   end == n ? engine::LogitsMode::kLast : engine::LogitsMode::kNone, logits,
                   nullptr, engine::PolicyHook::kNone, record);
    join_piece();
    if (end < n) {
      bookkeeping([&] {
        Checkpoint& cp = mine.checkpoints[end];
        if (req.col_sums) {
          cp.col_sums = record->col_sums;
          cp.strides = record->strides;
        }
        if (windows) cp.windows = window_rows(cache, sliding);
      });
    }
    at = end;
  }
  record->request = req;
  record->n_new = n;
  bookkeeping([&] {
    const int rows = points.back();
    mine.tokens.assign(tokens.begin(), tokens.begin() + rows);
    mine.rows = kernels::KvCache(cache.shape(), rows, /*host_rows=*/true);
    mine.rows.assign_prefix(cache, rows, sliding);
    for (const auto& k : pre_keys) {
      mine.pre_keys.emplace_back(k.begin(), k.begin() + rows * key_row);
    }
    for (const auto& q : pre_queries) {
      mine.pre_queries.emplace_back(q.begin(), q.begin() + rows * query_row);
    }
    mine.bytes = entry_bytes(engine.config(), cache, req, points);
    keep(std::move(mine));
  });
  if (!pre_keys.empty()) record->pre_rope_keys = std::move(pre_keys);
  if (!pre_queries.empty()) record->pre_rope_queries = std::move(pre_queries);
  return reused;
}

size_t PrefixStore::entry_bytes(const engine::ModelConfig& c, const kernels::KvCache& cache,
                                const policies::StatsRequest& req,
                                const std::vector<int>& points) {
  const bool col_sums = req.col_sums;
  const size_t slot = cache.bytes_per_slot(), heads = cache.shape().num_kv_heads;
  size_t global = 0;
  for (int l = 0; l < c.num_layers; ++l) global += c.sliding(l) ? 0 : 1;
  const size_t rows = static_cast<size_t>(points.back());
  size_t bytes = rows * global * heads * slot + rows * sizeof(int32_t);
  // Pre-RoPE keys and queries of every layer (f32).
  const size_t pre = (req.pre_rope_keys ? static_cast<size_t>(c.num_kv_heads) : 0) +
                     (req.pre_rope_queries ? static_cast<size_t>(c.num_heads) : 0);
  bytes += rows * c.num_layers * pre * c.head_dim * sizeof(float);
  for (int p : points) {
    if (col_sums) bytes += static_cast<size_t>(p) * global * c.num_heads * sizeof(float);
    for (int l = 0; l < c.num_layers; ++l) {
      // A sliding layer keeps its last window - 1 rows after a forward pass.
      if (c.sliding(l)) bytes += static_cast<size_t>(std::min(p, c.window[l] - 1)) * heads * slot;
    }
  }
  return bytes;
}

void PrefixStore::keep(Entry entry) {
  if (entry.bytes > max_bytes_) return;
  const size_t bytes = entry.bytes;
  entries_.push_back(std::move(entry));
  bytes_ += bytes;
  while (bytes_ > max_bytes_) {
    bytes_ -= entries_.front().bytes;
    entries_.pop_front();
  }
}

}  // namespace kvb::workers
