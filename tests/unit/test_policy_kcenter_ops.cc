// subgen_kcenter's ops (kernels/ops/policy_ops.h kcenter_keep, erase; the biased
// subgen_query) on the CPU: the CPU instance against cpu::kcenter_keep_list and hand cases, the
// rounding that lets the device's log cluster sizes equal the CPU's, and the policy's device path
// (taken when the ops are a device instance) run here over host rows by ops that call
// themselves a device: the same caches, outputs and bias rows as the CPU path, with one victim
// per head at a `slide` decode step (what a device applies without uploading a list).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kcenter.h"
#include "kernels/cpu/subgen_counter.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/eviction_plan.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/cpu_policy_ops.h"
#include "kernels/policies/policy.h"

namespace kvb {
namespace {

namespace cpu = kernels::cpu;
using kernels::EvictionPlan;
using kernels::KvCache;
using policies::SlotRows;
using policies::SlotType;

float uniform(uint64_t stream, uint64_t i) {
  return static_cast<float>(2.0 * cpu::counter_uniform(17, 0, static_cast<uint32_t>(stream), i,
                                                       0) -
                            1.0);
}

// A host cache of `layers` x `heads` whose slots hold seeded random keys and values.
KvCache random_cache(int layers, int heads, int d, int len, uint64_t seed) {
  KvCache cache({layers, heads, d}, len + 16);
  std::vector<float> k(d), v(d);
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      for (int s = 0; s < len; ++s) {
        for (int x = 0; x < d; ++x) {
          const uint64_t i = ((static_cast<uint64_t>(l) * heads + h) * 4096 + s) * d + x;
          k[x] = uniform(seed, i);
          v[x] = uniform(seed + 1, i);
        }
        cache.append(l, h, k.data(), v.data(), s);
      }
    }
  }
  return cache;
}

TEST(KCenterOps, CpuInstanceKeepsTheCentresTheWindowAndLogSizes) {
  kvb::kernels::ops::CpuPolicyOps ops;
  const int d = 5;
  KvCache cache = random_cache(1, 3, d, 14, 3);
  std::unique_ptr<SlotRows> bias = ops.make_rows(SlotType::kF32, 1, 3);
  EvictionPlan plan;
  plan.reset(0, 3);
  // Head 0: 4 centres of 10 + a window of 4; head 2: more centres than points (all kept).
  const policies::KCenterKeep heads[] = {{.head = 0, .prefix = 10, .k = 4},
                                         {.head = 2, .prefix = 3, .k = 5}};
  ops.kcenter_keep(cache, heads, bias.get(), plan);
  for (const auto& t : heads) {
    SCOPED_TRACE(t.head);
    std::vector<int32_t> want;
    std::vector<float> want_bias;
    cpu::kcenter_keep_list(cache.layer(0).key(t.head, 0), t.prefix, 14, d, t.k, &want,
                           &want_bias);
    ASSERT_EQ(plan.kind(t.head), EvictionPlan::Kind::kKeep);
    EXPECT_EQ(plan.kept(t.head), want);
    EXPECT_EQ(ops.read_f32(*bias, 0, t.head), want_bias);
  }
  EXPECT_EQ(plan.kind(1), EvictionPlan::Kind::kKeepAll);
  EXPECT_EQ(plan.kept(0).size(), 8u);
  EXPECT_EQ(plan.kept(2).size(), 14u);
  // Sizes: the 10 points fall into 4 clusters, so some centre's log is >= log 2; the window 0.
  const std::vector<float> b = ops.read_f32(*bias, 0, 0);
  float sum = 0;
  for (int c = 0; c < 4; ++c) sum += std::exp(b[c]);
  EXPECT_FLOAT_EQ(sum, 10.0f);
  for (int c = 4; c < 8; ++c) EXPECT_EQ(b[c], 0.0f);
  // Bad heads are named.
  plan.reset(0, 3);
  const policies::KCenterKeep bad[] = {{.head = 1, .prefix = 15, .k = 2}};
  try {
    ops.kcenter_keep(cache, bad, nullptr, plan);
    ADD_FAILURE() << "accepted a prefix past the head";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 15) of 14 slots"), std::string::npos) << e.what();
  }
}

TEST(KCenterOps, CpuInstanceErasesARangeOfEachListedRow) {
  kvb::kernels::ops::CpuPolicyOps ops;
  for (SlotType type : {SlotType::kF32, SlotType::kU64}) {
    std::unique_ptr<SlotRows> rows = ops.make_rows(type, 2, 2);
    const int32_t lengths[] = {6, 4};
    ops.resize(*rows, 1, lengths);
    const policies::RowErase erase[] = {{.head = 0, .first = 2, .count = 3},
                                        {.head = 1, .first = 3, .count = 1}};
    ops.erase(*rows, 1, erase);
    EXPECT_EQ(rows->length(1, 0), 3);
    EXPECT_EQ(rows->length(1, 1), 3);
    const policies::RowErase past[] = {{.head = 1, .first = 2, .count = 2}};
    try {
      ops.erase(*rows, 1, past);
      ADD_FAILURE() << "erased past the row";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[2, 4) of head 1"), std::string::npos) << e.what();
    }
  }
}

// Ops that call themselves a device but keep host rows (the CPU instance's): the policy takes
// its device path, whose every step is then checked here against the CPU path. subgen_query is
// cpu::subgen_query per (row, head) over the host rows with the bias rows.
class HostAsDeviceOps final : public policies::PolicyOps {
 public:
  bool on_device() const override { return true; }
  std::unique_ptr<SlotRows> make_rows(SlotType type, int layers, int heads) override {
    return cpu_.make_rows(type, layers, heads);
  }
  void require_own(const SlotRows& rows) const override { cpu_.require_own(rows); }
  void resize(SlotRows& rows, int layer, std::span<const int32_t> lengths) override {
    cpu_.resize(rows, layer, lengths);
  }
  void accumulate(SlotRows& rows, int layer, const float* src, size_t head_stride,
                  size_t row_stride, int group, policies::GqaReduce how) override {
    cpu_.accumulate(rows, layer, src, head_stride, row_stride, group, how);
  }
  void history_bits(SlotRows& bits, const policies::LayerStats& st, const kernels::KvIndex& cache,
                    int history, bool inv_position) override {
    cpu_.history_bits(bits, st, cache, history, inv_position);
  }
  void append_norms(SlotRows& rows, int layer, std::span<const int32_t> before,
                    const float* vectors, int n, int src_heads, int dim, int expand) override {
    cpu_.append_norms(rows, layer, before, vectors, n, src_heads, dim, expand);
  }
  void scale(SlotRows& rows, int layer, std::span<const int32_t> first, float factor) override {
    cpu_.scale(rows, layer, first, factor);
  }
  void popcount(const SlotRows& bits, int layer, SlotRows& out, int out_layer) override {
    cpu_.popcount(bits, layer, out, out_layer);
  }
  void window_sum(SlotRows& out, int out_layer, const policies::LayerStats& st,
                  std::span<const int32_t> lengths, policies::WindowReduce how,
                  int queries = 0) override {
    cpu_.window_sum(out, out_layer, st, lengths, how, queries);
  }
  void reduce_heads(const SlotRows& in, int in_layer, int group, policies::GqaReduce how,
                    SlotRows& out, int out_layer) override {
    cpu_.reduce_heads(in, in_layer, group, how, out, out_layer);
  }
  void pool(const SlotRows& in, int in_layer, SlotRows& out, int out_layer, int kernel,
            kvb::kernels::cpu::PoolKind kind) override {
    cpu_.pool(in, in_layer, out, out_layer, kernel, kind);
  }
  std::vector<int32_t> count_top_across_heads(const SlotRows& scores, int score_layer,
                                              const kernels::KvIndex& cache, int layer,
                                              int64_t k) override {
    return cpu_.count_top_across_heads(scores, score_layer, cache, layer, k);
  }
  void keep_top(const SlotRows& scores, int score_layer, const kernels::KvIndex& cache,
                std::span<const policies::KeepTop> heads, std::span<SlotRows* const> state,
                EvictionPlan& plan) override {
    cpu_.keep_top(scores, score_layer, cache, heads, state, plan);
  }
  void divide_by_query_counts(SlotRows& rows, int layer, std::span<const int32_t> before,
                              int n_queries) override {
    cpu_.divide_by_query_counts(rows, layer, before, n_queries);
  }
  void cosine_to_mean(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                      policies::CacheRows which, int chunk = 0) override {
    cpu_.cosine_to_mean(out, out_layer, cache, layer, which, chunk);
  }
  void cache_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                   policies::CacheRows which, bool squared) override {
    cpu_.cache_norms(out, out_layer, cache, layer, which, squared);
  }
  void normalize_chunks(SlotRows& rows, int layer, int chunk) override {
    cpu_.normalize_chunks(rows, layer, chunk);
  }
  void combine(SlotRows& rows, int layer, const SlotRows& in, int in_layer,
               policies::Combine how) override {
    cpu_.combine(rows, layer, in, in_layer, how);
  }
  void fill_prefix(SlotRows& rows, int layer, int count, float value) override {
    cpu_.fill_prefix(rows, layer, count, value);
  }
  void lag_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer, int sinks,
                  int lag) override {
    cpu_.lag_scores(out, out_layer, cache, layer, sinks, lag);
  }
  void query_moments(SlotRows& out, int out_layer, const policies::LayerStats& st, int head_dim,
                     int first, const kvb::kernels::ops::PairRotation& rot,
                     bool covariance) override {
    cpu_.query_moments(out, out_layer, st, head_dim, first, rot, covariance);
  }
  void quadratic_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                        const SlotRows& moments, int moments_layer, int group, double a,
                        double b) override {
    cpu_.quadratic_scores(out, out_layer, cache, layer, moments, moments_layer, group, a, b);
  }
  void softmax(SlotRows& rows, int layer, int first) override { cpu_.softmax(rows, layer, first); }
  void add_scalar(SlotRows& rows, int layer, float value) override {
    cpu_.add_scalar(rows, layer, value);
  }
  void fill_top(SlotRows& rows, int layer, std::span<const int32_t> k, float value,
                const SlotRows* by, int by_layer) override {
    cpu_.fill_top(rows, layer, k, value, by, by_layer);
  }
  void projected_value_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                             const void* wo, bool wo_bf16, int dim, int group) override {
    cpu_.projected_value_norms(out, out_layer, cache, layer, wo, wo_bf16, dim, group);
  }
  void chunk_attention_sums(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                            const policies::LayerStats& st, int first, int count,
                            int chunk) override {
    cpu_.chunk_attention_sums(out, out_layer, cache, layer, st, first, count, chunk);
  }
  void slice(const SlotRows& in, int in_layer, int first, int count, SlotRows& out,
             int out_layer) override {
    cpu_.slice(in, in_layer, first, count, out, out_layer);
  }
  void pad_with_max(const SlotRows& in, int in_layer, int before, int after, SlotRows& out,
                    int out_layer) override {
    cpu_.pad_with_max(in, in_layer, before, after, out, out_layer);
  }
  void standardize(SlotRows& rows, int layer) override { cpu_.standardize(rows, layer); }
  void leverage_scores(SlotRows& out, int out_layer, const policies::LayerStats& st,
                       int key_heads, int head_dim, int first, int count, const float* sketch,
                       int k) override {
    cpu_.leverage_scores(out, out_layer, st, key_heads, head_dim, first, count, sketch, k);
  }
  std::vector<float> read_cache_rows(const kernels::KvIndex& cache, int layer, int head, int first,
                                     int count, kernels::ops::CacheRows which) override {
    return cpu_.read_cache_rows(cache, layer, head, first, count, which);
  }
  std::vector<int32_t> read_keep_list(const kernels::EvictionPlan& plan, int head,
                                      int len) override {
    return cpu_.read_keep_list(plan, head, len);
  }
  void replay_attention_max(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                            const policies::LayerStats& st, int sinks, int first,
                            int count) override {
    cpu_.replay_attention_max(out, out_layer, cache, layer, st, sinks, first, count);
  }
  void channel_square_means(const kernels::KvIndex& cache, int layer, kernels::ops::CacheRows which,
                            std::vector<double>* out) override {
    cpu_.channel_square_means(cache, layer, which, out);
  }
  void write_rows(SlotRows& rows, int layer, std::span<const float> values, int length) override {
    cpu_.write_rows(rows, layer, values, length);
  }
  void cumsum(SlotRows& rows, int layer) override { cpu_.cumsum(rows, layer); }
  void gather(const SlotRows& in, int in_layer, std::span<const int32_t> indices,
              std::span<const int32_t> counts, SlotRows& out, int out_layer) override {
    cpu_.gather(in, in_layer, indices, counts, out, out_layer);
  }
  void window_attention(kernels::ops::WindowProbs& out, const kernels::KvIndex& cache, int layer,
                        const policies::LayerStats& st, int w) override {
    cpu_.window_attention(out, cache, layer, st, w);
  }
  std::unique_ptr<kernels::ops::WindowProbs> make_window_probs() override {
    return cpu_.make_window_probs();
  }
  void erase(SlotRows& rows, int layer, std::span<const policies::RowErase> heads) override {
    ++erases;
    cpu_.erase(rows, layer, heads);
  }
  void kcenter_keep(const kernels::KvIndex& cache, std::span<const policies::KCenterKeep> heads,
                    SlotRows* log_sizes, EvictionPlan& plan) override {
    ++kcenters;
    cpu_.kcenter_keep(cache, heads, log_sizes, plan);
  }
  void subgen_query(const policies::SubgenState* state, const policies::SubgenAttend& a,
                    const kernels::KvIndex& cache) override {
    ASSERT_EQ(state, nullptr);
    ASSERT_NE(a.exact_bias, nullptr);
    ++queries;
    const int ckv = cache.shape().num_kv_heads, group = a.num_heads / ckv, d = a.head_dim;
    const kernels::LayerKvView view = kernels::storage_of(cache).layer(a.layer);
    for (int i = 0; i < a.n; ++i) {
      for (int h = 0; h < a.num_heads; ++h) {
        const int kvh = h / group;
        ASSERT_EQ(a.compressed[kvh], 0);
        const std::vector<float> bias = cpu_.read_f32(*a.exact_bias, a.layer, kvh);
        ASSERT_EQ(static_cast<int>(bias.size()), cache.length(a.layer, kvh));
        cpu::SubgenQueryArgs q;
        q.q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * d;
        q.out = a.out + (static_cast<size_t>(i) * a.num_heads + h) * d;
        q.head_dim = d;
        q.scale = a.scale;
        q.exact_keys = view.key(kvh, 0);
        q.exact_values = view.value(kvh, 0);
        q.exact_bias = bias.data();
        q.n_exact = cache.length(a.layer, kvh) - a.n + i + 1;
        cpu::subgen_query(q);
      }
    }
  }
  std::vector<float> read_f32(const SlotRows& rows, int layer, int head) override {
    return cpu_.read_f32(rows, layer, head);
  }
  std::vector<uint64_t> read_u64(const SlotRows& rows, int layer, int head) override {
    return cpu_.read_u64(rows, layer, head);
  }

  int kcenters = 0, erases = 0, queries = 0;

 private:
  kvb::kernels::ops::CpuPolicyOps cpu_;
};

std::vector<std::vector<int32_t>> positions(const kernels::KvIndex& cache) {
  std::vector<std::vector<int32_t>> out;
  for (int l = 0; l < cache.shape().num_layers; ++l) {
    const kernels::LayerIndexView v = cache.layer(l);
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      out.emplace_back(v.position(h), v.position(h) + cache.length(l, h));
    }
  }
  return out;
}

// The policy's CPU path and its device path (HostAsDeviceOps) over the same tokens: a prompt of
// 20 over budget 8 (recent 3: 5 centres), then 6 decode steps, 2 layers of 2 KV heads and 4
// query heads. Caches, attention outputs and plans' kinds are compared at every step.
void run_both(const std::map<std::string, std::string>& opts) {
  const int layers = 2, kv = 2, heads = 4, d = 6, prompt = 20, steps = 6;
  policies::PolicyConfig pc;
  pc.name = "subgen_kcenter";
  pc.kv_budget = 8;
  pc.shape = {layers, heads, kv, d, 4096};
  std::map<std::string, std::string> o = opts;
  o["recent"] = "3";
  pc.options = policies::PolicyOptions(o);
  std::unique_ptr<policies::Policy> host = policies::make_policy(pc);
  std::unique_ptr<policies::Policy> dev = policies::make_policy(pc);
  const bool weighted = host->replaces_attention();
  const bool slide = opts.count("decode") && opts.at("decode") == "slide";
  EXPECT_EQ(dev->attends_with_ops(), weighted);
  EXPECT_EQ(dev->decides_with_ops(), !weighted);
  HostAsDeviceOps ops;
  KvCache hc({layers, kv, d}, prompt + steps + 4), dc({layers, kv, d}, prompt + steps + 4);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  uint64_t counter = 0;
  auto block = [&](int n, bool prefill) {
    std::vector<float> k(d), v(d);
    for (int l = 0; l < layers; ++l) {
      for (int t = 0; t < n; ++t) {
        for (int h = 0; h < kv; ++h) {
          for (int x = 0; x < d; ++x) {
            k[x] = uniform(5, counter);
            v[x] = uniform(6, counter++);
          }
          hc.append(l, h, k.data(), v.data(), hc.next_position() + t);
          dc.append(l, h, k.data(), v.data(), dc.next_position() + t);
        }
      }
      std::vector<float> q(static_cast<size_t>(n) * heads * d);
      for (float& x : q) x = 3 * uniform(7, counter++);
      EvictionPlan hp, dp;
      hp.reset(l, kv);
      dp.reset(l, kv);
      if (weighted) {
        std::vector<float> ho(q.size()), dout(q.size(), 9.0f);
        policies::AttendArgs a;
        a.layer = l;
        a.n = n;
        a.num_heads = heads;
        a.head_dim = d;
        a.scale = scale;
        a.q = q.data();
        a.out = ho.data();
        a.prefill = prefill;
        host->attend(a, hc, hp);
        a.out = dout.data();
        a.ops = &ops;
        a.exact = [&] { cpu::attention({dout.data(), q.data(), dc.layer(l), n, heads, scale}); };
        dev->attend(a, dc, dp);
        EXPECT_EQ(ho, dout) << "layer " << l;
      } else {
        policies::LayerStats st;
        st.layer = l;
        st.n_new = n;
        st.num_heads = heads;
        st.ops = &policies::cpu_policy_ops();
        if (prefill) {
          host->on_prefill_layer(st, hc, hp);
        } else {
          host->on_decode_layer(st, hc, hp);
        }
        st.ops = &ops;
        if (prefill) {
          dev->on_prefill_layer(st, dc, dp);
        } else {
          dev->on_decode_layer(st, dc, dp);
        }
      }
      if (!prefill && slide) {
        // At the budget a step drops one slot per head: a victim, no list.
        for (int h = 0; h < kv; ++h) EXPECT_EQ(dp.kind(h), EvictionPlan::Kind::kVictim);
      }
      hc.apply(hp);
      dc.apply(dp);
    }
    hc.advance_position(n);
    dc.advance_position(n);
    EXPECT_EQ(positions(hc), positions(dc));
  };
  block(prompt, true);
  for (const auto& p : positions(dc)) EXPECT_EQ(p.size(), 8u);
  EXPECT_EQ(ops.kcenters, layers);  // one kcenter_keep per layer, every head in it
  for (int s = 0; s < steps; ++s) block(1, false);
  for (const auto& p : positions(dc)) EXPECT_EQ(p.size(), slide ? 8u : 8u + steps);
  EXPECT_EQ(ops.erases, weighted && slide ? layers * steps : 0);
  EXPECT_EQ(ops.queries, weighted ? layers * steps : 0);  // the prompt's queries see no bias
  EXPECT_EQ(dev->state_bytes(), host->state_bytes());
  // A clone carries the device state: both continue alike.
  std::unique_ptr<policies::Policy> fork = dev->clone();
  EXPECT_EQ(fork->state_bytes(), dev->state_bytes());
}

TEST(SubgenKCenterDevicePath, PlainAppendMatchesTheCpuPath) { run_both({}); }
TEST(SubgenKCenterDevicePath, PlainSlideMatchesTheCpuPath) { run_both({{"decode", "slide"}}); }
TEST(SubgenKCenterDevicePath, WeightedAppendMatchesTheCpuPath) {
  run_both({{"weight_by_cluster_size", "true"}});
}
TEST(SubgenKCenterDevicePath, WeightedSlideMatchesTheCpuPath) {
  run_both({{"weight_by_cluster_size", "true"}, {"decode", "slide"}});
}

}  // namespace
}  // namespace kvb
