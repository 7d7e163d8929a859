// `subgen_kcenter`: what SubGen's experiments ran (seed 003, Sec. 3.2; POLICIES.md
// `subgen_kcenter`): once, after the prompt, each (layer, KV head) over budget keeps its last
// `recent` tokens and kv_budget - recent centres chosen by greedy farthest-point k-center
// (kernels/cpu/kcenter.h, first centre the first token) on the post-RoPE keys of the rest.
// `weight_by_cluster_size` adds log(cluster size) to a centre's logit: the engine has no per-slot
// bias, so that variant replaces attention (exact softmax over the cache with the bias; without
// any bias it is the engine's own attention, bit for bit). Decode `append` keeps every new token;
// `slide` drops the oldest token after the centres whenever a head exceeds the budget.
// On a device engine (the ops of LayerStats / AttendArgs are a device instance) the host makes
// the same choices from lengths, and the device does the work on its own rows through the ops
// table: k-center (kcenter_keep: device keep lists), the bias rows (f32 SlotRows: resize,
// erase) and the biased softmax (subgen_query with no sketch). The CPU path is the reference.
#include <algorithm>
#include <cmath>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/budget.h"
#include "kernels/cpu/kcenter.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/policies/policies.h"
#include "kernels/ops/policy_ops.h"
#include "kernels/ops/slot_state.h"

namespace kvb::policies {

using kernels::ops::SlotState;
namespace {

namespace cpu = kvb::kernels::cpu;

class SubgenKCenter final : public Policy {
 public:
  explicit SubgenKCenter(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    split_ = cpu::subgen_kcenter_split(c.kv_budget, o.get_int("recent", -1, 0, c.kv_budget));
    weighted_ = o.get_bool("weight_by_cluster_size", false);
    slide_ = o.get_string("decode", "append", {"append", "slide"}) == "slide";
    const size_t units = static_cast<size_t>(c.shape.num_layers) * cache_kv_heads();
    protected_.assign(units, 0);
    compressed_.assign(units, 0);
    log_size_ = SlotState<float>(c.shape.num_layers, cache_kv_heads());
  }

  bool replaces_attention() const override { return weighted_; }
  // On a device the keys are read there: by the hooks through LayerStats::ops (the plain
  // variant), or by attend() through AttendArgs::ops (the weighted one).
  bool decides_with_ops() const override { return !weighted_; }
  bool attends_with_ops() const override { return weighted_; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    PolicyOps& ops = ops_of(st);
    if (ops.on_device()) {
      prefill_on_device(st.layer, ops, cache, plan);
      return;
    }
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) after_prefill(st.layer, h, cache, plan);
  }
  bool evicts_at_decode() const override { return slide_; }
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    if (!slide_) return;
    PolicyOps& ops = ops_of(st);
    PolicyOps* device = ops.on_device() ? &ops : nullptr;
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) slide(st.layer, h, cache, plan, device);
    if (device) flush_erase(st.layer, *device);
  }

  // weight_by_cluster_size only. The engine skips the hooks for such policies, so this runs them:
  // a prefill block -> after_prefill, one decode token -> slide; other blocks (no hook) keep all.
  void attend(const AttendArgs& a, const kernels::KvIndex& cache,
              kernels::EvictionPlan& plan) override {
    if (a.ops && a.ops->on_device()) {
      attend_on_device(a, *a.ops, cache, plan);
      return;
    }
    const int layer = a.layer, d = a.head_dim;
    const int ckv = cache.shape().num_kv_heads;
    const int group = a.num_heads / ckv;
    if (cache.next_position() == 0) {
      for (int h = 0; h < ckv; ++h) {
        protected_[index(layer, h)] = 0;
        compressed_[index(layer, h)] = 0;
        log_size_.at(layer, h).clear();
      }
    }
    bool any_bias = false;
    for (int h = 0; h < ckv; ++h) {
      std::vector<float>& bias = log_size_.at(layer, h);
      bias.resize(cache.length(layer, h), 0.0f);  // the block's new tokens: clusters of one
      for (float b : bias) any_bias |= b != 0.0f;
    }
    kernels::LayerKvView view =  // the CPU's path: its cache holds the rows
        host_layer(a.ops ? *a.ops : cpu_policy_ops(), cache, layer, nullptr);
    if (!any_bias) {
      cpu::attention({a.out, a.q, view, a.n, a.num_heads, a.scale});
    } else {
      const int rows = a.n * a.num_heads;
#pragma omp parallel for schedule(dynamic, 4) if (rows > 64)
      for (int job = 0; job < rows; ++job) {
        const int i = job / a.num_heads, h = job % a.num_heads, kvh = h / group;
        cpu::SubgenQueryArgs q;  // an empty sketch: exact softmax with per-slot logit bias
        q.q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * d;
        q.out = a.out + (static_cast<size_t>(i) * a.num_heads + h) * d;
        q.head_dim = d;
        q.scale = a.scale;
        q.exact_keys = view.key(kvh, 0);
        q.exact_values = view.value(kvh, 0);
        q.exact_bias = log_size_.at(layer, kvh).data();
        q.n_exact = cache.length(layer, kvh) - a.n + i + 1;
        cpu::subgen_query(q);
      }
    }
    if (a.prefill) {
      for (int h = 0; h < ckv; ++h) after_prefill(layer, h, cache, plan);
    } else if (a.n == 1 && slide_) {
      for (int h = 0; h < ckv; ++h) slide(layer, h, cache, plan, nullptr);
    }
  }

  size_t state_bytes() const override { return log_size_.bytes() + bias_.bytes(); }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<SubgenKCenter>(*this); }

 private:
  size_t index(int layer, int head) const {
    return static_cast<size_t>(layer) * cache_kv_heads() + head;
  }

  // The one-shot compression, the first time a prefill leaves the head over budget. A head whose
  // prompt fits protects every token before its recent window (k-center on at most k points
  // keeps them all). Later prefill blocks on a compressed head count as window tokens.
  void after_prefill(int layer, int h, const kernels::KvIndex& cache, kernels::EvictionPlan& plan) {
    const int len = cache.length(layer, h);
    const size_t u = index(layer, h);
    if (weighted_) log_size_.at(layer, h).resize(len, 0.0f);
    if (compressed_[u]) {
      slide(layer, h, cache, plan, nullptr);
      return;
    }
    if (len <= kv_budget()) {
      protected_[u] = std::max(0, len - split_.recent);
      return;
    }
    const int prefix = len - split_.recent;  // > kv_budget - recent = centres
    // The CPU's path (a device decides through kcenter_keep): its cache holds the rows.
    kernels::LayerKvView view = host_layer(cpu_policy_ops(), cache, layer, nullptr);
    std::vector<int32_t> keep;
    const int m = cpu::kcenter_keep_list(view.key(h, 0), prefix, len, view.head_dim,
                                         split_.centres, &keep,
                                         weighted_ ? &log_size_.at(layer, h) : nullptr);
    plan.keep(h, std::move(keep));
    protected_[u] = m;
    compressed_[u] = 1;
  }

  // decode: slide: drop the oldest tokens after the protected centres while over budget
  // (EvictionPlan::drop: one victim at a decode step); `device`: the bias rows live there,
  // their entries leave at flush_erase.
  void slide(int layer, int h, const kernels::KvIndex& cache, kernels::EvictionPlan& plan,
             PolicyOps* device) {
    if (!slide_) return;
    const int len = cache.length(layer, h);
    const int over = len - kv_budget();
    const int first = protected_[index(layer, h)];
    if (over <= 0 || first >= len) return;
    const int drop = std::min(over, len - first);
    if (weighted_ && device) erase_.push_back({.head = h, .first = first, .count = drop});
    if (weighted_ && !device) {
      std::vector<float>& bias = log_size_.at(layer, h);  // one entry per slot
      bias.erase(bias.begin() + first, bias.begin() + first + drop);
    }
    plan.drop(h, first, drop, len);
  }

  // ---- the device path: the CPU's choices from lengths, the work on the device's rows ----

  // after_prefill for every head of the layer: the heads compressing now go to one
  // kcenter_keep (device keep lists and, weighted, log sizes), compressed heads slide.
  void prefill_on_device(int layer, PolicyOps& ops, const kernels::KvIndex& cache,
                         kernels::EvictionPlan& plan) {
    kcenter_.clear();
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(layer, h);
      const size_t u = index(layer, h);
      if (compressed_[u]) {
        slide(layer, h, cache, plan, &ops);
      } else if (len <= kv_budget()) {
        protected_[u] = std::max(0, len - split_.recent);
      } else {
        const int prefix = len - split_.recent;
        kcenter_.push_back({.head = h, .prefix = prefix, .k = split_.centres});
        protected_[u] = std::min(split_.centres, prefix);  // kcenter_greedy's count
        compressed_[u] = 1;
      }
    }
    // A layer's heads hold equal lengths (every plan of this policy treats them alike), so they
    // compress together; a device plan cannot mix device lists with host decisions.
    KVB_CHECK(kcenter_.empty() || !plan.changes_any())
        << "subgen_kcenter: layer " << layer << " has heads compressing and heads sliding in "
        << "one prefill block";
    if (!kcenter_.empty()) {
      ops.kcenter_keep(cache, kcenter_, weighted_ ? bias_.get() : nullptr, plan);
    }
    flush_erase(layer, ops);
  }

  void flush_erase(int layer, PolicyOps& ops) {
    if (!erase_.empty()) ops.erase(*bias_, layer, erase_);
    erase_.clear();
  }

  // The weighted variant's attend() on the device: bias rows as long as the cache (new slots
  // 0), the engine's attention while no head of the layer has a centre with a bias (the CPU's
  // any_bias: a head compressed with m >= 1 centres over prefix > m keys has a cluster of two
  // or more, log >= log 2), else the exact softmax with the bias rows (subgen_query, no sketch).
  void attend_on_device(const AttendArgs& a, PolicyOps& ops, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) {
    const int layer = a.layer, ckv = cache.shape().num_kv_heads;
    KVB_CHECK(a.num_heads % ckv == 0)
        << "subgen_kcenter: " << a.num_heads << " query heads over " << ckv << " KV heads";
    SlotRows& bias = rows_of(bias_, ops, SlotType::kF32, config().shape.num_layers, ckv);
    lengths_.assign(ckv, 0);
    if (cache.next_position() == 0) {
      for (int h = 0; h < ckv; ++h) {
        protected_[index(layer, h)] = 0;
        compressed_[index(layer, h)] = 0;
      }
      ops.resize(bias, layer, lengths_);  // a new sequence: its rows start from zeros
    }
    bool any_bias = false;
    for (int h = 0; h < ckv; ++h) {
      lengths_[h] = cache.length(layer, h);
      any_bias |= compressed_[index(layer, h)] && protected_[index(layer, h)] > 0;
    }
    ops.resize(bias, layer, lengths_);
    if (!any_bias) {
      KVB_CHECK(static_cast<bool>(a.exact)) << "subgen_kcenter: a device call without the "
                                               "engine's attention (AttendArgs::exact)";
      a.exact();
    } else {
      no_sketch_.assign(ckv, 0);
      ops.subgen_query(nullptr,
                       {.layer = layer,
                        .n = a.n,
                        .num_heads = a.num_heads,
                        .head_dim = a.head_dim,
                        .scale = a.scale,
                        .q = a.q,
                        .out = a.out,
                        .compressed = no_sketch_,
                        .exact_bias = &bias},
                       cache);
    }
    if (a.prefill) {
      prefill_on_device(layer, ops, cache, plan);
    } else if (a.n == 1 && slide_) {
      for (int h = 0; h < ckv; ++h) slide(layer, h, cache, plan, &ops);
      flush_erase(layer, ops);
    }
  }

  cpu::KCenterSplit split_;
  bool weighted_ = false;
  bool slide_ = false;
  std::vector<int32_t> protected_;   // [layers * heads]: leading slots that never slide out
  std::vector<uint8_t> compressed_;  // [layers * heads]: the one-shot compression has run
  SlotState<float> log_size_;        // weighted only: per slot, log(cluster size) (0: not a centre)
  // The device path: the weighted variant's bias rows (made by the first device ops that run
  // the policy; a clone copies them on the device) and per-layer scratch.
  SlotRowsPtr bias_;
  std::vector<KCenterKeep> kcenter_;
  std::vector<RowErase> erase_;
  std::vector<int32_t> lengths_;
  std::vector<uint8_t> no_sketch_;
};

}  // namespace

PolicyInfo subgen_kcenter_policy_info() {
  return {"subgen_kcenter",
          "SubGen's experiment: greedy k-center on post-RoPE keys + a recent window, once after "
          "the prompt",
          {{"recent",
            "floor(kv_budget/2)",
            "most recent tokens kept; the rest of the budget are "
            "k-center centres",
            {}},
           {"weight_by_cluster_size",
            "false",
            "add log(cluster size) to a centre's logit",
            {"true", "false"}},
           {"decode",
            "append",
            "new tokens: appended without eviction, or the window slides (centres stay)",
            {"append", "slide"}}},
          [](const PolicyConfig& c) { return std::make_unique<SubgenKCenter>(c); }};
}

}  // namespace kvb::policies
