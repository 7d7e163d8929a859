// PrefixStore (workers/prefix_store.h): reuse of a stored prefix, pieces between checkpoints,
// and the bounded store of prefixes.
#include "workers/prefix_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <limits>
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

// take_kept()'s messages: fixed-width fields in this machine's byte order (both ends run this
// build: an MPI job's ranks), vectors as a 64-bit count then their elements.
constexpr char kMagic[8] = {'K', 'V', 'B', 'P', 'R', 'E', 'F', '1'};

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  template <typename T>
  void put(T v) {
    out_->append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <typename T>
  void put_vec(const T* p, size_t n) {
    put<uint64_t>(n);
    out_->append(reinterpret_cast<const char*>(p), n * sizeof(T));
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    put_vec(v.data(), v.size());
  }
  // A cache's slots per (layer, head): its length, positions, then keys and values as f32 (an
  // f16 row converts to f32 and back exactly).
  void put_cache(const kernels::KvCache& c) {
    put<int32_t>(c.next_position());
    put<int32_t>(c.max_length());
    for (int l = 0; l < c.shape().num_layers; ++l) {
      const kernels::LayerKvView v = c.rows_f32(l);
      for (int h = 0; h < v.num_kv_heads; ++h) {
        const int n = c.length(l, h);
        put_vec(v.position(h), n);
        out_->append(reinterpret_cast<const char*>(v.key(h, 0)), n * v.head_dim * sizeof(float));
        out_->append(reinterpret_cast<const char*>(v.value(h, 0)), n * v.head_dim * sizeof(float));
      }
    }
  }

 private:
  std::string* out_;
};

// Reads a message, every count checked against what is left (a short or corrupt message fails
// with a kvb::Error naming the field).
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T get(const char* what) {
    KVB_CHECK(in_.size() - at_ >= sizeof(T))
        << "a shared prefix message ends inside its " << what << " (" << in_.size() << " bytes)";
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  // A count of elements of `size` bytes that the rest of the message holds, at most `max`.
  size_t count(const char* what, size_t size, size_t max) {
    const uint64_t n = get<uint64_t>(what);
    KVB_CHECK(n <= max && n <= (in_.size() - at_) / size)
        << "a shared prefix message has " << n << " " << what << ": more than "
        << (n > max ? "the shape allows" : "the message holds");
    return static_cast<size_t>(n);
  }
  template <typename T>
  std::vector<T> get_vec(const char* what, size_t max) {
    std::vector<T> v(count(what, sizeof(T), max));
    std::memcpy(v.data(), in_.data() + at_, v.size() * sizeof(T));
    at_ += v.size() * sizeof(T);
    return v;
  }
  // The bytes of n elements of T, copied out (the message need not be aligned for T).
  template <typename T>
  void copy(T* dst, size_t n, const char* what) {
    KVB_CHECK(n <= (in_.size() - at_) / sizeof(T))
        << "a shared prefix message ends inside its " << what;
    std::memcpy(dst, in_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
  }
  // A cache of `shape` as put_cache wrote it; lengths[l] (-1: any up to `bound`) is what every
  // head of layer l must hold, its positions increasing and below `bound` (with `exact`:
  // 0..length-1, a prompt's own rows).
  kernels::KvCache get_cache(const kernels::KvCacheShape& shape, const std::vector<int>& lengths,
                             int bound, bool exact) {
    const int32_t next = get<int32_t>("next position");
    const int32_t longest = get<int32_t>("longest head");
    KVB_CHECK(next >= 0 && next <= bound && longest >= 0 && longest <= bound)
        << "a shared prefix message's cache has next position " << next << " and " << longest
        << " slots in a head, beyond its " << bound << " tokens";
    kernels::KvCache c(shape, std::max(1, static_cast<int>(longest)), /*host_rows=*/true);
    c.advance_position(next);
    std::vector<float> key(shape.head_dim), value(shape.head_dim);
    for (int l = 0; l < shape.num_layers; ++l) {
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        const std::vector<int32_t> pos = get_vec<int32_t>("positions", longest);
        const int n = static_cast<int>(pos.size());
        KVB_CHECK(lengths[l] < 0 || n == lengths[l])
            << "a shared prefix message's layer " << l << " head " << h << " holds " << n
            << " slots, not " << lengths[l];
        for (int s = 0; s < n; ++s) {
          KVB_CHECK(exact ? pos[s] == s
                          : (pos[s] >= 0 && pos[s] < bound && (s == 0 || pos[s] > pos[s - 1])))
              << "a shared prefix message's layer " << l << " head " << h << " holds position "
              << pos[s] << " in slot " << s;
        }
        const size_t first_key = at_;
        const size_t row = static_cast<size_t>(shape.head_dim) * sizeof(float);
        KVB_CHECK((in_.size() - at_) / row >= 2 * static_cast<size_t>(n))
            << "a shared prefix message ends inside layer " << l << " head " << h << "'s rows";
        for (int s = 0; s < n; ++s) {
          std::memcpy(key.data(), in_.data() + first_key + s * row, row);
          std::memcpy(value.data(), in_.data() + first_key + (n + s) * row, row);
          c.append(l, h, key.data(), value.data(), pos[s]);
        }
        at_ += 2 * n * row;
      }
    }
    return c;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  std::string_view in_;
  size_t at_ = 0;
};

}  // namespace

std::string PrefixStore::export_entry(const Entry& e, std::string_view head) {
  std::string out(head);
  // Room for all of it at once (f32 rows: about the entry's bytes; f16 rows: twice): no copy of
  // a growing message, and untouched reserved pages are not resident.
  out.reserve(head.size() + 2 * e.bytes + 4096);
  Writer w(&out);
  out.append(kMagic, sizeof kMagic);
  w.put<uint64_t>(e.bytes);
  w.put_vec(e.tokens);
  const kernels::KvCacheShape& s = e.rows.shape();
  w.put<int32_t>(s.num_layers);
  w.put<int32_t>(s.num_kv_heads);
  w.put<int32_t>(s.head_dim);
  w.put<uint8_t>(s.f16);
  w.put<uint8_t>(s.f32_keys);
  w.put<uint8_t>(e.col_sums);
  w.put_cache(e.rows);
  w.put<uint64_t>(e.checkpoints.size());
  for (const auto& [at, cp] : e.checkpoints) {
    w.put<int32_t>(at);
    w.put<uint64_t>(cp.col_sums.size());
    for (const auto& sums : cp.col_sums) w.put_vec(sums);
    w.put_vec(cp.strides);
    const bool windows = cp.windows.shape().num_layers > 0;
    w.put<uint8_t>(windows);
    if (windows) w.put_cache(cp.windows);
  }
  for (const auto* pre : {&e.pre_keys, &e.pre_queries}) {
    w.put<uint64_t>(pre->size());
    for (const auto& rows : *pre) w.put_vec(rows);
  }
  return out;
}

std::vector<std::string> PrefixStore::take_kept(std::string_view head) {
  std::vector<std::string> out;
  for (Entry& e : entries_) {
    if (!e.kept_here) continue;
    out.push_back(export_entry(e, head));
    e.kept_here = false;
  }
  return out;
}

PrefixStore::Summary PrefixStore::summarize(std::string_view message) {
  KVB_CHECK(message.size() >= sizeof kMagic &&
            message.substr(0, sizeof kMagic) == std::string_view(kMagic, sizeof kMagic))
      << "not a shared prefix message (" << message.size() << " bytes)";
  Reader r(message.substr(sizeof kMagic));
  Summary s;
  s.bytes = r.get<uint64_t>("bytes");
  s.tokens = static_cast<int>(r.count("tokens", sizeof(int32_t), std::numeric_limits<int>::max()));
  return s;
}

bool PrefixStore::import(const engine::Engine& engine, std::string_view message) {
  const Summary summary = summarize(message);
  Reader r(message.substr(sizeof kMagic));
  r.get<uint64_t>("bytes");
  const engine::ModelConfig& mc = engine.config();
  Entry e;
  e.tokens = r.get_vec<int32_t>("tokens", static_cast<size_t>(mc.max_seq_len));
  const int n = static_cast<int>(e.tokens.size());
  KVB_CHECK(n >= kMinReuse) << "a shared prefix message holds " << n << " tokens, fewer than "
                            << kMinReuse;
  for (int32_t t : e.tokens) {
    KVB_CHECK(t >= 0 && t < mc.vocab_size)
        << "a shared prefix message holds token id " << t << ", outside the model's vocabulary";
  }
  kernels::KvCacheShape shape;
  shape.num_layers = r.get<int32_t>("shape");
  shape.num_kv_heads = r.get<int32_t>("shape");
  shape.head_dim = r.get<int32_t>("shape");
  shape.f16 = r.get<uint8_t>("shape") != 0;
  shape.f32_keys = r.get<uint8_t>("shape") != 0;
  const kernels::KvCacheShape mine = engine.new_cache(1).shape();
  KVB_CHECK(shape.num_layers == mine.num_layers && shape.num_kv_heads == mine.num_kv_heads &&
            shape.head_dim == mine.head_dim && shape.f16 == mine.f16)
      << "a shared prefix message holds K/V rows of " << shape.num_layers << " layers x "
      << shape.num_kv_heads << " heads x " << shape.head_dim << (shape.f16 ? " (f16)" : " (f32)")
      << ", not this model's " << mine.num_layers << " x " << mine.num_kv_heads << " x "
      << mine.head_dim << (mine.f16 ? " (f16)" : " (f32)");
  e.col_sums = r.get<uint8_t>("column sums flag") != 0;
  const std::vector<uint8_t> sliding = sliding_layers(mc);
  std::vector<int> row_lengths(mc.num_layers), window_lengths(mc.num_layers);
  for (int l = 0; l < mc.num_layers; ++l) {
    row_lengths[l] = sliding[l] ? 0 : n;
    window_lengths[l] = sliding[l] ? -1 : 0;
  }
  e.rows = r.get_cache(shape, row_lengths, n, /*exact=*/true);
  KVB_CHECK(e.rows.next_position() == n) << "a shared prefix message's rows end at position "
                                         << e.rows.next_position() << ", not " << n;
  const size_t checkpoints = r.count("checkpoints", sizeof(int32_t), static_cast<size_t>(n));
  for (size_t i = 0; i < checkpoints; ++i) {
    const int32_t at = r.get<int32_t>("checkpoint");
    KVB_CHECK(at >= kMinReuse && at <= n && !e.checkpoints.count(at))
        << "a shared prefix message has a checkpoint at " << at << " of its " << n << " tokens";
    Checkpoint& cp = e.checkpoints[at];
    cp.col_sums.resize(r.count("column sum layers", sizeof(uint64_t), mc.num_layers));
    KVB_CHECK(cp.col_sums.empty() || e.col_sums)
        << "a shared prefix message's checkpoint holds column sums its flag says it has not";
    for (auto& sums : cp.col_sums) {
      sums = r.get_vec<float>("column sums", static_cast<size_t>(mc.num_heads) * mc.max_seq_len);
    }
    cp.strides = r.get_vec<int32_t>("strides", cp.col_sums.size());
    KVB_CHECK(cp.strides.size() == cp.col_sums.size())
        << "a shared prefix message's checkpoint has " << cp.strides.size() << " strides for "
        << cp.col_sums.size() << " layers of column sums";
    for (size_t l = 0; l < cp.strides.size(); ++l) {
      KVB_CHECK(cp.strides[l] >= 0 && cp.strides[l] <= mc.max_seq_len &&
                cp.col_sums[l].size() == static_cast<size_t>(mc.num_heads) * cp.strides[l])
          << "a shared prefix message's checkpoint at " << at << " has " << cp.col_sums[l].size()
          << " column sums in layer " << l << " for stride " << cp.strides[l];
    }
    KVB_CHECK(!e.col_sums || cp.col_sums.size() == static_cast<size_t>(mc.num_layers))
        << "a shared prefix message's checkpoint at " << at << " has column sums of "
        << cp.col_sums.size() << " layers, not " << mc.num_layers;
    const bool windows = r.get<uint8_t>("windows flag") != 0;
    const bool slides = std::find(sliding.begin(), sliding.end(), 1) != sliding.end();
    KVB_CHECK(windows == slides) << "a shared prefix message's checkpoint at " << at
                                 << (windows ? " holds" : " lacks")
                                 << " the sliding layers' windows";
    if (windows) cp.windows = r.get_cache(shape, window_lengths, at, /*exact=*/false);
  }
  const size_t key_row = static_cast<size_t>(mc.num_kv_heads) * mc.head_dim;
  const size_t query_row = static_cast<size_t>(mc.num_heads) * mc.head_dim;
  for (auto [pre, row] : {std::pair{&e.pre_keys, key_row}, std::pair{&e.pre_queries, query_row}}) {
    pre->resize(r.count("pre-RoPE layers", sizeof(uint64_t), mc.num_layers));
    KVB_CHECK(pre->empty() || pre->size() == static_cast<size_t>(mc.num_layers))
        << "a shared prefix message has pre-RoPE rows of " << pre->size() << " layers";
    for (auto& rows : *pre) {
      rows = r.get_vec<float>("pre-RoPE rows", n * row);
      KVB_CHECK(rows.size() == n * row) << "a shared prefix message has " << rows.size()
                                        << " pre-RoPE floats in a layer, not " << n * row;
    }
  }
  KVB_CHECK(r.done()) << "a shared prefix message has bytes past its end";
  // The bytes a store counts for it are those its own prefill would (entry_bytes), within the
  // message's own size (a message holds every row, position and float of it).
  KVB_CHECK(summary.bytes > 0 && summary.bytes <= message.size())
      << "a shared prefix message says it holds " << summary.bytes << " bytes in a message of "
      << message.size();
  e.bytes = summary.bytes;
  if (engine_ != &engine) {
    entries_.clear();
    bytes_ = 0;
    engine_ = &engine;
  }
  if (e.bytes > max_bytes_) return false;
  keep(std::move(e));
  return true;
}

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
    const kernels::KvCacheShape &a = it->rows.shape(), &b = cache.shape();
    if (a.num_kv_heads != b.num_kv_heads || a.f16 != b.f16 || a.f32_keys != b.f32_keys) continue;
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
    mine.kept_here = true;
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
