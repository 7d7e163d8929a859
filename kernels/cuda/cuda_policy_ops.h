// The CUDA instance of the policy ops table (kernels/ops/policy_ops.h; issue 13 "Policy
// state and statistics live where the storage lives"). Rows are device buffers (one per layer,
// [heads, ld] entries, stream-ordered allocations), the statistics are the attention kernel's
// device outputs, and keep_top leaves its keep lists on the device (EvictionPlan::
// keep_on_device) for the engine to apply to the device cache. Every op is enqueued on the
// engine's stream: no copy to the host, no stream sync, no H2D copy (per-head sizes travel as
// kernel arguments). Lengths are host-known (the cache index). Up to kMaxOpsHeads cache heads
// per layer. One exception, prefill only: count_top_across_heads (Ada-KV's budgets) brings the
// layer's per-head counts to the host (one D2H copy of num_kv_heads ints and one sync; counted
// in transfers()); and
// SubGen's `delta: auto` reads a head's keys once, at its first compression (read_keys).
//
// Twins (tests/cuda/test_cuda_policy_ops.cc runs both instances on the same inputs):
//   resize, accumulate, popcount, scale, keep_top  <->  CpuPolicyOps (cpu::reduce_gqa,
//   kernels/cpu/select), history_bits <-> kernels/cpu/history_bits (through
//   kernels/cuda/scores.h's scissorhands_update_bits): bitwise. append_norms: f64 sums in the
//   same order, contracted to FMA as the compiler chooses on each side, so equal to the CPU's
//   within an f32 ulp (equal vectors still tie exactly). window_sum, reduce_heads, pool <->
//   CpuPolicyOps (the window sum in query order, IEEE division for mean, reduce_gqa's order,
//   pool1d's loop through pool.cuh): bitwise. count_top_across_heads: the counts of
//   kernels/cuda/budget (the CPU's total order): equal counts. kcenter_keep <-> CpuPolicyOps
//   (cpu::kcenter_keep_list; cuda::kcenter_greedy_batch is the CPU's kcenter_greedy per head,
//   bit for bit on finite keys): equal lists; log sizes looked up in a table of the host's
//   std::log(float(i)) (the CPU's bits: glibc's logf is not the rounded double log for every
//   size, e.g. 1579), uploaded when a longer prefix than before is compressed (one H2D copy,
//   counted in transfers(); a prefill cost). erase <-> CpuPolicyOps: bitwise (a move).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/kv_cache_device.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::kernels::cuda {

constexpr int kMaxOpsHeads = 128;

class CudaPolicyOps final : public ops::PolicyOps {
 public:
  explicit CudaPolicyOps(cudaStream_t stream) : stream_(stream) {}
  ~CudaPolicyOps() override;
  CudaPolicyOps(const CudaPolicyOps&) = delete;
  CudaPolicyOps& operator=(const CudaPolicyOps&) = delete;

  bool on_device() const override { return true; }
  void require_own(const ops::SlotRows& rows) const override;
  std::unique_ptr<ops::SlotRows> make_rows(ops::SlotType type, int layers,
                                                int heads) override;
  void resize(ops::SlotRows& rows, int layer, std::span<const int32_t> lengths) override;
  void accumulate(ops::SlotRows& rows, int layer, const float* src, size_t head_stride,
                  size_t row_stride, int group, cpu::GqaReduce how) override;
  void resize_and_accumulate(ops::SlotRows& rows, int layer,
                             std::span<const int32_t> lengths, const float* src,
                             size_t head_stride, size_t row_stride, int group,
                             cpu::GqaReduce how) override;
  void history_bits(ops::SlotRows& bits, const ops::LayerStats& st, const kernels::KvIndex& cache,
                    int history, bool inv_position) override;
  void append_norms(ops::SlotRows& rows, int layer, std::span<const int32_t> before,
                    const float* vectors, int n, int src_heads, int dim, int expand) override;
  void scale(ops::SlotRows& rows, int layer, std::span<const int32_t> first,
             float factor) override;
  void popcount(const ops::SlotRows& bits, int layer, ops::SlotRows& out,
                int out_layer) override;
  void window_sum(ops::SlotRows& out, int out_layer, const ops::LayerStats& st,
                  std::span<const int32_t> lengths, ops::WindowReduce how,
                  int queries = 0) override;
  void reduce_heads(const ops::SlotRows& in, int in_layer, int group, cpu::GqaReduce how,
                    ops::SlotRows& out, int out_layer) override;
  void pool(const ops::SlotRows& in, int in_layer, ops::SlotRows& out, int out_layer,
            int kernel, cpu::PoolKind kind) override;
  std::vector<int32_t> count_top_across_heads(const ops::SlotRows& scores, int score_layer,
                                              const kernels::KvIndex& cache, int layer,
                                              int64_t k) override;
  void keep_top(const ops::SlotRows& scores, int score_layer, const kernels::KvIndex& cache,
                std::span<const ops::KeepTop> heads, std::span<ops::SlotRows* const> state,
                EvictionPlan& plan) override;

  // kvpress's scorers (cuda_policy_ops_scorers.cu): divide_by_query_counts in one launch;
  // cosine_to_mean in three (the slots' norms, each head's anchor, the cosines), in f64 scratch
  // the ops keep (norms [heads, longest], anchors [heads, head_dim]).
  void divide_by_query_counts(ops::SlotRows& rows, int layer, std::span<const int32_t> before,
                              int n_queries) override;
  void cosine_to_mean(ops::SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                      ops::CacheRows which, int chunk = 0) override;
  // cache_norms, normalize_chunks (a block per chunk and head), combine, fill_prefix: one
  // launch each.
  void cache_norms(ops::SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                   ops::CacheRows which, bool squared) override;
  void normalize_chunks(ops::SlotRows& rows, int layer, int chunk) override;
  void combine(ops::SlotRows& rows, int layer, const ops::SlotRows& in, int in_layer,
               ops::Combine how) override;
  void fill_prefix(ops::SlotRows& rows, int layer, int count, float value) override;
  // lag_scores: two launches (every entry's 1 or recency ramp; then one block per partition and
  // head, its softmaxes in the f64 scratch). exp is the device's: ranks may differ from the
  // host's at near-ties of the last bit.
  void lag_scores(ops::SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                  int sinks, int lag) override;

  // ExpectedAttentionPress's ops (cuda_policy_ops_moments.cu): query_moments in two launches
  // (the means, a block per query head; the covariance, a thread per entry), quadratic_scores,
  // softmax (a block per row) and add_scalar in one each. head_dim <= 256.
  void query_moments(ops::SlotRows& out, int out_layer, const ops::LayerStats& st, int head_dim,
                     int first, const ops::PairRotation& rot, bool covariance) override;
  void quadratic_scores(ops::SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                        const ops::SlotRows& moments, int moments_layer, int group, double a,
                        double b) override;
  void softmax(ops::SlotRows& rows, int layer, int first) override;
  void add_scalar(ops::SlotRows& rows, int layer, float value) override;
  // projected_value_norms: one launch, a thread per (slot, query head).
  void projected_value_norms(ops::SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                             int layer, const void* wo, bool wo_bf16, int dim, int group) override;
  // chunk_attention_sums and standardize (cuda_policy_ops_chunks.cu): the queries copied and
  // rotated in f64 scratch (cuda::rope; its frequencies one counted upload), then two launches
  // (each query's maximum and f64 sum; each key's column sum); standardize in one block.
  void chunk_attention_sums(ops::SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                            int layer, const ops::LayerStats& st, int first, int count,
                            int chunk) override;
  // cumsum: one launch (a thread per row, the CPU's order); gather: the indices one counted
  // upload, one launch (cuda_policy_ops_chunks.cu).
  void cumsum(ops::SlotRows& rows, int layer) override;
  void gather(const ops::SlotRows& in, int in_layer, std::span<const int32_t> indices,
              std::span<const int32_t> counts, ops::SlotRows& out, int out_layer) override;
  void slice(const ops::SlotRows& in, int in_layer, int first, int count, ops::SlotRows& out,
             int out_layer) override;
  void pad_with_max(const ops::SlotRows& in, int in_layer, int before, int after,
                    ops::SlotRows& out, int out_layer) override;
  void standardize(ops::SlotRows& rows, int layer) override;
  void leverage_scores(ops::SlotRows& out, int out_layer, const ops::LayerStats& st, int key_heads,
                       int head_dim, int first, int count, const float* sketch,
                       int k) override;
  // fill_top: keep_top's selection kernel into scratch lists, then one scatter launch.
  void fill_top(ops::SlotRows& rows, int layer, std::span<const int32_t> k, float value,
                const ops::SlotRows* by, int by_layer) override;

  // subgen_kcenter (cuda_policy_ops_kcenter.cu): cuda::kcenter_greedy_batch over the listed
  // heads on the cache's device rows, one block a head in one launch (bf16 rows widened exactly
  // into scratch first, all heads in one launch), the lists and log sizes written on the device
  // by a third; erase moves a row's later entries down in place.
  void erase(ops::SlotRows& rows, int layer,
             std::span<const ops::RowErase> heads) override;
  void kcenter_keep(const kernels::KvIndex& cache, std::span<const ops::KCenterKeep> heads,
                    ops::SlotRows* log_sizes, EvictionPlan& plan) override;

  // SubGen (cuda_policy_ops_subgen.cu): sketches in kernels/cuda/subgen_sketch.h storage,
  // absorbed and queried by its kernels on the engine's stream; read_keys and read_subgen are
  // synchronous (one sync each; read_keys counts its copy in transfers()). subgen_query also
  // serves weighted subgen_kcenter (no state; exact slots with their bias rows).
  std::unique_ptr<ops::SubgenState> make_subgen_state(const cpu::SubgenParams& p, int layers,
                                                           int heads) override;
  void subgen_query(const ops::SubgenState* state, const ops::SubgenAttend& args,
                    const kernels::KvIndex& cache) override;
  void subgen_absorb(ops::SubgenState& state, int layer, const kernels::KvIndex& cache,
                     std::span<const ops::SubgenAbsorb> heads, uint64_t seed) override;
  std::vector<float> read_keys(const kernels::KvIndex& cache, int layer, int head, int first,
                               int count) override;
  cpu::SubgenSketch read_subgen(const ops::SubgenState& state, int layer,
                                int head) override;

  // read_cache_rows: one D2H copy and one sync (cuda_policy_ops_subgen.cu, read_keys' code).
  std::vector<float> read_cache_rows(const kernels::KvIndex& cache, int layer, int head, int first,
                                     int count, ops::CacheRows which) override;
  // write_rows: one counted upload (cuda_policy_ops_channels.cu).
  void write_rows(ops::SlotRows& rows, int layer, std::span<const float> values,
                  int length) override;
  // replay_attention_max: the queries' one upload, one launch (cuda_policy_ops_replay.cu).
  void replay_attention_max(ops::SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                            int layer, const ops::LayerStats& st, int sinks, int first,
                            int count) override;
  // window_attention: the window's queries one counted upload, one launch (a block per window
  // query and query head; cuda_policy_ops_window.cu); the rows stay on the device.
  void window_attention(ops::WindowProbs& out, const kernels::KvIndex& cache, int layer,
                        const ops::LayerStats& st, int w) override;
  std::unique_ptr<ops::WindowProbs> make_window_probs() override;
  // channel_square_means: one launch, one D2H copy, one sync (cuda_policy_ops_channels.cu).
  void channel_square_means(const kernels::KvIndex& cache, int layer, ops::CacheRows which,
                            std::vector<double>* out) override;
  // read_keep_list: a device list's one D2H copy and one sync; a host decision costs none.
  std::vector<int32_t> read_keep_list(const EvictionPlan& plan, int head, int len) override;
  // Synchronous (waits for the stream).
  std::vector<float> read_f32(const ops::SlotRows& rows, int layer, int head) override;
  std::vector<uint64_t> read_u64(const ops::SlotRows& rows, int layer, int head) override;
  // Kernel launches since construction (the ops' cost, countable like the engine's copies).
  int64_t launches() const { return launches_; }
  // Copies to the host and stream syncs the ops made since construction (count_top_across_heads,
  // read_f32, read_u64), and their uploads (kcenter_keep's log table); the engine adds them to
  // its TransferCounters.
  struct Transfers {
    int64_t d2h_copies = 0;
    int64_t stream_syncs = 0;
    size_t d2h_bytes = 0;
    int64_t h2d_copies = 0;
    size_t h2d_bytes = 0;
  };
  const Transfers& transfers() const { return transfers_; }

 private:
  // accumulate's kernel over rows [0, len[h]) of every head, entries at or past fresh[h] new
  // (from 0).
  void launch_accumulate(ops::SlotRows& rows, int layer, const HeadTable& len,
                         const HeadTable& fresh, const float* src, size_t head_stride,
                         size_t row_stride, int group, cpu::GqaReduce how);
  // lists_ with room for `need` entries (contents not kept).
  int32_t* plan_lists(size_t need);
  // f64_ with room for `need` doubles (stream-ordered; contents not kept).
  double* f64_scratch(size_t need);
  // log_table_ with at least `need` entries (filled and uploaded when it grows).
  const float* log_table(size_t need);

  cudaStream_t stream_;
  // keep_top's and kcenter_keep's [heads, ld] lists (stream-ordered allocation)
  int32_t* lists_ = nullptr;
  size_t lists_cap_ = 0;
  // Scratch of count_top_across_heads ([heads, ld] positions, [heads] lengths, [heads]
  // counts).
  int32_t* ranks_ = nullptr;
  size_t ranks_cap_ = 0;
  // fill_top's [heads, ld] selections (stream-ordered allocation).
  int32_t* top_lists_ = nullptr;
  size_t top_lists_cap_ = 0;
  // kcenter_keep's log sizes: entry i = std::log(float(i)) on the host, i < log_cap_ (entry 0
  // unused); the host copy stays for the stream-ordered upload.
  // cosine_to_mean's, lag_scores' and window_attention's f64 scratch (stream-ordered allocation).
  double* f64_ = nullptr;
  size_t f64_cap_ = 0;
  float* log_table_ = nullptr;
  size_t log_cap_ = 0;
  std::vector<float> log_host_;
  int64_t launches_ = 0;
  Transfers transfers_;
};

}  // namespace kvb::kernels::cuda
