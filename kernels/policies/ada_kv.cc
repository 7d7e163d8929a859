// `ada_snapkv` and `ada_pyramidkv` (POLICIES.md `ada_*`; Ada-KV, seed 004, Algorithm 2 plus the
// code's alpha floor): a layer's per-head base (snapkv: kv_budget - w; pyramidkv: the layer's
// pyramid budget) is reallocated across its KV heads by the global top-(h*base) of the pooled
// scores: B_i = round_half_even((1-alpha)*count_i + floor(alpha*base)), capped by the prefix.
// Heads of one layer end with different lengths; no decode eviction. Under tensor parallelism
// the top-k is taken over the heads of every rank (an all-gather of the candidates per layer).
#include <algorithm>
#include <vector>

#include "kernels/cpu/budget.h"
#include "common/error.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/snapkv_family.h"

namespace kvb::policies {
namespace {

class AdaKv final : public SnapKvFamily {
 public:
  AdaKv(const PolicyConfig& c, bool pyramid)
      : SnapKvFamily(c),
        pyramid_(pyramid),
        alpha_(c.options.get_double("alpha", 0.5, 0.0, 1.0)),
        beta_(pyramid ? c.options.get_int("beta", 20, 1, 1 << 20) : 0) {}
  std::unique_ptr<Policy> clone() const override { return std::make_unique<AdaKv>(*this); }

 protected:
  void allocate(PolicyOps& ops, const SlotRows& scores, int layer, int prompt_len, int w,
                const kernels::KvIndex& cache, int32_t* budgets) override {
    int base = kv_budget() - w;
    if (pyramid_) {
      base = kernels::cpu::pyramid_layer_budgets(kv_budget(), w, prompt_len,
                                                 config_.shape.num_layers, beta_)[layer];
    }
    if (tp_size() == 1) {
      const std::vector<int32_t> b = ada_head_budgets(ops, scores, 0, cache, layer, base, alpha_);
      std::copy(b.begin(), b.end(), budgets);
      return;
    }
    // Tensor parallelism (host ops only): the top-k spans the heads of every rank. All-gather
    // each local head's candidates (score, position), rebuild the layer's scores in global head
    // order, and run the single-device selection on them: the counts, hence the budgets, equal
    // one device's. (Only a rank's own top-k candidates could be in the global top-k; sending all
    // of them is simpler and costs heads x prefix x 8 bytes per layer, once per prompt.)
    KVB_CHECK(!ops.on_device()) << "ada_kv: tensor parallelism runs on host policy ops";
    const int heads = scores.heads();
    std::vector<float> flat;
    std::vector<int32_t> positions, lengths(heads);
    const kernels::LayerIndexView view = cache.layer(layer);
    for (int h = 0; h < heads; ++h) {
      const std::vector<float> row = ops.read_f32(scores, 0, h);
      lengths[h] = static_cast<int32_t>(row.size());
      flat.insert(flat.end(), row.begin(), row.end());
      positions.insert(positions.end(), view.position(h), view.position(h) + lengths[h]);
    }
    std::vector<int32_t> counts(heads);
    tp_global_counts(flat, positions, lengths, base, counts.data());
    kernels::cpu::ada_budgets_from_counts(counts.data(), lengths.data(), heads, base, alpha_,
                                          budgets);
  }

 private:
  // counts[h] for the local heads of the global top-(H * base), H = every rank's heads.
  // scores, positions: the local heads' prefix scores and positions, concatenated (local head h
  // has lengths[h] entries).
  void tp_global_counts(const std::vector<float>& scores, const std::vector<int32_t>& positions,
                        const std::vector<int32_t>& lengths, int base, int32_t* counts) const {
    kernels::Communicator& comm = *config_.tp;
    const auto all_lengths = kernels::all_gather_vectors(comm, lengths);
    const auto all_scores = kernels::all_gather_vectors(comm, scores);
    const auto all_positions = kernels::all_gather_vectors(comm, positions);
    std::vector<int32_t> g_lengths;
    for (const auto& l : all_lengths) g_lengths.insert(g_lengths.end(), l.begin(), l.end());
    const int g_heads = static_cast<int>(g_lengths.size());
    int ld = 0;
    for (int32_t l : g_lengths) ld = std::max(ld, static_cast<int>(l));
    std::vector<float> g_scores(static_cast<size_t>(g_heads) * ld);
    std::vector<int32_t> g_positions(g_scores.size());
    int gh = 0;
    for (int r = 0; r < comm.size(); ++r) {
      size_t at = 0;
      for (int32_t len : all_lengths[r]) {
        const size_t row = static_cast<size_t>(gh++) * ld;
        std::copy_n(all_scores[r].begin() + at, len, g_scores.begin() + row);
        std::copy_n(all_positions[r].begin() + at, len, g_positions.begin() + row);
        at += len;
      }
    }
    std::vector<int32_t> g_counts(g_heads);
    const kernels::cpu::RaggedScores global{g_scores.data(), g_positions.data(), g_lengths.data(),
                                            g_heads, ld};
    kernels::cpu::global_topk_counts(global, g_heads * base, g_counts.data());
    std::copy_n(g_counts.begin() + global_head(0), lengths.size(), counts);
  }

  bool pyramid_ = false;
  double alpha_ = 0.5;
  int beta_ = 0;
};

ParamDoc alpha_param() {
  return {"alpha",
          "0.5",
          "weight of the uniform floor: B_i = round((1-alpha)*count_i + floor(alpha*base)); "
          "0 gives pure adaptive allocation",
          {}};
}

}  // namespace

PolicyInfo ada_snapkv_policy_info() {
  std::vector<ParamDoc> params = snapkv_score_params();
  params.push_back(alpha_param());
  return {"ada_snapkv",
          "Ada-SnapKV: SnapKV with per-head budgets from the layer's global top-k (Ada-KV)", params,
          [](const PolicyConfig& c) { return std::make_unique<AdaKv>(c, false); }};
}

PolicyInfo ada_pyramidkv_policy_info() {
  std::vector<ParamDoc> params = snapkv_score_params();
  params.push_back(alpha_param());
  params.push_back(
      {"beta", "20", "pyramid steepness: the last layer selects about (kv_budget - w) / beta", {}});
  return {"ada_pyramidkv",
          "Ada-PyramidKV: PyramidKV's per-layer budgets, split over heads by the global top-k "
          "(Ada-KV)",
          params, [](const PolicyConfig& c) { return std::make_unique<AdaKv>(c, true); }};
}

}  // namespace kvb::policies
