// `subgen`: SubGen's sublinear streaming attention (seed 003, Algorithm 1; POLICIES.md `subgen`),
// a compressed attention operator rather than an eviction rule: it replaces the engine's
// attention. Per (layer, KV head) tokens stay exact in the cache until the head holds more than
// kv_budget (POLICIES.md "Compression threshold"; so a budget that is never exceeded is exactly
// `full`); from then on every token outside the first `sinks` and the last `recent` is streamed
// into the sketch (kernels/cpu/subgen_estimator.h) and dropped from the cache.
// Prompt: exact causal attention over the prompt block, then the sketch is built from the
// prompt's keys/values in order. This is what SubGen's experiments and real systems do (the
// paper's streaming form is silent on it; digest A.3), costs one attention pass instead of
// n estimator queries, and keeps the prompt's outputs exact. `prefill: streaming` feeds the
// prompt token by token instead. Decode (POLICIES.md "Decode step order"): the new token is
// appended and attended exactly for its own query, then absorbed when it leaves `recent`
// (immediately when recent = 0), so the cache ends each step with only sinks + recent.
// On a device engine (AttendArgs::ops) the same choices are made on the host from lengths, and
// the sketches, queries and absorbs live on the device (attend_on_device); the CPU path below
// is the reference and is unchanged by it.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/policies/policies.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {
namespace {

namespace cpu = kvb::kernels::cpu;

class SubGen final : public Policy {
 public:
  explicit SubGen(const PolicyConfig& c) : Policy(c) {
    const PolicyOptions& o = c.options;
    const int budget = c.kv_budget;
    s_ = o.get_int("s", budget / 4, 1, INT_MAX);
    t_ = o.get_int("t", 4, 1, 1 << 20);
    sinks_ = o.get_int("sinks", 0, 0, INT_MAX);
    recent_ = o.get_int("recent", 0, 0, INT_MAX);
    const std::string delta = o.get_string("delta", "auto");
    if (delta != "auto") {
      char* end = nullptr;
      const double v = std::strtod(delta.c_str(), &end);
      KVB_USAGE_CHECK(!delta.empty() && *end == '\0' && std::isfinite(v) && v >= 0)
          << "subgen: delta=" << delta << " must be 'auto' or a number >= 0";
      fixed_delta2_ = v * v;
    }
    streaming_ = o.get_string("prefill", "oneshot", {"oneshot", "streaming"}) == "streaming";
    KVB_USAGE_CHECK(s_ >= 1) << "subgen: s = " << s_ << " (default floor(kv_budget / 4) with "
                             << "kv_budget " << budget << "); set s >= 1 and a larger kv_budget";
    KVB_USAGE_CHECK(static_cast<long long>(s_) + sinks_ + recent_ < budget)
        << "subgen: s (" << s_ << ") + sinks (" << sinks_ << ") + recent (" << recent_
        << ") = " << static_cast<long long>(s_) + sinks_ + recent_ << " must be < kv_budget ("
        << budget << "): the rest holds the clusters";
    params_.head_dim = c.shape.head_dim;
    params_.s = s_;
    params_.t = t_;
    params_.max_clusters = cpu::subgen_max_clusters(budget, s_, t_, sinks_, recent_);
    KVB_USAGE_CHECK(params_.max_clusters >= 1)
        << "subgen: kv_budget (" << budget << ") - s (" << s_ << ") - sinks (" << sinks_
        << ") - recent (" << recent_ << ") = " << budget - s_ - sinks_ - recent_
        << " token equivalents leave no room for one cluster of t + 1 = " << t_ + 1
        << " keys ((t + 1) / 2 tokens); lower s or t";
    units_.resize(static_cast<size_t>(c.shape.num_layers) * cache_kv_heads());
  }

  PrefillMode prefill_mode() const override {
    return streaming_ ? PrefillMode::kStreaming : PrefillMode::kOneshot;
  }
  bool replaces_attention() const override { return true; }
  bool attends_with_ops() const override { return true; }

  void attend(const AttendArgs& a, const kernels::KvIndex& cache,
              kernels::EvictionPlan& plan) override {
    if (a.ops && a.ops->on_device()) {
      attend_on_device(a, *a.ops, cache, plan);
      return;
    }
    const int layer = a.layer, d = a.head_dim;
    const int ckv = cache.shape().num_kv_heads;
    KVB_CHECK(a.num_heads % ckv == 0 && d == params_.head_dim)
        << "subgen: " << a.num_heads << " query heads over " << ckv << " KV heads, head_dim " << d
        << " (configured " << params_.head_dim << ")";
    const int group = a.num_heads / ckv;
    // A cache at position 0 starts a sequence: forget any earlier one's sketches.
    if (cache.next_position() == 0) {
      for (int h = 0; h < ckv; ++h) unit(layer, h) = Unit{};
    }
    kernels::LayerKvView view =  // the CPU's path: its cache holds the rows
        host_layer(a.ops ? *a.ops : cpu_policy_ops(), cache, layer, nullptr);
    bool any_sketch = false;
    for (int h = 0; h < ckv; ++h) any_sketch |= unit(layer, h).compressed;
    if (!any_sketch) {
      // Nothing absorbed yet: the engine's own attention, bit for bit.
      cpu::attention({a.out, a.q, view, a.n, a.num_heads, a.scale});
    } else {
      // Query i of the block sees the sketch plus the exact slots up to its own (causal).
      const int rows = a.n * a.num_heads;
#pragma omp parallel for schedule(dynamic, 4) if (rows > 64)
      for (int job = 0; job < rows; ++job) {
        const int i = job / a.num_heads, h = job % a.num_heads, kvh = h / group;
        const Unit& u = unit(layer, kvh);
        cpu::SubgenQueryArgs q;
        q.q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * d;
        q.out = a.out + (static_cast<size_t>(i) * a.num_heads + h) * d;
        q.head_dim = d;
        q.scale = a.scale;
        if (u.compressed) q.sketch = cpu::subgen_view(u.sketch, params(u));
        q.exact_keys = view.key(kvh, 0);
        q.exact_values = view.value(kvh, 0);
        q.n_exact = cache.length(layer, kvh) - a.n + i + 1;
        cpu::subgen_query(q);
      }
    }
    // Heads are independent (own sketch, own cache rows, counter-based coins): any order.
#pragma omp parallel for schedule(dynamic, 1) if (ckv > 1)
    for (int h = 0; h < ckv; ++h) absorb_outside_window(layer, h, cache, view, plan);
  }

  size_t state_bytes() const override {
    size_t b = device_ ? device_->bytes() : 0;
    for (const Unit& u : units_) b += cpu::subgen_sketch_bytes(u.sketch);
    return b;
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<SubGen>(*this); }

 private:
  struct Unit {
    bool compressed = false;  // the head has exceeded the budget once; the sketch is live
    double delta2 = 0;        // chosen at the first compression (auto) or fixed
    cpu::SubgenSketch sketch;
  };
  Unit& unit(int layer, int head) {
    return units_[static_cast<size_t>(layer) * cache_kv_heads() + head];
  }
  cpu::SubgenParams params(const Unit& u) const {
    cpu::SubgenParams p = params_;
    p.delta2 = u.delta2;
    return p;
  }

  // After the head's queries: if over budget (or already compressed), stream every slot between
  // the sinks and the recent window into the sketch, in order, and drop them from the cache.
  void absorb_outside_window(int layer, int h, const kernels::KvIndex& cache,
                             const kernels::LayerKvView& view, kernels::EvictionPlan& plan) {
    Unit& u = unit(layer, h);
    const int len = cache.length(layer, h);
    int sinks = 0, first_recent = 0;
    if (!leaving(layer, h, len, &sinks, &first_recent)) return;
    const int d = params_.head_dim;
    if (!u.compressed) {
      // delta: auto fits the clusters of the keys absorbed now (the prompt's) into the budget.
      u.delta2 = fixed_delta2_ >= 0
                     ? fixed_delta2_
                     : cpu::subgen_auto_delta2(view.key(h, sinks), first_recent - sinks, d, d,
                                               params_.max_clusters);
      u.compressed = true;
    }
    const cpu::SubgenParams p = params(u);
    const int32_t* pos = view.position(h);
    for (int slot = sinks; slot < first_recent; ++slot) {
      const cpu::SubgenCounter counter{config().seed, static_cast<uint32_t>(layer),
                                       static_cast<uint32_t>(global_head(h)),
                                       static_cast<uint64_t>(pos[slot])};
      cpu::subgen_absorb(p, counter, view.key(h, slot), view.value(h, slot), u.sketch);
    }
    plan.drop(h, sinks, first_recent - sinks, len);  // heads are distinct plan entries
  }

  // The slots [*sinks, *first_recent) of head h (holding len) that leave the exact window now;
  // false when none does (never over budget, or nothing outside the sinks and the recent ones).
  bool leaving(int layer, int h, int len, int* sinks, int* first_recent) {
    if (!unit(layer, h).compressed && len <= kv_budget()) return false;
    *sinks = std::min(sinks_, len);
    *first_recent = std::max(*sinks, len - recent_);
    return *first_recent > *sinks;
  }


  // The device path (AttendArgs::ops, a device engine): the host makes the same choices as
  // attend() above from what it knows (which heads are compressed, their radius, which slots
  // leave the window: lengths only), and the device does the work on its own rows and sketches
  // (kernels/cuda/subgen_sketch.h through the ops): the queries (the engine's own attention
  // while no head of the layer is compressed), then the absorbs, bit for bit the CPU's on the
  // same rows. Nothing comes back to the host, except with `delta: auto` the keys a head
  // absorbs at its first compression (one copy and one sync per (layer, head) and sequence).
  void attend_on_device(const AttendArgs& a, PolicyOps& ops, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) {
    const int layer = a.layer, ckv = cache.shape().num_kv_heads;
    KVB_CHECK(a.num_heads % ckv == 0 && a.head_dim == params_.head_dim)
        << "subgen: " << a.num_heads << " query heads over " << ckv << " KV heads, head_dim "
        << a.head_dim << " (configured " << params_.head_dim << ")";
    if (!device_) {
      device_ = SubgenStatePtr(ops.make_subgen_state(params_, config().shape.num_layers, ckv));
    }
    absorb_.clear();
    if (cache.next_position() == 0) {
      // A new sequence: forget the earlier one's sketches (an empty absorb clears one).
      for (int h = 0; h < ckv; ++h) {
        if (unit(layer, h).compressed) absorb_.push_back({.head = h, .fresh = true});
        unit(layer, h) = Unit{};
      }
      ops.subgen_absorb(*device_, layer, cache, absorb_, config().seed);
      absorb_.clear();
    }
    compressed_.assign(ckv, 0);
    bool any_sketch = false;
    for (int h = 0; h < ckv; ++h) {
      compressed_[h] = unit(layer, h).compressed ? 1 : 0;
      any_sketch |= compressed_[h] != 0;
    }
    if (!any_sketch) {
      KVB_CHECK(static_cast<bool>(a.exact)) << "subgen: a device call without the engine's "
                                               "attention (AttendArgs::exact)";
      a.exact();
    } else {
      ops.subgen_query(device_.get(),
                       {.layer = layer,
                        .n = a.n,
                        .num_heads = a.num_heads,
                        .head_dim = a.head_dim,
                        .scale = a.scale,
                        .q = a.q,
                        .out = a.out,
                        .compressed = compressed_},
                       cache);
    }
    // `delta: auto` at a head's first compression: its keys come back once (a copy and a
    // sync per head), and the heads' radii are bisected on the host side by side (the CPU path
    // runs its heads in parallel too).
    fresh_keys_.clear();
    fresh_heads_.clear();
    for (int h = 0; h < ckv && fixed_delta2_ < 0; ++h) {
      int sinks = 0, first_recent = 0;
      if (unit(layer, h).compressed ||
          !leaving(layer, h, cache.length(layer, h), &sinks, &first_recent)) {
        continue;
      }
      fresh_heads_.push_back(h);
      fresh_keys_.push_back(ops.read_keys(cache, layer, h, sinks, first_recent - sinks));
    }
    const int d = params_.head_dim, nfresh = static_cast<int>(fresh_heads_.size());
#pragma omp parallel for schedule(dynamic, 1) if (nfresh > 1)
    for (int i = 0; i < nfresh; ++i) {
      const std::vector<float>& keys = fresh_keys_[i];
      unit(layer, fresh_heads_[i]).delta2 = cpu::subgen_auto_delta2(
          keys.data(), static_cast<int>(keys.size()) / d, d, d, params_.max_clusters);
    }
    for (int h = 0; h < ckv; ++h) {
      Unit& u = unit(layer, h);
      const int len = cache.length(layer, h);
      int sinks = 0, first_recent = 0;
      if (!leaving(layer, h, len, &sinks, &first_recent)) continue;
      const bool fresh = !u.compressed;
      if (fresh) {
        if (fixed_delta2_ >= 0) u.delta2 = fixed_delta2_;  // else bisected above
        u.compressed = true;
      }
      absorb_.push_back({.head = h,
                         .first = sinks,
                         .end = first_recent,
                         .counter_head = static_cast<uint32_t>(global_head(h)),
                         .fresh = fresh,
                         .delta2 = u.delta2});
      plan.drop(h, sinks, first_recent - sinks, len);
    }
    ops.subgen_absorb(*device_, layer, cache, absorb_, config().seed);
  }

  int s_ = 0, t_ = 4, sinks_ = 0, recent_ = 0;
  double fixed_delta2_ = -1;  // < 0: auto
  bool streaming_ = false;
  cpu::SubgenParams params_;
  std::vector<Unit> units_;  // [num_layers, cache_kv_heads]
  // The device path's sketches (made by the first device ops that run the policy; a clone
  // copies them on the device) and its per-layer scratch.
  SubgenStatePtr device_;
  std::vector<uint8_t> compressed_;
  std::vector<SubgenAbsorb> absorb_;
  std::vector<int> fresh_heads_;                 // auto-delta heads compressed this layer
  std::vector<std::vector<float>> fresh_keys_;  // their keys, read back once
};

}  // namespace

PolicyInfo subgen_policy_info() {
  PolicyInfo info{"subgen",
          "SubGen streaming attention: value-norm reservoir (s) + delta-clusters of keys with t "
          "samples; replaces attention once a head exceeds the budget",
          {{"s", "floor(kv_budget/4)", "reservoir samples of (key, value) for the numerator", {}},
           {"t", "4", "uniform key samples per cluster for the normalizer", {}},
           {"delta",
            "auto",
            "cluster radius (L2, post-RoPE keys), or auto: per layer and head, the smallest that "
            "fits the prompt's clusters into kv_budget - s - sinks - recent",
            {}},
           {"sinks", "0", "first tokens kept exact", {}},
           {"recent", "0", "most recent tokens kept exact (absorbed when they leave)", {}},
           {"prefill",
            "oneshot",
            "exact causal prompt attention then build the sketch, or stream the prompt token by "
            "token",
            {"oneshot", "streaming"}}},
          [](const PolicyConfig& c) { return std::make_unique<SubGen>(c); }};
  info.composes = false;
  return info;
}

}  // namespace kvb::policies
