// ThinK (POLICIES.md `think`; kvpress ThinKPress): key channels, not tokens. The `think: r`
// option of every policy runs it after the policy's own prompt decision (kvpress's
// ComposedPress([press, ThinKPress(r)])); the policy `think` runs it alone (every token stays).
#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "kernels/policies/policies.h"

namespace kvb::policies {

void Policy::on_prefill_channels(const LayerStats& st, const kernels::KvIndex& cache,
                                 kernels::EvictionPlan& plan) const {
  const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
  const int pruned = static_cast<int>(d * think_ratio_);  // kvpress: int(head_dim x r)
  if (pruned == 0) return;
  KVB_CHECK(st.last_queries != nullptr && st.n_queries > 0 && st.num_heads % heads == 0)
      << "policy " << config_.name << ": think at layer " << st.layer
      << " was given no prompt queries (Policy::prefill_stats asks for them)";
  const int w = std::min(think_window_, st.n_queries);
  const int group = st.num_heads / heads;
  const size_t row = static_cast<size_t>(st.num_heads) * d;
  const float* q = st.last_queries + static_cast<size_t>(st.n_queries - w) * row;
  std::vector<double> keys;  // [heads, d]: mean over the head's slots of k_c^2
  ops_of(st).channel_square_means(cache, st.layer, kernels::ops::CacheRows::kKeys, &keys);
  std::vector<double> score(d), energy(d);
  std::vector<int32_t> order(d);
  for (int h = 0; h < heads; ++h) {
    if (cache.length(st.layer, h) == 0) continue;
    std::fill(score.begin(), score.end(), 0.0);
    for (int g = 0; g < group; ++g) {  // kvpress: mean over the window, then over the group
      const int qh = h * group + g;
      std::fill(energy.begin(), energy.end(), 0.0);
      for (int t = 0; t < w; ++t) {
        const float* x = q + t * row + static_cast<size_t>(qh) * d;
        for (int c = 0; c < d; ++c) energy[c] += static_cast<double>(x[c]) * x[c];
      }
      for (int c = 0; c < d; ++c) score[c] += energy[c] / w;
    }
    for (int c = 0; c < d; ++c) score[c] = score[c] / group * keys[static_cast<size_t>(h) * d + c];
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return score[a] < score[b]; });
    std::vector<int32_t> channels(order.begin(), order.begin() + pruned);
    std::sort(channels.begin(), channels.end());
    // The prompt's slots: positions below the block's end, or after a rerotation 0..len-1 (the
    // tokens to come take positions from the longest head's length on).
    plan.zero_key_channels(h, std::move(channels),
                           rerotate_ ? cache.length(st.layer, h) : st.block_end);
  }
}

namespace {

// `think`: every token stays; the prompt's key channels as the option `think` prunes them.
class Think final : public Policy {
 public:
  explicit Think(const PolicyConfig& c) : Policy(c) {
    KVB_USAGE_CHECK(!c.options.has("think") && !c.options.has("think_window"))
        << "policy think: its options are key_channel_compression_ratio and window_size (think "
        << "and think_window are what other policies take to run ThinK after themselves)";
    think_ratio_ = c.options.get_double("key_channel_compression_ratio", 0, 0, 1);
    KVB_USAGE_CHECK(think_ratio_ < 1)
        << "policy think: key_channel_compression_ratio must be in [0, 1), got " << think_ratio_;
    think_window_ = c.options.get_int("window_size", 32, 1, 1 << 20);
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Think>(*this); }
};

}  // namespace

PolicyInfo think_policy_info() {
  PolicyInfo info{
      "think",
      "ThinK (kvpress ThinKPress): every token stays; after the prompt each head's "
      "int(head_dim x r) key channels of lowest query energy x key energy are zeroed (memory "
      "counts them as not stored). Takes no kv budget; other policies take it as `think: r`",
      {{"key_channel_compression_ratio", "0",
        "r: the fraction of each head's key channels zeroed (kvpress's default 0 prunes none)"},
       {"window_size", "32", "the prompt's last queries whose energy scores the channels"}},
      [](const PolicyConfig& c) { return std::make_unique<Think>(c); }};
  info.budgeted = false;
  return info;
}

}  // namespace kvb::policies
