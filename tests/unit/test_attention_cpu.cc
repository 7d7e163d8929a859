// cpu::attention against a plain transcription of its first version (kernels/cpu/attention.cc
// before the aligned-rows rework), bit for bit: outputs, column sums and last-w probabilities,
// every shape class (one query, a few, blocks of 32 with a partial last one, ragged heads, GQA
// groups 1-8, head_dim not a multiple of 16, windows, statistics, aligned and unaligned caches,
// 1-3 threads) and the one case where dropping P x V's trailing 0 x v products could change a
// bit (an output that is zero with every lane at -0).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/vec.h"
#include "kernels/f16.h"
#include "kernels/kv_cache.h"

namespace kvb::kernels {
namespace {

// The first version, one query row at a time. Prefill blocks (n >= 32) took P x V over the
// whole head (window: the block's span, [lo, vis_max)) with P zero outside the row's visible
// slots, lanes by the index within that range; fewer queries took it over the visible slots,
// lanes by the slot. Scores in matmul's order, softmax with a double sum in slot order (its exp
// exp_fast under fast_exp, --dtype native's).
void first_version(const cpu::AttentionArgs& a, std::vector<float>* out,
                   std::vector<float>* col_sums, std::vector<float>* last_probs) {
  const LayerKvView& kv = a.kv;
  const int d = kv.head_dim, n = a.n, group = a.num_heads / kv.num_kv_heads;
  out->assign(static_cast<size_t>(n) * a.num_heads * d, 0.0f);
  if (a.col_sums) col_sums->assign(static_cast<size_t>(a.num_heads) * a.stats_stride, 0.0f);
  if (a.last_probs) {
    last_probs->assign(static_cast<size_t>(a.num_heads) * a.last_w * a.stats_stride, 0.0f);
  }
  for (int h = 0; h < a.num_heads; ++h) {
    const int kvh = h / group, len = kv.lengths[kvh];
    for (int i = 0; i < n; ++i) {
      const bool blocked = n >= 32;
      const int i0 = i / 32 * 32, i1 = std::min(n, i0 + 32);
      const int lo = blocked && a.window > 0 ? std::max(0, len - n + i0 - a.window + 1) : 0;
      const int width = blocked ? (a.window > 0 ? len - n + i1 - lo : len) : 0;
      // Relative to lo: the row's slots [first, visible).
      const int visible = len - n + i + 1 - lo;
      const int first = a.window > 0 ? std::max(0, visible - a.window) : 0;
      std::vector<float> p(std::max(visible, width), 0.0f);
      const float* q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * d;
      float mx = -INFINITY;
      for (int s = first; s < visible; ++s) {
        p[s] = cpu::dot_matmul_order(q, kv.key(kvh, lo + s), d) * a.scale;
        mx = std::max(mx, p[s]);
      }
      double sum = 0;
      for (int s = first; s < visible; ++s) {
        p[s] = a.fast_exp ? cpu::exp_fast(p[s] - mx) : std::exp(p[s] - mx);
        sum += p[s];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int s = first; s < visible; ++s) p[s] *= inv;
      float* o = out->data() + (static_cast<size_t>(i) * a.num_heads + h) * d;
      for (int j = 0; j < d; ++j) {
        float lanes[16] = {};
        const int s0 = blocked ? 0 : first, s1 = blocked ? width : visible;
        for (int s = s0; s < s1; ++s) {
          lanes[s & 15] = std::fma(p[s], kv.value(kvh, lo + s)[j], lanes[s & 15]);
        }
        o[j] = cpu::tree16(lanes);
      }
      if (a.col_sums) {
        float* cs = col_sums->data() + static_cast<size_t>(h) * a.stats_stride;
        for (int s = 0; s < visible; ++s) cs[s] += p[s];
      }
      const int w_index = i - (n - a.last_w);
      if (a.last_probs && w_index >= 0) {
        std::memcpy(
            last_probs->data() + (static_cast<size_t>(h) * a.last_w + w_index) * a.stats_stride,
            p.data(), visible * sizeof(float));
      }
    }
  }
}

// A layer's cache with its own storage: keys and values start `offset` floats past a 64-byte
// boundary (0: the aligned case the kernel reads in place).
struct Layer {
  float* keys_base = nullptr;
  float* values_base = nullptr;
  std::vector<int32_t> positions, lengths;
  LayerKvView view{};
  Layer(int heads, int d, int capacity, std::vector<int32_t> lens, int offset)
      : positions(static_cast<size_t>(heads) * capacity, 0), lengths(std::move(lens)) {
    const size_t count = static_cast<size_t>(heads) * capacity * d + 16;
    keys_base = new (std::align_val_t{64}) float[count]();
    values_base = new (std::align_val_t{64}) float[count]();
    view = {keys_base + offset,
            values_base + offset,
            positions.data(),
            lengths.data(),
            heads,
            d,
            capacity};
  }
  ~Layer() {
    ::operator delete[](keys_base, std::align_val_t{64});
    ::operator delete[](values_base, std::align_val_t{64});
  }
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;
};

struct Case {
  const char* name;
  int n, num_heads, num_kv_heads, head_dim;
  std::vector<int32_t> lengths;  // per KV head, each >= n
  int window = 0;
  bool col_sums = false;
  int last_w = 0;
  int offset = 0;  // floats past a 64-byte boundary
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what,
               const char* name) {
  EXPECT_EQ(a.size(), b.size()) << name << " " << what;
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y) {
      ADD_FAILURE() << name << " " << what << "[" << i << "]: " << a[i] << " (0x" << std::hex << x
                    << ") vs first version " << b[i] << " (0x" << y << ")" << std::dec;
      return false;
    }
  }
  return true;
}

// f16: run the kernel on this view of the same rows stored as f16 instead (the expectation is
// still the first version on layer's f32 rows, which hold the f16 values).
void run_case(const Case& c, Layer& layer, const std::vector<float>& q,
              const LayerKvView* f16 = nullptr, bool fast_exp = false) {
  const int max_len = *std::max_element(c.lengths.begin(), c.lengths.end());
  cpu::AttentionArgs a;
  std::vector<float> out(static_cast<size_t>(c.n) * c.num_heads * c.head_dim, -1.0f);
  std::vector<float> cs, lp;
  a.out = out.data();
  a.q = q.data();
  a.kv = layer.view;
  a.n = c.n;
  a.num_heads = c.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.window = c.window;
  a.fast_exp = fast_exp;
  a.stats_stride = max_len + 3;
  if (c.col_sums) {
    cs.assign(static_cast<size_t>(c.num_heads) * a.stats_stride, 7.0f);
    a.col_sums = cs.data();
  }
  if (c.last_w > 0) {
    lp.assign(static_cast<size_t>(c.num_heads) * c.last_w * a.stats_stride, 7.0f);
    a.last_probs = lp.data();
    a.last_w = c.last_w;
  }
  if (f16 != nullptr) a.kv = *f16;
  cpu::attention(a);
  a.kv = layer.view;
  std::vector<float> want_out, want_cs, want_lp;
  first_version(a, &want_out, &want_cs, &want_lp);
  same_bits(out, want_out, "out", c.name);
  if (c.col_sums) same_bits(cs, want_cs, "col_sums", c.name);
  if (c.last_w > 0) same_bits(lp, want_lp, "last_probs", c.name);
}

std::vector<Case> shape_cases() {
  return {
      {"decode, one query, GQA 3", 1, 9, 3, 64, {1000, 1000, 1000}},
      {"decode with statistics", 1, 9, 3, 64, {700, 513, 1}, 0, true, 1},
      {"decode under a window", 1, 4, 2, 32, {300, 17}, 16},
      {"decode, head_dim 128, group 8", 1, 16, 2, 128, {2000, 37}, 0, false, 0, 4},
      {"decode, head_dim 40, group 7", 1, 7, 1, 40, {129}, 0, true, 1},
      {"a few queries under a window, ragged", 3, 6, 2, 48, {40, 3}, 20, false, 0, 4},
      {"a few queries, head_dim 200", 2, 2, 1, 200, {75}, 0, true, 2},
      {"a few queries, ragged heads", 5, 4, 4, 40, {105, 5, 64, 33}, 0, true, 5, 4},
      {"31 queries (row path's largest)", 31, 2, 1, 64, {31}, 0, true, 7},
      {"32 queries (one block)", 32, 2, 2, 64, {32, 90}},
      {"two blocks, the second partial", 40, 4, 2, 64, {40, 77}, 0, false, 0, 4},
      {"prefill with column sums", 64, 9, 3, 64, {64, 64, 64}, 0, true, 0},
      {"blocks after a prefix, head_dim 40", 100, 6, 3, 40, {137, 100, 150}, 0, true, 7},
      {"head_dim 80, last-w only, unaligned", 70, 8, 2, 80, {90, 70}, 0, false, 16, 3},
      {"window inside one block", 33, 2, 1, 32, {33}, 10},
      {"window across blocks after a prefix", 70, 8, 2, 80, {90, 120}, 48, false, 0, 4},
      {"group 4, head_dim 128", 96, 8, 2, 128, {200, 96}, 0, true, 32},
      {"group 1, head_dim 16", 65, 3, 3, 16, {65, 66, 300}},
      {"decode, head_dim 256, group 4 (Gemma 3)", 1, 4, 1, 256, {700}, 0, true, 1},
      {"a few queries, head_dim 256, under a window", 3, 4, 1, 256, {600}, 512, false, 0, 2},
      {"a few queries, head_dim 20 (a P x V tail of 4)", 2, 6, 2, 20, {90, 41}, 0, true, 2},
  };
}

TEST(AttentionCpu, EveryShapeGivesTheFirstVersionsBits) {
  const std::vector<Case> cases = shape_cases();
  std::mt19937 rng(20261126);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int capacity = *std::max_element(c.lengths.begin(), c.lengths.end()) + 5;
    Layer layer(c.num_kv_heads, c.head_dim, capacity, c.lengths, c.offset);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      for (int s = 0; s < capacity; ++s) {
        for (int j = 0; j < c.head_dim; ++j) {
          layer.view.key(h, s)[j] = normal(rng);
          layer.view.value(h, s)[j] = normal(rng);
        }
      }
    }
    // Sharp rows too: scaled queries make some probabilities underflow to 0.
    std::vector<float> q(static_cast<size_t>(c.n) * c.num_heads * c.head_dim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = normal(rng) * (i % 7 == 0 ? 30.0f : 1.0f);
    // Thread counts change how the heads are split into jobs, not the bits.
    const int threads = omp_get_max_threads();
    for (const int t : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << t << " threads");
      omp_set_num_threads(t);
      run_case(c, layer, q);
    }
    omp_set_num_threads(threads);
  }
}

// `count` keys and values drawn from `normal` and rounded to f16 (*k16, *v16), with their f32
// values in layer's rows (the expectation's cache).
void fill_f16_rows(Layer& layer, size_t count, std::mt19937& rng,
                   std::normal_distribution<float>& normal, std::vector<uint16_t>* k16,
                   std::vector<uint16_t>* v16) {
  k16->resize(count);
  v16->resize(count);
  for (size_t i = 0; i < count; ++i) {
    (*k16)[i] = f32_to_f16(normal(rng));
    (*v16)[i] = f32_to_f16(normal(rng));
    layer.view.keys[i] = f16_to_f32((*k16)[i]);
    layer.view.values[i] = f16_to_f32((*v16)[i]);
  }
}

// A shape case over f16 rows: its layer (the f32 values of the rows, the expectation's cache),
// the rows as f16 (fill_f16_rows) and its queries (every 7th scaled by 30: some probabilities
// underflow to 0).
struct F16Case {
  std::unique_ptr<Layer> layer;
  std::vector<uint16_t> k16, v16;
  std::vector<float> q;
  F16Case(const Case& c, std::mt19937& rng, std::normal_distribution<float>& normal) {
    const int capacity = *std::max_element(c.lengths.begin(), c.lengths.end()) + 5;
    layer = std::make_unique<Layer>(c.num_kv_heads, c.head_dim, capacity, c.lengths, c.offset);
    fill_f16_rows(*layer, static_cast<size_t>(c.num_kv_heads) * capacity * c.head_dim, rng, normal,
                  &k16, &v16);
    q.resize(static_cast<size_t>(c.n) * c.num_heads * c.head_dim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = normal(rng) * (i % 7 == 0 ? 30.0f : 1.0f);
  }
  // The kernel's view: f16 values, and f16 keys or (f32_keys) the f32 ones.
  LayerKvView view(bool f32_keys) {
    LayerKvView v = layer->view;
    v.keys = f32_keys ? layer->view.keys : nullptr;
    v.keys16 = f32_keys ? nullptr : k16.data();
    v.values = nullptr;
    v.values16 = v16.data();
    return v;
  }
};

// A cache of f16 rows (KvCacheShape::f16, --dtype native): the kernel converts them exactly, so
// every output and statistic is the first version's on the same values held as f32. Every shape
// class, 1-3 threads; all rows f16, and f32 keys beside f16 values (a rolling-positions cache).
// The decode cases' heads of 1,000-2,000 slots span several of the kernel's 512-key chunks.
TEST(AttentionCpu, F16RowsGiveTheBitsOfTheirValuesAsF32) {
  std::mt19937 rng(20261205);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Case& c : shape_cases()) {
    SCOPED_TRACE(c.name);
    F16Case f(c, rng, normal);
    const int threads = omp_get_max_threads();
    for (const bool f32_keys : {false, true}) {
      const LayerKvView v = f.view(f32_keys);
      for (const int t : {1, 2, 3}) {
        SCOPED_TRACE(testing::Message() << t << " threads, " << (f32_keys ? "f32" : "f16")
                                        << " keys");
        omp_set_num_threads(t);
        run_case(c, *f.layer, f.q, &v);
      }
    }
    omp_set_num_threads(threads);
  }
}

// --dtype native's softmax (AttentionArgs::fast_exp): every shape class over f16 rows, 1-3
// threads, is the first version with exp_fast for std::exp, bit for bit; and it is not the
// reference's (some output differs from std::exp's, so the flag reaches the softmax).
TEST(AttentionCpu, FastExpGivesTheFirstVersionsBitsWithExpFast) {
  std::mt19937 rng(20261207);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int64_t differ = 0;
  for (const Case& c : shape_cases()) {
    SCOPED_TRACE(c.name);
    F16Case f(c, rng, normal);
    const std::vector<float>& q = f.q;
    const LayerKvView v = f.view(false);
    const int threads = omp_get_max_threads();
    for (const int t : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << t << " threads");
      omp_set_num_threads(t);
      run_case(c, *f.layer, q, &v, true);
    }
    omp_set_num_threads(threads);
    // The same call with std::exp: its outputs are not all the fast ones.
    cpu::AttentionArgs a;
    std::vector<float> fast(q.size()), exact(q.size());
    a.q = q.data();
    a.kv = v;
    a.n = c.n;
    a.num_heads = c.num_heads;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.window = c.window;
    a.out = exact.data();
    cpu::attention(a);
    a.fast_exp = true;
    a.out = fast.data();
    cpu::attention(a);
    for (size_t i = 0; i < q.size(); ++i) differ += fast[i] != exact[i];
  }
  EXPECT_GT(differ, 0);
}

// Decode scores over f16 keys read in place (8 keys a block on AVX2, 16 on AVX-512): every head
// length from 2 to 41 slots (whole blocks and every remainder of both), 1-2 queries of 5 query heads
// on one KV head (row groups of 4 and 1), head_dim 64 and 256 (the widest read in place), and a
// window that starts the span mid-block; each the first version's bits on the f32 values.
TEST(AttentionCpu, F16KeysAtEverySpanRemainderGiveTheFirstVersionsBits) {
  std::mt19937 rng(20261206);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int d : {64, 256}) {
    for (int len = 2; len <= 41; ++len) {
      for (const int n : {1, 2}) {
        for (const int window : {0, 13}) {
          SCOPED_TRACE(testing::Message() << "head_dim " << d << ", " << len << " slots, " << n
                                          << " queries, window " << window);
          const Case c{"span sweep", n, 5, 1, d, {len}, window, window == 0, window == 0 ? n : 0};
          Layer layer(1, d, len + 3, c.lengths, 0);
          std::vector<uint16_t> k16, v16;
          fill_f16_rows(layer, static_cast<size_t>(len + 3) * d, rng, normal, &k16, &v16);
          std::vector<float> q(static_cast<size_t>(n) * 5 * d);
          for (float& x : q) x = normal(rng);
          LayerKvView v = layer.view;
          v.keys = nullptr;
          v.keys16 = k16.data();
          v.values = nullptr;
          v.values16 = v16.data();
          run_case(c, layer, q, &v);
        }
      }
    }
  }
}

// attention_batch: each call's outputs and statistics are those of the first version alone,
// with the calls' heads shared among 1-3 threads in one region (and a call of 40 queries, which
// takes the blocked path, among them).
TEST(AttentionCpu, BatchGivesEachCallsBits) {
  const std::vector<Case> cases = {
      {"seq 0, h2o-like", 1, 9, 3, 64, {300, 120, 301}, 0, true, 0},
      {"seq 1, full", 1, 9, 3, 64, {1000, 1000, 1000}},
      {"seq 2, snapkv-like last-w", 1, 9, 3, 64, {129, 130, 128}, 0, false, 1, 4},
      {"seq 3, a few queries", 4, 9, 3, 64, {50, 60, 70}, 0, true, 2},
      {"seq 4, a block", 40, 9, 3, 64, {40, 41, 90}, 0, true, 8},
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Call {
    std::unique_ptr<Layer> layer;
    std::vector<float> q, out, cs, lp;
  };
  std::vector<Call> calls(cases.size());
  std::vector<cpu::AttentionArgs> args(cases.size());
  for (size_t b = 0; b < cases.size(); ++b) {
    const Case& c = cases[b];
    const int capacity = *std::max_element(c.lengths.begin(), c.lengths.end()) + 2;
    Call& k = calls[b];
    k.layer = std::make_unique<Layer>(c.num_kv_heads, c.head_dim, capacity, c.lengths, c.offset);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      for (int s = 0; s < capacity; ++s) {
        for (int j = 0; j < c.head_dim; ++j) {
          k.layer->view.key(h, s)[j] = normal(rng);
          k.layer->view.value(h, s)[j] = normal(rng);
        }
      }
    }
    k.q.resize(static_cast<size_t>(c.n) * c.num_heads * c.head_dim);
    for (float& x : k.q) x = normal(rng);
    k.out.assign(k.q.size(), -1.0f);
    cpu::AttentionArgs& a = args[b];
    a.out = k.out.data();
    a.q = k.q.data();
    a.kv = k.layer->view;
    a.n = c.n;
    a.num_heads = c.num_heads;
    a.scale = 0.125f;
    a.stats_stride = capacity;
    if (c.col_sums) {
      k.cs.assign(static_cast<size_t>(c.num_heads) * capacity, 3.0f);
      a.col_sums = k.cs.data();
    }
    if (c.last_w > 0) {
      k.lp.assign(static_cast<size_t>(c.num_heads) * c.last_w * capacity, 3.0f);
      a.last_probs = k.lp.data();
      a.last_w = c.last_w;
    }
  }
  const int threads = omp_get_max_threads();
  for (const int t : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << t << " threads");
    omp_set_num_threads(t);
    cpu::attention_batch(args);
    for (size_t b = 0; b < cases.size(); ++b) {
      std::vector<float> want_out, want_cs, want_lp;
      first_version(args[b], &want_out, &want_cs, &want_lp);
      same_bits(calls[b].out, want_out, "out", cases[b].name);
      if (cases[b].col_sums) same_bits(calls[b].cs, want_cs, "col_sums", cases[b].name);
      if (cases[b].last_w > 0) same_bits(calls[b].lp, want_lp, "last_probs", cases[b].name);
    }
  }
  omp_set_num_threads(threads);
}

// P x V stops at a block's last visible slot; the first version went on over the rest of the
// head with P = 0. Adding 0 x v is exact except on a lane sum of -0, which a 0 x v of positive v
// turns into +0. Uniform probabilities (q = 0) of at most 1/2 times the smallest negative
// subnormal round to -0 in every lane of the first block's rows 15-31 (16 or more visible
// slots); the later slots' values are +1. Without the recomputation of zero outputs this case
// gives -0 where the first version gave +0.
TEST(AttentionCpu, ZeroOutputsKeepTheFirstVersionsSign) {
  const int n = 64, d = 16;
  Layer layer(1, d, n, {n}, 0);
  for (int s = 0; s < n; ++s) {
    for (int j = 0; j < d; ++j) {
      layer.view.key(0, s)[j] = 0.25f * static_cast<float>((s * 7 + j) % 5);
      layer.view.value(0, s)[j] =
          j == 3 ? (s < 32 ? -std::numeric_limits<float>::denorm_min() : 1.0f) : 0.5f;
    }
  }
  std::vector<float> q(static_cast<size_t>(n) * d, 0.0f);
  Case c{"zero outputs", n, 1, 1, d, {n}};
  run_case(c, layer, q);
  // The case does what it says: the first version's output there is +0, and a row that stops
  // at the block's last slot gives -0.
  std::vector<float> out, cs, lp;
  cpu::AttentionArgs a;
  a.q = q.data();
  a.kv = layer.view;
  a.n = n;
  a.num_heads = 1;
  a.scale = 0.25f;
  first_version(a, &out, &cs, &lp);
  EXPECT_EQ(out[20 * d + 3], 0.0f);
  EXPECT_FALSE(std::signbit(out[20 * d + 3]));
  float lanes[16] = {};
  for (int s = 0; s < 32; ++s) {
    const float p = s <= 20 ? 1.0f / 21 : 0.0f;
    lanes[s & 15] = std::fma(p, layer.view.value(0, s)[3], lanes[s & 15]);
  }
  EXPECT_TRUE(std::signbit(cpu::tree16(lanes)));
}

}  // namespace
}  // namespace kvb::kernels
