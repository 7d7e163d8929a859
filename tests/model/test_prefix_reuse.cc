// Prefix reuse (workers/prefix_store.h): a prefill in pieces records what one pass records, bit
// for bit (the law that makes reuse exact), and a shared prefill that starts from an earlier
// prompt's prefix gives the logits, cache and record of its own prefill; bundle units run with
// the store equal those run without it.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "cache_check.h"
#include "common/error.h"
#include "harness/bundle_runner.h"
#include "harness/sweep_plan.h"
#include "harness/sweep_prefix_share.h"
#include "kernels/policies/policy.h"
#include "results/store.h"
#include "run_kvbench.h"
#include "workers/engine/engine.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "workers/prefix_store.h"
#include "workers/runner.h"

namespace kvb {
namespace {

const std::string kStories = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
const std::string kStoriesTok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";

// Bitwise equality of float vectors (EXPECT_EQ on vectors compares with ==: -0 == 0, NaN != NaN).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_record(const engine::PrefillRecord& a, const engine::PrefillRecord& b) {
  EXPECT_EQ(a.n_new, b.n_new);
  EXPECT_EQ(a.last_w, b.last_w);
  EXPECT_EQ(a.strides, b.strides);
  ASSERT_EQ(a.col_sums.size(), b.col_sums.size());
  ASSERT_EQ(a.last_probs.size(), b.last_probs.size());
  for (size_t l = 0; l < a.col_sums.size(); ++l) {
    EXPECT_TRUE(same_bits(a.col_sums[l], b.col_sums[l])) << "col_sums of layer " << l;
    EXPECT_TRUE(same_bits(a.last_probs[l], b.last_probs[l])) << "last_probs of layer " << l;
  }
  ASSERT_EQ(a.pre_rope_keys.size(), b.pre_rope_keys.size());
  ASSERT_EQ(a.pre_rope_queries.size(), b.pre_rope_queries.size());
  for (size_t l = 0; l < a.pre_rope_keys.size(); ++l) {
    EXPECT_TRUE(same_bits(a.pre_rope_keys[l], b.pre_rope_keys[l])) << "pre-RoPE keys, layer " << l;
  }
  for (size_t l = 0; l < a.pre_rope_queries.size(); ++l) {
    EXPECT_TRUE(same_bits(a.pre_rope_queries[l], b.pre_rope_queries[l]))
        << "pre-RoPE queries, layer " << l;
  }
}

std::vector<int32_t> random_tokens(int n, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = 3 + static_cast<int32_t>(rng() % (vocab - 3));
  return t;
}

// stem's first `at` tokens, then `tail` random ones, the first of which differs from stem[at]:
// a prompt that branches off stem exactly at `at`.
std::vector<int32_t> branch_off(const std::vector<int32_t>& stem, int at, int tail, uint32_t seed,
                                int vocab) {
  std::vector<int32_t> p(stem.begin(), stem.begin() + at);
  std::vector<int32_t> t = random_tokens(tail, seed, vocab);
  if (t[0] == stem[at]) t[0] = stem[at] == 3 ? 4 : 3;
  p.insert(p.end(), t.begin(), t.end());
  return p;
}

struct OnePass {
  kernels::KvCache cache;
  engine::PrefillRecord record;
  std::vector<float> logits;
};

OnePass one_pass(engine::Engine& eng, const std::vector<int32_t>& prompt,
                 const policies::StatsRequest& req, int capacity) {
  OnePass o;
  o.cache = eng.new_cache(capacity);
  o.record.request = req;
  eng.forward(prompt, o.cache, engine::LogitsMode::kLast, &o.logits, nullptr,
              engine::PolicyHook::kNone, &o.record);
  return o;
}

// The store's prefill of `prompt` into a fresh cache of `capacity`, checked against one pass
// bit for bit (logits, cache, record); returns the tokens it reused.
int store_prefill_is_one_pass(workers::PrefixStore& store, engine::Engine& eng,
                              const std::vector<int32_t>& prompt, const policies::StatsRequest& req,
                              int capacity) {
  kernels::KvCache cache = eng.new_cache(capacity);
  engine::PrefillRecord rec;
  rec.request = req;
  std::vector<float> logits;
  const int reused = store.prefill(eng, prompt, cache, &rec, &logits);
  const OnePass ref = one_pass(eng, prompt, req, capacity);
  EXPECT_TRUE(same_bits(logits, ref.logits));
  expect_same_cache(cache, ref.cache);
  expect_same_record(rec, ref.record);
  return reused;
}

// The law under prefix reuse: the prompt's forward pass in pieces, each continuing the record of
// the pieces before it, gives one pass's logits, rows and statistics bit for bit (column sums
// add the queries in the same order; a query row's arithmetic does not depend on its piece).
void pieces_equal_one_pass(engine::Engine& eng, int vocab) {
  ASSERT_TRUE(eng.continues_prefill());
  const int n = 300;
  const std::vector<int32_t> prompt = random_tokens(n, 11, vocab);
  policies::StatsRequest both, sums, window;
  both.col_sums = true;
  both.last_w = 16;
  sums.col_sums = true;
  window.last_w = 8;
  for (const policies::StatsRequest& req : {both, sums, window}) {
    const OnePass ref = one_pass(eng, prompt, req, n + 4);
    for (const std::vector<int>& cuts :
         {std::vector<int>{150}, {1, 2, 33, 64, 200}, {n - 16}, {31, 32, 280}}) {
      SCOPED_TRACE("col_sums " + std::to_string(req.col_sums) + " last_w " +
                   std::to_string(req.last_w) + ", " + std::to_string(cuts.size()) + " cuts");
      kernels::KvCache cache = eng.new_cache(n + 4);
      engine::PrefillRecord rec;
      std::vector<float> logits;
      int at = 0;
      std::vector<int> ends = cuts;
      ends.push_back(n);
      for (int end : ends) {
        rec.request = req;
        if (end < n) rec.request.last_w = 0;  // the window's rows are the last piece's
        rec.continues = at > 0;
        eng.forward(std::span(prompt).subspan(at, end - at), cache,
                    end == n ? engine::LogitsMode::kLast : engine::LogitsMode::kNone, &logits,
                    nullptr, engine::PolicyHook::kNone, &rec);
        EXPECT_FALSE(rec.continues);  // forward() consumed it
        at = end;
      }
      rec.n_new = n;
      EXPECT_TRUE(same_bits(logits, ref.logits));
      expect_same_cache(cache, ref.cache);
      expect_same_record(rec, ref.record);
    }
  }
  // Without the earlier sums, a piece's column sums are its own queries' only: not one pass's.
  kernels::KvCache cache = eng.new_cache(n + 4);
  engine::PrefillRecord rec;
  rec.request = sums;
  std::vector<float> logits;
  eng.forward(std::span(prompt).first(150), cache, engine::LogitsMode::kNone, &logits, nullptr,
              engine::PolicyHook::kNone, &rec);
  eng.forward(std::span(prompt).subspan(150), cache, engine::LogitsMode::kLast, &logits, nullptr,
              engine::PolicyHook::kNone, &rec);
  EXPECT_FALSE(same_bits(rec.col_sums[0], one_pass(eng, prompt, sums, n + 4).record.col_sums[0]));
  // Pre-RoPE keys and queries are recorded per piece (with column sums continued): each piece
  // holds its own tokens' rows, and the pieces' rows joined are one pass's, bit for bit (what the
  // prefix store joins).
  policies::StatsRequest pre = sums;
  pre.pre_rope_keys = true;
  pre.pre_rope_queries = true;
  const OnePass whole = one_pass(eng, prompt, pre, n + 4);
  kernels::KvCache c2 = eng.new_cache(n + 4);
  engine::PrefillRecord pieces;
  std::vector<std::vector<float>> keys, queries;
  for (const auto& [a, b] : std::vector<std::pair<int, int>>{{0, 120}, {120, 250}, {250, n}}) {
    pieces.request = pre;
    pieces.continues = a > 0;
    eng.forward(std::span(prompt).subspan(a, b - a), c2,
                b == n ? engine::LogitsMode::kLast : engine::LogitsMode::kNone, &logits, nullptr,
                engine::PolicyHook::kNone, &pieces);
    keys.resize(pieces.pre_rope_keys.size());
    queries.resize(pieces.pre_rope_queries.size());
    for (size_t l = 0; l < keys.size(); ++l) {
      EXPECT_EQ(pieces.pre_rope_keys[l].size(), static_cast<size_t>(b - a) *
                                                    eng.config().num_kv_heads *
                                                    eng.config().head_dim);
      keys[l].insert(keys[l].end(), pieces.pre_rope_keys[l].begin(),
                     pieces.pre_rope_keys[l].end());
      queries[l].insert(queries[l].end(), pieces.pre_rope_queries[l].begin(),
                        pieces.pre_rope_queries[l].end());
    }
  }
  ASSERT_EQ(keys.size(), whole.record.pre_rope_keys.size());
  for (size_t l = 0; l < keys.size(); ++l) {
    EXPECT_TRUE(same_bits(keys[l], whole.record.pre_rope_keys[l])) << "layer " << l;
    EXPECT_TRUE(same_bits(queries[l], whole.record.pre_rope_queries[l])) << "layer " << l;
  }
  EXPECT_TRUE(same_bits(pieces.col_sums[0], whole.record.col_sums[0]));
}

// f32 (the reference) and bf16 weights.
TEST(PrefixReuse, PiecesRecordWhatOnePassRecords) {
  std::unique_ptr<engine::Model> m = engine::load_model(kStories);
  for (engine::DType dtype : {engine::DType::kF32, engine::DType::kBf16}) {
    SCOPED_TRACE(engine::dtype_name(dtype));
    std::unique_ptr<engine::Engine> e = engine::make_engine(*m, engine::Device::kCpu, dtype);
    pieces_equal_one_pass(*e, m->config.vocab_size);
  }
}

// Five prompts: A, B, C and F share a stem (B and C branch off A at 200 and 150 tokens, F at 250
// with 5 tokens of its own), D shares nothing. With the store knowing all five, A's prefill
// checkpoints at 150, 200 and 239; B starts from A's 200 tokens, C from 150, F from 239, not 250:
// its last piece must hold the 16 rows the record keeps probabilities of. D prefills alone.
// Every prefill equals its own one pass.
TEST(PrefixReuse, StoreStartsFromAnEarlierPromptsPrefix) {
  std::unique_ptr<engine::Model> m = engine::load_model(kStories);
  engine::Engine eng(*m);
  const int vocab = m->config.vocab_size;
  const std::vector<int32_t> stem = random_tokens(280, 1, vocab);
  auto branch = [&](int at, int tail, uint32_t seed) { return branch_off(stem, at, tail, seed, vocab); };
  const std::vector<int32_t> a = branch(260, 30, 2), b = branch(200, 40, 3), c = branch(150, 90, 4);
  const std::vector<int32_t> d = random_tokens(250, 5, vocab);
  const std::vector<int32_t> f = branch(250, 5, 7);
  policies::StatsRequest req;  // h2o's and snapkv's union
  req.col_sums = true;
  req.last_w = 16;
  workers::PrefixStore store(size_t(1) << 30);
  for (const auto* p : {&a, &b, &c, &d, &f}) store.add_prompt(*p);
  store.add_prompt(b);  // a duplicate is ignored
  const std::vector<std::pair<const std::vector<int32_t>*, int>> runs = {
      {&a, 0}, {&b, 200}, {&c, 150}, {&d, 0}, {&f, 250 - 16 + 5}};
  for (const auto& [prompt, expect_reused] : runs) {
    const int n = static_cast<int>(prompt->size());
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens");
    kernels::KvCache cache = eng.new_cache(n + 5);
    engine::PrefillRecord rec;
    rec.request = req;
    std::vector<float> logits;
    EXPECT_EQ(store.prefill(eng, *prompt, cache, &rec, &logits), expect_reused);
    const OnePass ref = one_pass(eng, *prompt, req, n + 5);
    EXPECT_TRUE(same_bits(logits, ref.logits));
    expect_same_cache(cache, ref.cache);
    expect_same_record(rec, ref.record);
    EXPECT_EQ(rec.request.last_w, req.last_w);
  }
  // Only A keeps a prefix: the others branch off nothing beyond where they started.
  EXPECT_EQ(store.entries(), 1u);
  EXPECT_LE(store.bytes(), store.max_bytes());

  // A request without column sums reuses rows at any length, not only at checkpoints: a prompt
  // that follows A for 230 tokens starts from A's 230th (A keeps 239 rows: its last checkpoint).
  policies::StatsRequest rows_only;
  rows_only.last_w = 4;
  const std::vector<int32_t> e = branch(230, 20, 6);
  kernels::KvCache cache = eng.new_cache(260);
  engine::PrefillRecord rec;
  rec.request = rows_only;
  std::vector<float> logits;
  EXPECT_EQ(store.prefill(eng, e, cache, &rec, &logits), 230);
  const OnePass ref = one_pass(eng, e, rows_only, 260);
  EXPECT_TRUE(same_bits(logits, ref.logits));
  expect_same_cache(cache, ref.cache);
  expect_same_record(rec, ref.record);
}

// The store's bytes bound what it keeps (the oldest go first; a prefix larger than the whole
// budget is not kept), a store of 0 bytes prefills in one pass, and pre-RoPE keys and queries are
// kept with a prefix and joined with the pieces'.
TEST(PrefixReuse, BoundedStoreAndOnePassWhereReuseCannotHold) {
  std::unique_ptr<engine::Model> m = engine::load_model(kStories);
  engine::Engine eng(*m);
  const int vocab = m->config.vocab_size;
  const std::vector<int32_t> stem = random_tokens(300, 7, vocab);
  std::vector<int32_t> x(stem.begin(), stem.begin() + 290), y(stem.begin(), stem.begin() + 200);
  y.push_back(stem[200] == 3 ? 4 : 3);
  for (int i = 0; i < 40; ++i) y.push_back(5 + i);
  policies::StatsRequest req;
  req.col_sums = true;
  auto prefill = [&](workers::PrefixStore& store, const std::vector<int32_t>& p,
                     const policies::StatsRequest& r, engine::Engine& e) {
    kernels::KvCache cache = e.new_cache(static_cast<int>(p.size()) + 1);
    engine::PrefillRecord rec;
    rec.request = r;
    std::vector<float> logits;
    return store.prefill(e, p, cache, &rec, &logits);
  };
  workers::PrefixStore off(0);
  off.add_prompt(x);
  off.add_prompt(y);
  EXPECT_EQ(prefill(off, x, req, eng), 0);
  EXPECT_EQ(prefill(off, y, req, eng), 0);
  EXPECT_EQ(off.entries(), 0u);

  // x's kept prefix: 200 rows of every layer and head, and one checkpoint's sums.
  const auto& c = m->config;
  const size_t rows = size_t(200) * c.num_layers * c.num_kv_heads * (2 * c.head_dim + 1) * 4;
  const size_t sums = size_t(200) * c.num_layers * c.num_heads * 4;
  workers::PrefixStore small(rows + sums - 1);  // one byte short of x's prefix
  small.add_prompt(x);
  small.add_prompt(y);
  EXPECT_EQ(prefill(small, x, req, eng), 0);
  EXPECT_EQ(small.entries(), 0u);
  EXPECT_EQ(prefill(small, y, req, eng), 0);
  workers::PrefixStore fits(rows + sums + 200 * 4);
  fits.add_prompt(x);
  fits.add_prompt(y);
  EXPECT_EQ(prefill(fits, x, req, eng), 0);
  EXPECT_EQ(fits.entries(), 1u);
  EXPECT_EQ(fits.bytes(), rows + sums + 200 * 4);
  EXPECT_EQ(prefill(fits, y, req, eng), 200);

  // Least recently used goes first: three stems whose prefixes (one each) fit the store only two
  // at a time. s1 and s2 are kept; a prompt starting from s1 makes s2 the oldest; s3 then pushes
  // s2 out, so s1's and s3's other prompts still reuse and s2's starts from nothing.
  {
    auto family = [&](uint32_t seed) {
      const std::vector<int32_t> base = random_tokens(300, seed, vocab);
      std::vector<int32_t> a(base.begin(), base.begin() + 290), b(base.begin(), base.begin() + 200),
          c2(base.begin(), base.begin() + 200);
      b.push_back(base[200] == 3 ? 4 : 3);
      for (int i = 0; i < 40; ++i) b.push_back(5 + i);
      c2.push_back(base[200] == 6 ? 7 : 6);
      for (int i = 0; i < 40; ++i) c2.push_back(9 + i);
      return std::vector<std::vector<int32_t>>{a, b, c2};
    };
    const auto f1 = family(21), f2 = family(22), f3 = family(23);
    workers::PrefixStore lru(2 * (rows + sums + 200 * 4));
    for (const auto* f : {&f1, &f2, &f3}) {
      for (const auto& p : *f) lru.add_prompt(p);
    }
    EXPECT_EQ(prefill(lru, f1[0], req, eng), 0);
    EXPECT_EQ(prefill(lru, f2[0], req, eng), 0);
    EXPECT_EQ(lru.entries(), 2u);
    EXPECT_EQ(prefill(lru, f1[1], req, eng), 200);  // s1 is now the most recent
    EXPECT_GE(lru.keep_ms(), 0.0);
    EXPECT_EQ(prefill(lru, f3[0], req, eng), 0);     // kept: s2, the oldest, goes
    EXPECT_EQ(lru.entries(), 2u);
    EXPECT_EQ(lru.bytes(), 2 * (rows + sums + 200 * 4));
    EXPECT_EQ(prefill(lru, f1[2], req, eng), 200);  // these keep nothing new: they branch
    EXPECT_EQ(prefill(lru, f3[1], req, eng), 200);  // off nothing beyond their start
    EXPECT_EQ(prefill(lru, f2[1], req, eng), 0);
  }

  // Pre-RoPE keys (knorm's) and queries (expected_attention's) are kept with the prefix and
  // joined with each piece's: y reuses x's 200 tokens and records what one pass records, bit for
  // bit. The entry's bytes count them (f32, every layer). An entry kept without queries cannot
  // start a prefill that records them.
  policies::StatsRequest keys = req;
  keys.pre_rope_keys = true;
  policies::StatsRequest both = keys;
  both.pre_rope_queries = true;
  both.last_w = 8;
  for (const policies::StatsRequest& r : {keys, both}) {
    SCOPED_TRACE(r.pre_rope_queries ? "keys and queries" : "keys");
    workers::PrefixStore big(size_t(1) << 30);
    big.add_prompt(x);
    big.add_prompt(y);
    auto run = [&](const std::vector<int32_t>& p) {
      const int n = static_cast<int>(p.size());
      kernels::KvCache cache = eng.new_cache(n + 1);
      engine::PrefillRecord rec;
      rec.request = r;
      std::vector<float> logits;
      const int reused = big.prefill(eng, p, cache, &rec, &logits);
      const OnePass ref = one_pass(eng, p, r, n + 1);
      EXPECT_TRUE(same_bits(logits, ref.logits));
      expect_same_cache(cache, ref.cache);
      expect_same_record(rec, ref.record);
      EXPECT_EQ(rec.pre_rope_keys.at(0).size(),
                static_cast<size_t>(n) * c.num_kv_heads * c.head_dim);
      return reused;
    };
    EXPECT_EQ(run(x), 0);
    EXPECT_EQ(big.entries(), 1u);
    const size_t pre = size_t(200) * c.num_layers * c.head_dim * 4 *
                       (c.num_kv_heads + (r.pre_rope_queries ? c.num_heads : 0));
    EXPECT_EQ(big.bytes(), rows + sums + 200 * 4 + pre);
    EXPECT_EQ(run(y), 200);
  }
  workers::PrefixStore keys_only(size_t(1) << 30);
  keys_only.add_prompt(x);
  keys_only.add_prompt(y);
  EXPECT_EQ(prefill(keys_only, x, keys, eng), 0);
  EXPECT_EQ(prefill(keys_only, y, both, eng), 0);
  EXPECT_EQ(prefill(keys_only, y, keys, eng), 200);
}

// A model with sliding-window layers (Gemma 3 tiny: five layers of window 16, one global): the
// stored prompt's windows moved on, so a prefill starts from a checkpoint, which keeps the
// windows there. Prompts that branch off at 150 and 200 tokens give their own one pass's logits,
// cache (every layer's rows) and record, and then decode the same logits; with column sums and
// without.
TEST(PrefixReuse, SlidingWindowModelStartsFromACheckpointsWindows) {
  std::unique_ptr<engine::Model> g =
      engine::load_model(std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf");
  ASSERT_TRUE(g->config.sliding(0));
  ASSERT_FALSE(g->config.sliding(5));
  engine::Engine eng(*g);
  const int vocab = g->config.vocab_size;
  const std::vector<int32_t> stem = random_tokens(290, 8, vocab);
  auto branch = [&](int at, int tail, uint32_t seed) { return branch_off(stem, at, tail, seed, vocab); };
  policies::StatsRequest sums, rows_only;
  sums.col_sums = true;
  sums.last_w = 16;
  rows_only.last_w = 4;
  for (const policies::StatsRequest& req : {sums, rows_only}) {
    SCOPED_TRACE(req.col_sums ? "column sums" : "no column sums");
    const std::vector<int32_t> x = stem, y = branch(200, 40, 9), z = branch(150, 50, 10);
    workers::PrefixStore store(size_t(1) << 30);
    for (const auto* p : {&x, &y, &z}) store.add_prompt(*p);
    for (const auto& [prompt, expect_reused] :
         std::vector<std::pair<const std::vector<int32_t>*, int>>{{&x, 0}, {&y, 200}, {&z, 150}}) {
      const int n = static_cast<int>(prompt->size());
      kernels::KvCache cache = eng.new_cache(n + 5);
      engine::PrefillRecord rec;
      rec.request = req;
      std::vector<float> logits;
      EXPECT_EQ(store.prefill(eng, *prompt, cache, &rec, &logits), expect_reused);
      OnePass ref = one_pass(eng, *prompt, req, n + 5);
      EXPECT_TRUE(same_bits(logits, ref.logits));
      expect_same_cache(cache, ref.cache);
      expect_same_record(rec, ref.record);
      for (int32_t t : {(*prompt)[3], (*prompt)[1], (*prompt)[4]}) {
        std::vector<float> a, b;
        eng.forward({&t, 1}, cache, engine::LogitsMode::kLast, &a);
        eng.forward({&t, 1}, ref.cache, engine::LogitsMode::kLast, &b);
        EXPECT_TRUE(same_bits(a, b));
      }
      expect_same_cache(cache, ref.cache);
    }
    EXPECT_EQ(store.entries(), 1u);
  }
  // An entry kept without column sums cannot start a prefill that records them (its checkpoints
  // hold windows only): one pass, 0 reused; a request without sums still starts from it.
  const std::vector<int32_t> x = stem, y = branch(200, 40, 9), y2 = branch(200, 30, 11);
  workers::PrefixStore store(size_t(1) << 30);
  for (const auto* p : {&x, &y, &y2}) store.add_prompt(*p);
  auto run = [&](const std::vector<int32_t>& p, const policies::StatsRequest& r) {
    kernels::KvCache cache = eng.new_cache(static_cast<int>(p.size()) + 1);
    engine::PrefillRecord rec;
    rec.request = r;
    std::vector<float> logits;
    const int reused = store.prefill(eng, p, cache, &rec, &logits);
    const OnePass ref = one_pass(eng, p, r, static_cast<int>(p.size()) + 1);
    EXPECT_TRUE(same_bits(logits, ref.logits));
    expect_same_record(rec, ref.record);
    return reused;
  };
  EXPECT_EQ(run(x, rows_only), 0);
  EXPECT_EQ(run(y, sums), 0);
  EXPECT_EQ(run(y2, rows_only), 200);
}

// run_bundle with a prefix store: two samples whose contexts share their first sentences, nine
// policies x two budgets each. Every unit's prediction, measurements (times aside) and final
// cache equal those of the same bundle without the store; the second sample's shared units say
// how many tokens they reused, the first's and the unshared unit's say 0.
TEST(PrefixReuse, BundleUnitsEqualTheirOwnPrefill) {
  workers::LoadedModel lm = workers::load_model_and_tokenizer(kStories, kStoriesTok);
  engine::Engine eng(*lm.model);
  const std::string stem =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. "
      "Lily asked her mom for help. Her mom said, \"Let's try to get it together.\" They went to "
      "the tree and found a long stick. Lily held the stick and reached up high. The ball fell "
      "down and bounced on the grass. Lily laughed and ran after it. She was very happy. Then a "
      "small dog came to play too. The dog liked the ball. Lily threw the ball and the dog ran "
      "to get it. They played all day until the sun went down. ";
  tasks::Sample s1, s2;
  s1.id = "one";
  s2.id = "two";
  s1.chat = s2.chat = false;
  s1.context = stem +
               "At night Lily went to bed and dreamed of the ball. In her dream the ball could "
               "fly over the houses and the trees. She flew with it to a big castle in the sky.";
  s2.context = stem +
               "The next morning, Lily woke up early and looked outside. It was raining, so she "
               "could not go to the park. She sat by the window with her dog and a book.";
  s1.question = s2.question = " Then Lily";
  s1.max_new_tokens = s2.max_new_tokens = 12;
  const auto& c = lm.model->config;
  std::vector<policies::PolicyConfig> pcs;
  // knorm, expected_attention and compactor record pre-RoPE keys and queries, which the store
  // keeps with its prefix and joins with the pieces'.
  for (const char* name : {"full", "window", "streaming_llm", "h2o", "snapkv", "ada_snapkv",
                           "knorm", "expected_attention", "compactor"}) {
    for (int budget : {24, 48}) {
      policies::PolicyConfig pc;
      pc.name = name;
      pc.kv_budget = std::string(name) == "full" ? 0 : budget;
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
      pcs.push_back(pc);
    }
  }
  policies::PolicyConfig streamed = pcs[6];  // h2o streaming its prompt: no shared prefill
  streamed.options =
      policies::PolicyOptions(std::map<std::string, std::string>{{"prefill", "streaming"}});
  pcs.push_back(streamed);
  workers::PrefixStore store(size_t(256) << 20);
  workers::RunSettings with, without;
  with.prefix_store = &store;
  store.add_prompt(workers::shared_prefill_tokens(lm, s1, with));
  store.add_prompt(workers::shared_prefill_tokens(lm, s2, with));
  const int shared_tokens = [&] {
    const auto a = workers::shared_prefill_tokens(lm, s1, with);
    const auto b = workers::shared_prefill_tokens(lm, s2, with);
    int i = 0;
    while (a[i] == b[i]) ++i;
    return i;
  }();
  ASSERT_GE(shared_tokens, workers::PrefixStore::kMinReuse);
  std::vector<kernels::KvCache> caches_with(pcs.size()), caches_without(pcs.size());
  with.on_final_cache = [&](size_t i, const kernels::KvCache& k, const policies::Policy&) {
    caches_with[i] = k;
  };
  without.on_final_cache = [&](size_t i, const kernels::KvCache& k, const policies::Policy&) {
    caches_without[i] = k;
  };
  for (const tasks::Sample* s : {&s1, &s2}) {
    SCOPED_TRACE("sample " + s->id);
    const auto a = workers::run_bundle(lm, eng, *s, pcs, with, true);
    const auto b = workers::run_bundle(lm, eng, *s, pcs, without, true);
    for (size_t i = 0; i < pcs.size(); ++i) {
      SCOPED_TRACE(pcs[i].name + " " + std::to_string(pcs[i].kv_budget));
      const bool shares = i + 1 < pcs.size();
      EXPECT_EQ(a[i].m.prefill_shared, shares);
      EXPECT_EQ(a[i].m.prefill_reused, s == &s2 && shares ? shared_tokens : 0);
      EXPECT_EQ(b[i].m.prefill_reused, 0);
      EXPECT_EQ(a[i].prediction.text, b[i].prediction.text);
      EXPECT_EQ(a[i].m.prompt_sha256, b[i].m.prompt_sha256);
      EXPECT_EQ(a[i].m.generated_tokens, b[i].m.generated_tokens);
      EXPECT_EQ(a[i].m.kv_bytes_final, b[i].m.kv_bytes_final);
      EXPECT_EQ(a[i].m.kv_bytes_peak, b[i].m.kv_bytes_peak);
      EXPECT_EQ(a[i].m.kv_physical_peak, b[i].m.kv_physical_peak);
      EXPECT_EQ(a[i].m.occupancy_mean, b[i].m.occupancy_mean);
      EXPECT_EQ(a[i].m.policy_state_bytes, b[i].m.policy_state_bytes);
      expect_same_cache(caches_with[i], caches_without[i]);
    }
  }
}

// One value of a read-only query.
std::string sql_value(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << db;
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
  std::string out = "no row";
  if (sqlite3_step(st) == SQLITE_ROW) {
    const auto* t = sqlite3_column_text(st, 0);
    out = t ? reinterpret_cast<const char*>(t) : "NULL";
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return out;
}

// `kvbench sweep` with the store on (the default) and off (--prefix-cache-mib 0): a NIAH grid of
// one haystack (its depths share the haystack before their needles) under four policies. The
// same predictions, metrics and non-time measurements; units reused prefixes only with the
// store on; a negative size is refused.
TEST(PrefixReuse, SweepWithTheStoreEqualsTheSweepWithout) {
  const std::string dir = std::string(KVB_BINARY_DIR) + "/test_prefix_reuse_sweep_" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cfg = dir + "/sweep.yaml";
  std::ofstream(cfg) << "models:\n  - name: stories\n    path: " << kStories
                     << "\n    tokenizer: " << kStoriesTok << "\n"
                     << "tasks:\n  - name: niah\n    options: {context_lengths: [320, 448], "
                        "depths: [0, 60, 100], haystack: noise, chat: false}\n"
                     << "policies: [full, h2o, snapkv, window]\nkv_budget: [48]\nseed: [0]\n"
                     << "decode_batch: auto\n";
  std::string err;
  ASSERT_EQ(testing::kvbench({"sweep", cfg, "--db", dir + "/on.db", "--threads", "1"}, nullptr,
                             &err),
            0)
      << err;
  ASSERT_EQ(testing::kvbench({"sweep", cfg, "--db", dir + "/off.db", "--threads", "1",
                              "--prefix-cache-mib", "0"},
                             nullptr, &err),
            0)
      << err;
  const std::string on = dir + "/on.db", off = dir + "/off.db";
  EXPECT_EQ(sql_value(on, "SELECT COUNT(*) FROM measurements"), "24");
  EXPECT_NE(sql_value(on, "SELECT SUM(prefill_reused > 0) FROM measurements"), "0");
  EXPECT_EQ(sql_value(off, "SELECT SUM(prefill_reused > 0) FROM measurements"), "0");
  const std::string cols =
      "unit_key, prompt_tokens, generated_tokens, kv_bytes_final, kv_bytes_peak, "
      "kv_physical_peak, policy_state_bytes, occupancy_mean, occupancy_peak, prefill_shared, "
      "decode_batch, prompt_sha256";
  for (const std::string& q : std::vector<std::string>{
           "SELECT unit_key, prediction FROM %s.predictions",
        "SELECT unit_key, name, value FROM %s.metrics", "SELECT " + cols + " FROM %s.measurements"}) {
    auto with = [&](const char* schema) {
      std::string s = q;
      s.replace(s.find("%s"), 2, schema);
      return s;
    };
    // Both ways: rows of one that the other lacks.
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open_v2(on.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h, ("ATTACH '" + off + "' AS b").c_str(), nullptr, nullptr, nullptr),
              SQLITE_OK);
    for (const auto& [x, y] : {std::pair{"main", "b"}, std::pair{"b", "main"}}) {
      sqlite3_stmt* st = nullptr;
      const std::string sql =
          "SELECT COUNT(*) FROM (" + with(x) + " EXCEPT " + with(y) + ")";
      ASSERT_EQ(sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
      ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
      EXPECT_EQ(sqlite3_column_int(st, 0), 0) << sql;
      sqlite3_finalize(st);
    }
    sqlite3_close(h);
  }
  std::string out;
  EXPECT_EQ(testing::kvbench({"sweep", cfg, "--db", dir + "/bad.db", "--prefix-cache-mib", "-2"},
                             &out, &err),
            2);
  EXPECT_NE(err.find("--prefix-cache-mib must be a number of MiB"), std::string::npos) << err;
}

// Prefixes shared between processes (PrefixStore::take_kept / import: MPI workers through rank
// 0). One store's prefill keeps A's prefix (checkpoints at 150 and 200, where B and C branch
// off); a second store that never saw A imports that message and starts B from 200 tokens and C
// from 150, each its own one pass bit for bit, with an f32 and an f16 cache (the message carries
// rows as f32: f16 converts there and back exactly), column sums and pre-RoPE rows. A message is
// given out once, and an imported one is not given out again.
TEST(PrefixReuse, AnotherStoresPrefixServesAsItsOwn) {
  std::unique_ptr<engine::Model> m = engine::load_model(kStories);
  const int vocab = m->config.vocab_size;
  const std::vector<int32_t> stem = random_tokens(280, 21, vocab);
  const std::vector<int32_t> a = stem, b = branch_off(stem, 200, 40, 22, vocab),
                             c = branch_off(stem, 150, 60, 23, vocab);
  policies::StatsRequest req;
  req.col_sums = true;
  req.last_w = 16;
  req.pre_rope_keys = true;
  req.pre_rope_queries = true;
  for (engine::KvRows rows : {engine::KvRows::kF32, engine::KvRows::kF16}) {
    SCOPED_TRACE(rows == engine::KvRows::kF16 ? "f16 rows" : "f32 rows");
    engine::Engine eng(*m, nullptr, engine::DType::kF32, rows);
    workers::PrefixStore one(size_t(1) << 30), two(size_t(1) << 30);
    for (const auto* p : {&a, &b, &c}) {
      one.add_prompt(*p);
      two.add_prompt(*p);
    }
    auto run = [&](workers::PrefixStore& store, const std::vector<int32_t>& p) {
      return store_prefill_is_one_pass(store, eng, p, req, static_cast<int>(p.size()) + 3);
    };
    EXPECT_EQ(run(one, a), 0);
    const std::vector<std::string> kept = one.take_kept("head\n");
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_TRUE(one.take_kept().empty());
    ASSERT_TRUE(kept[0].starts_with("head\n"));
    const std::string_view body = std::string_view(kept[0]).substr(5);
    const workers::PrefixStore::Summary sum = workers::PrefixStore::summarize(body);
    EXPECT_EQ(sum.tokens, 200);  // through A's last checkpoint
    EXPECT_EQ(sum.bytes, one.bytes());
    ASSERT_TRUE(two.import(eng, body));
    EXPECT_EQ(two.entries(), 1u);
    EXPECT_EQ(two.bytes(), one.bytes());
    EXPECT_EQ(run(two, b), 200);
    EXPECT_EQ(run(two, c), 150);
    EXPECT_TRUE(two.take_kept().empty());
    // A store too small for it does not keep it.
    workers::PrefixStore small(1000);
    EXPECT_FALSE(small.import(eng, body));
    EXPECT_EQ(small.entries(), 0u);
  }
}

// A model with sliding-window layers: the message carries each checkpoint's windows, and the
// importing store starts from a checkpoint as from one of its own.
TEST(PrefixReuse, AnotherStoresPrefixCarriesItsWindows) {
  std::unique_ptr<engine::Model> g =
      engine::load_model(std::string(KVB_FIXTURES_DIR) + "/engine/gemma3_tiny.gguf");
  engine::Engine eng(*g);
  const int vocab = g->config.vocab_size;
  const std::vector<int32_t> x = random_tokens(290, 24, vocab),
                             y = branch_off(x, 200, 40, 25, vocab);
  policies::StatsRequest req;
  req.col_sums = true;
  req.last_w = 16;
  workers::PrefixStore one(size_t(1) << 30), two(size_t(1) << 30);
  for (const auto* p : {&x, &y}) {
    one.add_prompt(*p);
    two.add_prompt(*p);
  }
  kernels::KvCache cache = eng.new_cache(300);
  engine::PrefillRecord rec;
  rec.request = req;
  std::vector<float> logits;
  ASSERT_EQ(one.prefill(eng, x, cache, &rec, &logits), 0);
  const std::vector<std::string> kept = one.take_kept();
  ASSERT_EQ(kept.size(), 1u);
  ASSERT_TRUE(two.import(eng, kept[0]));
  EXPECT_EQ(store_prefill_is_one_pass(two, eng, y, req, 245), 200);
  // Rows of this model are not another's: the stories model's engine refuses them.
  std::unique_ptr<engine::Model> m = engine::load_model(kStories);
  engine::Engine other(*m);
  workers::PrefixStore three(size_t(1) << 30);
  try {
    three.import(other, kept[0]);
    ADD_FAILURE() << "rows of another shape were imported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not this model's"), std::string::npos) << e.what();
  }
  EXPECT_EQ(three.entries(), 0u);
}

// A message is checked before anything of it is kept: cut short anywhere, with a byte past its
// end, another magic, a token outside the vocabulary, a position out of order, or rows of the
// other cache type, it throws and the store is unchanged; the intact message is then kept.
TEST(PrefixReuse, ASharedPrefixMessageIsCheckedBeforeItIsKept) {
  std::unique_ptr<engine::Model> m = engine::load_model(kStories);
  engine::Engine eng(*m);
  const int vocab = m->config.vocab_size;
  const std::vector<int32_t> a = random_tokens(260, 26, vocab),
                             b = branch_off(a, 180, 30, 27, vocab);
  policies::StatsRequest req;
  req.col_sums = true;
  workers::PrefixStore one(size_t(1) << 30);
  one.add_prompt(a);
  one.add_prompt(b);
  kernels::KvCache cache = eng.new_cache(260);
  engine::PrefillRecord rec;
  rec.request = req;
  std::vector<float> logits;
  one.prefill(eng, a, cache, &rec, &logits);
  const std::vector<std::string> kept = one.take_kept();
  ASSERT_EQ(kept.size(), 1u);
  const std::string& good = kept[0];
  workers::PrefixStore two(size_t(1) << 30);
  auto refused = [&](const std::string& msg, const std::string& says) {
    try {
      two.import(eng, msg);
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    EXPECT_EQ(two.entries(), 0u);
    EXPECT_EQ(two.bytes(), 0u);
  };
  for (size_t cut : {size_t{0}, size_t{7}, size_t{12}, size_t{30}, good.size() / 3, good.size() / 2,
                     good.size() - 1}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    refused(good.substr(0, cut), cut < 8 ? "not a shared prefix message" : "a shared prefix");
  }
  refused(good + std::string(1, '\0'), "past its end");
  std::string magic = good;
  magic[0] = 'X';
  refused(magic, "not a shared prefix message");
  // The layout (prefix_store.cc): magic (8), bytes (8), token count (8), the tokens (4 each),
  // the shape (3 x 4 + 2), the column sums flag (1), the rows' next position (4) and longest
  // head (4), then layer 0 head 0's position count (8) and positions (4 each).
  const size_t tokens_at = 24, n = 180;
  std::string token = good;
  const int32_t bad_id = vocab + 5;
  std::memcpy(&token[tokens_at + 4 * 7], &bad_id, 4);
  refused(token, "outside the model's vocabulary");
  std::string position = good;
  const int32_t seven = 7;
  const size_t positions_at = tokens_at + 4 * n + 14 + 1 + 8 + 8;
  int32_t first = -1;
  std::memcpy(&first, &position[positions_at], 4);
  ASSERT_EQ(first, 0);  // the layout above holds
  std::memcpy(&position[positions_at + 4 * 3], &seven, 4);
  refused(position, "holds position 7 in slot 3");
  engine::Engine f16(*m, nullptr, engine::DType::kF32, engine::KvRows::kF16);
  try {
    two.import(f16, good);
    ADD_FAILURE() << "f32 rows were imported into a store for an f16 cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not this model's"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(two.import(eng, good));
  EXPECT_EQ(two.entries(), 1u);
  EXPECT_EQ(two.bytes(), one.bytes());
}

// A sweep worker's side of sharing (harness/sweep_prefix_share.h), deterministic without MPI:
// two BundleRunners stand for two workers. The first runs the haystack's deepest needle and
// gives out the prefix its store kept; the second, offered it, runs another depth of that
// haystack from it (its shared units say how many tokens they reused), with the predictions,
// metrics and token counts of a third runner that was offered nothing. An offer of another
// model's index or a damaged one is not used: the bundle runs as without.
TEST(PrefixReuse, AWorkersBundleStartsFromAnotherWorkersPrefix) {
  const std::string dir =
      std::string(KVB_BINARY_DIR) + "/test_prefix_reuse_workers_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/sweep.yaml";
  std::ofstream(path) << "models:\n  - name: stories\n    path: " << kStories
                      << "\n    tokenizer: " << kStoriesTok << "\n"
                      << "tasks:\n  - name: niah\n    options: {context_lengths: [448], "
                         "depths: [60, 100], haystack: noise, chat: false}\n"
                      << "policies: [full, h2o, snapkv]\nkv_budget: [48]\nseed: [0]\n"
                      << "decode_batch: auto\n";
  const harness::SweepConfig cfg = harness::load_sweep_config(path);
  results::Store store = results::Store::open(dir + "/plan.db", results::Mode::kReadWrite);
  const int64_t run_id = store.begin_run(results::RunInfo{});
  std::map<std::string, std::string> hashes;
  const harness::Plan plan = harness::expand(cfg, store, run_id, &hashes);
  ASSERT_EQ(plan.bundles.size(), 2u);
  // The deeper needle's prompt repeats more of the haystack: the first worker runs it.
  const int deep = plan.bundles[0].sample.fields.at("depth") == "100" ? 0 : 1;
  const harness::WireBundle& other = plan.bundles[1 - deep];
  auto runner = [&] {
    return std::make_unique<harness::BundleRunner>(cfg, true, engine::Device::kCpu,
                                                   engine::DType::kF32, 0);
  };
  auto reused = [](const std::vector<results::UnitResult>& rs) {
    int64_t n = 0;
    for (const auto& r : rs) {
      EXPECT_EQ(r.status, results::UnitStatus::kOk) << r.unit_key << ": " << r.error;
      if (r.measurements) n += r.measurements->prefill_reused;
    }
    return n;
  };
  const auto first = runner();
  EXPECT_EQ(reused(first->run(plan.bundles[deep])), 0);
  const std::vector<std::string> kept = first->take_kept_prefixes();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_TRUE(first->take_kept_prefixes().empty());
  ASSERT_TRUE(harness::is_prefix_message(kept[0]));
  EXPECT_EQ(harness::parse_prefix_message(kept[0]).model, 0);

  const auto alone = runner();
  const std::vector<results::UnitResult> want = alone->run(other);
  EXPECT_EQ(reused(want), 0);
  const auto second = runner();
  second->offer_prefix(kept[0]);
  const std::vector<results::UnitResult> got = second->run(other);
  EXPECT_GT(reused(got), 0);
  EXPECT_TRUE(second->take_kept_prefixes().empty());  // nothing of its own was kept
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(got[i].unit_key);
    ASSERT_TRUE(got[i].prediction && want[i].prediction && got[i].measurements &&
                want[i].measurements);
    EXPECT_EQ(got[i].prediction->text, want[i].prediction->text);
    ASSERT_EQ(got[i].metrics.size(), want[i].metrics.size());
    for (size_t k = 0; k < got[i].metrics.size(); ++k) {
      EXPECT_EQ(got[i].metrics[k].name, want[i].metrics[k].name);
      EXPECT_EQ(got[i].metrics[k].value, want[i].metrics[k].value);
    }
    EXPECT_EQ(got[i].measurements->prompt_tokens, want[i].measurements->prompt_tokens);
    EXPECT_EQ(got[i].measurements->kv_bytes_final, want[i].measurements->kv_bytes_final);
    EXPECT_EQ(got[i].measurements->prompt_sha256, want[i].measurements->prompt_sha256);
  }
  const std::string body(harness::parse_prefix_message(kept[0]).body);
  for (const std::string& offer :
       {harness::prefix_message(1, body), harness::prefix_message(0, body.substr(0, 100))}) {
    const auto third = runner();
    third->offer_prefix(offer);
    EXPECT_EQ(reused(third->run(other)), 0);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvb
