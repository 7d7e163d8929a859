// `subgen_kcenter`: what SubGen's experiments ran (seed 003, Sec. 3.2; POLICIES.md
// `subgen_kcenter`): once, after the prompt, each (layer, KV head) over budget keeps its last
// `recent` tokens and kv_budget - recent centres chosen by greedy farthest-point k-center
// (kernels/cpu/kcenter.h, first centre the first token) on the post-RoPE keys of the rest.
// `weight_by_cluster_size` adds log(cluster size) to a centre's logit: the engine has no per-slot
// bias, so that variant replaces attention (exact softmax over the cache with the bias; without
// any bias it is the engine's own attention, bit for bit). Decode `append` keeps every new token;
// `slide` drops the oldest token after the centres whenever a head exceeds the budget.
#include <algorithm>
#include <cmath>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/budget.h"
#include "kernels/cpu/kcenter.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/slot_state.h"

namespace kvb::policies {
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
  bool reads_cache_rows() const override { return true; }  // k-center over the keys

  void on_prefill_layer(const LayerStats& st, const kernels::KvCache& cache,
                        kernels::EvictionPlan& plan) override {
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) after_prefill(st.layer, h, cache, plan);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvCache& cache,
                       kernels::EvictionPlan& plan) override {
    if (!slide_) return;
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) slide(st.layer, h, cache, plan);
  }

  // weight_by_cluster_size only. The engine skips the hooks for such policies, so this runs them:
  // a prefill block -> after_prefill, one decode token -> slide; other blocks (no hook) keep all.
  void attend(const AttendArgs& a, const kernels::KvCache& cache,
              kernels::EvictionPlan& plan) override {
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
    kernels::LayerKvView view = cache.layer(layer);
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
      for (int h = 0; h < ckv; ++h) slide(layer, h, cache, plan);
    }
  }

  size_t state_bytes() const override { return log_size_.bytes(); }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<SubgenKCenter>(*this); }

 private:
  size_t index(int layer, int head) const {
    return static_cast<size_t>(layer) * cache_kv_heads() + head;
  }

  // The one-shot compression, the first time a prefill leaves the head over budget. A head whose
  // prompt fits protects every token before its recent window (k-center on at most k points
  // keeps them all). Later prefill blocks on a compressed head count as window tokens.
  void after_prefill(int layer, int h, const kernels::KvCache& cache,
                     kernels::EvictionPlan& plan) {
    const int len = cache.length(layer, h);
    const size_t u = index(layer, h);
    if (weighted_) log_size_.at(layer, h).resize(len, 0.0f);
    if (compressed_[u]) {
      slide(layer, h, cache, plan);
      return;
    }
    if (len <= kv_budget()) {
      protected_[u] = std::max(0, len - split_.recent);
      return;
    }
    const int prefix = len - split_.recent;  // > kv_budget - recent = centres
    kernels::LayerKvView view = cache.layer(layer);
    std::vector<int32_t> centres(split_.centres), sizes(split_.centres);
    cpu::KCenterArgs args;
    args.keys = view.key(h, 0);
    args.n = prefix;
    args.dim = view.head_dim;
    args.ld = view.head_dim;
    args.k = split_.centres;
    const int m = cpu::kcenter_greedy(args, centres.data(), nullptr, sizes.data());
    std::vector<int32_t> keep(centres.begin(), centres.begin() + m);
    for (int s = prefix; s < len; ++s) keep.push_back(s);
    plan.keep(h, keep);
    if (weighted_) {
      std::vector<float>& bias = log_size_.at(layer, h);
      bias.assign(keep.size(), 0.0f);
      for (int c = 0; c < m; ++c) bias[c] = std::log(static_cast<float>(sizes[c]));
    }
    protected_[u] = m;
    compressed_[u] = 1;
  }

  // decode: slide: drop the oldest tokens after the protected centres while over budget.
  void slide(int layer, int h, const kernels::KvCache& cache, kernels::EvictionPlan& plan) {
    if (!slide_) return;
    const int len = cache.length(layer, h);
    const int over = len - kv_budget();
    const int first = protected_[index(layer, h)];
    if (over <= 0 || first >= len) return;
    const int drop = std::min(over, len - first);
    std::vector<int32_t> keep;
    keep.reserve(len - drop);
    for (int s = 0; s < len; ++s) {
      if (s < first || s >= first + drop) keep.push_back(s);
    }
    if (weighted_) compact(log_size_.at(layer, h), keep);
    plan.keep(h, std::move(keep));
  }

  cpu::KCenterSplit split_;
  bool weighted_ = false;
  bool slide_ = false;
  std::vector<int32_t> protected_;   // [layers * heads]: leading slots that never slide out
  std::vector<uint8_t> compressed_;  // [layers * heads]: the one-shot compression has run
  SlotState<float> log_size_;        // weighted only: per slot, log(cluster size) (0: not a centre)
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
