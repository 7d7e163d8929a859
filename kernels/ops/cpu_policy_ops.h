// The CPU instance of the policy ops table (policy_ops.h): rows are host vectors per
// (layer, head), statistics host pointers, decisions host keep lists or victims. Its ops are the
// code the policies ran inline before the table, so CPU results are the same bits.
#pragma once

#include "kernels/ops/policy_ops.h"

namespace kvb::kernels::ops {

class CpuPolicyOps final : public PolicyOps {
 public:
  bool on_device() const override { return false; }
  std::unique_ptr<SlotRows> make_rows(SlotType type, int layers, int heads) override;
  void require_own(const SlotRows& rows) const override;
  void resize(SlotRows& rows, int layer, std::span<const int32_t> lengths) override;
  void accumulate(SlotRows& rows, int layer, const float* src, size_t head_stride,
                  size_t row_stride, int group, GqaReduce how) override;
  void history_bits(SlotRows& bits, const LayerStats& st, const kernels::KvIndex& cache,
                    int history, bool inv_position) override;
  void append_norms(SlotRows& rows, int layer, std::span<const int32_t> before,
                    const float* vectors, int n, int src_heads, int dim, int expand) override;
  void scale(SlotRows& rows, int layer, std::span<const int32_t> first, float factor) override;
  void popcount(const SlotRows& bits, int layer, SlotRows& out, int out_layer) override;
  void window_sum(SlotRows& out, int out_layer, const LayerStats& st,
                  std::span<const int32_t> lengths, WindowReduce how,
                  int queries = 0) override;
  void reduce_heads(const SlotRows& in, int in_layer, int group, GqaReduce how, SlotRows& out,
                    int out_layer) override;
  void pool(const SlotRows& in, int in_layer, SlotRows& out, int out_layer, int kernel,
            cpu::PoolKind kind) override;
  std::vector<int32_t> count_top_across_heads(const SlotRows& scores, int score_layer,
                                              const kernels::KvIndex& cache, int layer,
                                              int64_t k) override;
  void keep_top(const SlotRows& scores, int score_layer, const kernels::KvIndex& cache,
                std::span<const KeepTop> heads, std::span<SlotRows* const> state,
                kernels::EvictionPlan& plan) override;
  void divide_by_query_counts(SlotRows& rows, int layer, std::span<const int32_t> before,
                              int n_queries) override;
  void cosine_to_mean(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                      CacheRows which, int chunk = 0) override;
  void cache_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                   CacheRows which, bool squared) override;
  void normalize_chunks(SlotRows& rows, int layer, int chunk) override;
  void combine(SlotRows& rows, int layer, const SlotRows& in, int in_layer,
               Combine how) override;
  void fill_prefix(SlotRows& rows, int layer, int count, float value) override;
  void lag_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer, int sinks,
                  int lag) override;
  void query_moments(SlotRows& out, int out_layer, const LayerStats& st, int head_dim,
                     int first, const PairRotation& rot, bool covariance) override;
  void quadratic_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                        const SlotRows& moments, int moments_layer, int group, double a,
                        double b) override;
  void softmax(SlotRows& rows, int layer, int first) override;
  void add_scalar(SlotRows& rows, int layer, float value) override;
  void fill_top(SlotRows& rows, int layer, std::span<const int32_t> k, float value,
                const SlotRows* by, int by_layer) override;
  void projected_value_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                             const void* wo, bool wo_bf16, int dim, int group) override;
  void chunk_attention_sums(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                            const LayerStats& st, int first, int count, int chunk) override;
  void cumsum(SlotRows& rows, int layer) override;
  void gather(const SlotRows& in, int in_layer, std::span<const int32_t> indices,
              std::span<const int32_t> counts, SlotRows& out, int out_layer) override;
  void slice(const SlotRows& in, int in_layer, int first, int count, SlotRows& out,
             int out_layer) override;
  void pad_with_max(const SlotRows& in, int in_layer, int before, int after,
                    SlotRows& out, int out_layer) override;
  void standardize(SlotRows& rows, int layer) override;
  void leverage_scores(SlotRows& out, int out_layer, const LayerStats& st, int key_heads,
                       int head_dim, int first, int count, const float* sketch,
                       int k) override;
  void erase(SlotRows& rows, int layer, std::span<const RowErase> heads) override;
  void kcenter_keep(const kernels::KvIndex& cache, std::span<const KCenterKeep> heads,
                    SlotRows* log_sizes, kernels::EvictionPlan& plan) override;
  std::vector<float> read_cache_rows(const kernels::KvIndex& cache, int layer, int head, int first,
                                     int count, CacheRows which) override;
  std::vector<int32_t> read_keep_list(const kernels::EvictionPlan& plan, int head,
                                      int len) override;
  void replay_attention_max(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                            const LayerStats& st, int sinks, int first, int count) override;
  void channel_square_means(const kernels::KvIndex& cache, int layer, CacheRows which,
                            std::vector<double>* out) override;
  void write_rows(SlotRows& rows, int layer, std::span<const float> values, int length) override;
  void window_attention(WindowProbs& out, const kernels::KvIndex& cache, int layer,
                        const LayerStats& st, int w) override;
  std::unique_ptr<WindowProbs> make_window_probs() override;
  std::vector<float> read_f32(const SlotRows& rows, int layer, int head) override;
  std::vector<uint64_t> read_u64(const SlotRows& rows, int layer, int head) override;
};

}  // namespace kvb::kernels::ops
