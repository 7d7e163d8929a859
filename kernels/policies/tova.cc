// `tova`: Token Omission Via Attention (Oren et al. 2024; schwartz-lab-NLP/TOVA's TOVACache;
// POLICIES.md "Further baselines"). No recent window: after prefill keep the top kv_budget tokens
// by the last prompt query's attention; at each decode step evict the token with the lowest
// attention of the current query. Scores: GQA mean per KV head (`tova_reduce: head`), or the mean
// over all query heads of the layer (`layer`, as TOVA's code does), one decision for the layer.
// `keep_last: true` (kvpress 0.5.5's TOVAPress, which pads the last token's score above every
// other): after prefill the last prompt token always stays and the top kv_budget - 1 of the
// others by the same scores join it.
#include <algorithm>

#include "common/error.h"
#include "kernels/cpu/select.h"
#include "kernels/policies/policies.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {
namespace {

class Tova final : public Policy {
 public:
  bool evicts_at_decode() const override { return true; }
  explicit Tova(const PolicyConfig& c) : Policy(c) {
    layer_reduce_ = c.options.get_string("tova_reduce", "head", {"head", "layer"}) == "layer";
    keep_last_ = c.options.get_bool("keep_last", false);
  }

  // Only the last query matters in both phases (in decode it is the only one).
  StatsRequest prefill_request(int) const override { return {.last_w = 1}; }
  StatsRequest decode_request() const override { return {.last_w = 1}; }
  bool decides_with_ops() const override { return true; }
  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    evict(st, cache, plan, keep_last_);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    evict(st, cache, plan, false);
  }
  std::unique_ptr<Policy> clone() const override { return std::make_unique<Tova>(*this); }

 private:
  // Keeps each over-budget head's top kv_budget slots by the last query's probabilities. In
  // decode a head holds kv_budget + 1, so this evicts exactly the argmin (ties: the older goes,
  // as select_topk keeps the higher index among equal scores). keep_last: the last slot stays
  // and the top kv_budget - 1 of the others join it.
  void evict(const LayerStats& st, const kernels::KvIndex& cache, kernels::EvictionPlan& plan,
             bool keep_last) {
    const int last_kept = keep_last ? 1 : 0;
    const int heads = cache.shape().num_kv_heads;
    const int group = st.num_heads / heads;
    // last_probs: [num_heads, last_w, stride]; the last query is row last_w - 1 of each head.
    const size_t row_stride = static_cast<size_t>(st.last_w) * st.stride;
    const float* last = st.last_probs + static_cast<size_t>(st.last_w - 1) * st.stride;
    PolicyOps& ops = ops_of(st);
    tops_.clear();
    if (layer_reduce_) {
      const int len = cache.length(st.layer, 0);
      for (int h = 1; h < heads; ++h) {
        KVB_CHECK(cache.length(st.layer, h) == len)
            << "tova_reduce=layer needs equal head lengths in layer " << st.layer << "; head " << h
            << " holds " << cache.length(st.layer, h) << ", head 0 " << len;
      }
      if (len <= kv_budget()) return;
      // Every query head, each over its own KV head's slots (slot s is the same token in every
      // head, since the heads of this layer always keep the same set).
      if (tp_size() == 1) {
        // One score row (the mean over all query heads), one keep-set for every head.
        SlotRows& score = cleared_scores(ops, 1);
        const int32_t one_len[] = {len};
        ops.resize_and_accumulate(score, 0, one_len, last, 0, row_stride, st.num_heads,
                                  GqaReduce::kMean);
        for (int h = 0; h < heads; ++h) {
          tops_.push_back({.head = h, .score_head = 0, .len = len, .prefix = len - last_kept,
                           .k = kv_budget() - last_kept});
        }
        ops.keep_top(score, 0, cache, tops_, {}, plan);
      } else {
        KVB_CHECK(!ops.on_device()) << "tova: tensor-parallel groups decide on the host";
        std::vector<float> score(len);
        std::vector<int32_t> keep;
        // Tensor parallelism: the mean runs over the query heads of every rank, in global head
        // order, exactly as one device adds them (an all-gather of heads x len floats).
        std::vector<float> rows(static_cast<size_t>(st.num_heads) * len);
        for (int q = 0; q < st.num_heads; ++q) {
          std::copy_n(last + q * row_stride, len, &rows[static_cast<size_t>(q) * len]);
        }
        for (int other : kernels::all_gather_value(*config().tp, len)) {
          KVB_CHECK(other == len) << "tova_reduce=layer: layer " << st.layer << " holds " << len
                                  << " slots on this rank but " << other << " on another";
        }
        std::vector<float> all(rows.size() * tp_size());
        config().tp->all_gather(rows.data(), rows.size() * sizeof(float), all.data());
        reduce_gqa(all.data(), len, st.num_heads * tp_size(), len, GqaReduce::kMean, score.data());
        keep.resize(len);
        keep.resize(kernels::cpu::select_topk(score.data(), len - last_kept,
                                              kv_budget() - last_kept, keep.data()));
        if (keep_last) keep.push_back(len - 1);
        for (int h = 0; h < heads; ++h) plan.keep(h, keep);
      }
      return;
    }
    lens_.resize(heads);
    for (int h = 0; h < heads; ++h) {
      const int len = cache.length(st.layer, h);
      lens_[h] = len;
      if (len > kv_budget()) {
        tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = len - last_kept,
                         .k = kv_budget() - last_kept});
      }
    }
    if (tops_.empty()) return;
    SlotRows& score = cleared_scores(ops, heads);
    ops.resize_and_accumulate(score, 0, lens_, last, static_cast<size_t>(group) * row_stride,
                              row_stride, group, GqaReduce::kMean);
    ops.keep_top(score, 0, cache, tops_, {}, plan);
  }

  // This step's scores: a one-layer scratch of `rows` empty rows, which resize_and_accumulate
  // then grows with zeros to the heads' lengths and adds the mean to (0 + the mean is the mean).
  SlotRows& cleared_scores(PolicyOps& ops, int rows) {
    if (scratch_ && scratch_->heads() != rows) scratch_ = SlotRowsPtr();
    SlotRows& s = rows_of(scratch_, ops, SlotType::kF32, 1, rows);
    zeros_.assign(rows, 0);
    ops.resize(s, 0, zeros_);
    return s;
  }

  bool layer_reduce_ = false;
  bool keep_last_ = false;
  SlotRowsPtr scratch_;
  std::vector<int32_t> lens_, zeros_;
  std::vector<KeepTop> tops_;
};

}  // namespace

PolicyInfo tova_policy_info() {
  return {"tova",
          "Token Omission Via Attention: keep the tokens the current query attends to most",
          {{"tova_reduce",
            "head",
            "score per KV head (GQA mean of its query heads), or the mean over all heads of the "
            "layer as TOVA's code does (one keep-set per layer)",
            {"head", "layer"}},
           {"keep_last", "false",
            "after prefill the last prompt token always stays, beside the top kv_budget - 1 "
            "(kvpress 0.5.5's TOVAPress)",
            {"true", "false"}}},
          [](const PolicyConfig& c) { return std::make_unique<Tova>(c); }};
}

}  // namespace kvb::policies
