// The policy ops: the vocabulary eviction policies decide with (issue 13 "Policy state and
// statistics live where the storage lives"; issue 32 "the vocabulary is declared below the
// policies"). It lives in kernels/ops/, below kernels/policies/ and above kernels/cpu/, whose
// functions its CPU instance (cpu_policy_ops.h) is made of; kernels/cuda/ implements the device
// instance (cuda_policy_ops.h). Nothing here includes a policy.
//
// A policy that decides through it (Policy::decides_with_ops) keeps its per-slot state in
// SlotRows made by the table, reads the statistics where the table finds them
// (LayerStats::ops: host pointers for the CPU instance, device pointers for the CUDA one), and
// writes its decisions into the layer's EvictionPlan through keep_top. Policies that decide
// through it: h2o, tova, scissorhands, knorm, the SnapKV family (snapkv, pyramidkv,
// ada_snapkv, ada_pyramidkv: window_scores and ada_head_budgets, compositions
// below, and keep_top), kvpress's scorers (keydiff: cosine_to_mean; observed_attention:
// divide_by_query_counts; cur: cache_norms, normalize_chunks, combine, fill_prefix; lagkv:
// lag_scores; expected_attention: query_moments, quadratic_scores, softmax, add_scalar) and subgen_kcenter on a
// device (kcenter_keep, erase; its weighted variant attends through subgen_query). One copy of
// each policy's logic runs on both instances:
//  - CpuPolicyOps (kernels/ops/cpu_policy_ops.h): the f32 reference; its ops are kernels/cpu/
//    code (select, pool, gqa, history_bits, kcenter), the bits the policies computed before
//    the table.
//  - CudaPolicyOps (kernels/cuda/cuda_policy_ops.h): the twins in kernels/cuda/; rows, scores
//    and keep lists stay on the device, and nothing waits for it (no copy to the host, no sync).
// Lengths are host-known: every op takes them from the cache index (KvCache::length), which
// the engine keeps by each plan's law (the counts keep_top reports).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cpu/gqa.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/subgen_estimator.h"
#include "kernels/eviction_plan.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/layer_stats.h"

namespace kvb::kernels::ops {

using cpu::GqaReduce;

// How window_scores combines the w window queries of a query head. kWeightedMean is FinchPress's
// normalize_scores: window query a weighs (its row's length n + a, n the prefix summed) before
// the mean (window_sum below).
enum class WindowReduce { kMean, kSum, kWeightedMean };

// The options of window_scores (the SnapKV family's, POLICIES.md `snapkv`).
struct WindowScoreOptions {
  int pool_kernel = 7;  // odd, >= 1 (1: no pooling)
  cpu::PoolKind pooling = cpu::PoolKind::kMax;
  WindowReduce window_reduce = WindowReduce::kMean;
  GqaReduce gqa_reduce = GqaReduce::kMean;
  // The window's first `queries` rows score (0: all w). Finch: the question's, not the chat
  // template's tail after it, which stays in the window's slots.
  int queries = 0;
};

enum class SlotType : uint8_t { kF32, kU64 };

// leverage_scores' largest sketch dimension.
constexpr int kMaxSketch = 128;

// standardize's run of entries summed on their own (a device sums the runs in parallel).
constexpr size_t kStandardizeRun = 256;

// Which rows of the cache an op reads: the keys (as cached: post-RoPE) or the values.
enum class CacheRows : uint8_t { kKeys, kValues };

// How combine joins two rows entry by entry.
enum class Combine : uint8_t { kMul, kAdd };

// Per-slot state of a policy (kernels/ops/slot_state.h's SlotState, stored by the ops
// instance that made it): per (layer, head) one row whose entry i belongs to slot i, with a
// host-known length. Only the instance that made it may operate on it.
class SlotRows {
 public:
  SlotRows(SlotType type, int layers, int heads);
  virtual ~SlotRows() = default;
  virtual std::unique_ptr<SlotRows> clone() const = 0;
  SlotType type() const { return type_; }
  int layers() const { return layers_; }
  int heads() const { return heads_; }
  int length(int layer, int head) const {
    return lengths_[static_cast<size_t>(layer) * heads_ + head];
  }
  // Live entries x entry size (the policy's state_bytes).
  size_t bytes() const;

 protected:
  void set_length(int layer, int head, int len) {
    lengths_[static_cast<size_t>(layer) * heads_ + head] = len;
  }
  friend class PolicyOps;

 private:
  SlotType type_;
  int layers_, heads_;
  std::vector<int32_t> lengths_;  // [layers * heads]
};

// A copyable owner of SlotRows (policies are copied by Policy::clone; the copy clones the rows
// where they live: a fork after a shared prefill).
class SlotRowsPtr {
 public:
  SlotRowsPtr() = default;
  explicit SlotRowsPtr(std::unique_ptr<SlotRows> rows) : rows_(std::move(rows)) {}
  SlotRowsPtr(const SlotRowsPtr& o) : rows_(o.rows_ ? o.rows_->clone() : nullptr) {}
  SlotRowsPtr& operator=(const SlotRowsPtr& o) {
    if (this != &o) rows_ = o.rows_ ? o.rows_->clone() : nullptr;
    return *this;
  }
  SlotRowsPtr(SlotRowsPtr&&) noexcept = default;
  SlotRowsPtr& operator=(SlotRowsPtr&&) noexcept = default;
  explicit operator bool() const { return rows_ != nullptr; }
  SlotRows& operator*() const { return *rows_; }
  SlotRows* get() const { return rows_.get(); }
  SlotRows* operator->() const { return rows_.get(); }
  size_t bytes() const { return rows_ ? rows_->bytes() : 0; }

 private:
  std::unique_ptr<SlotRows> rows_;
};

// A rotation of every pair of a head's dimensions by fixed factors: RoPE's rotation averaged over
// positions (kernels/cpu/rope.h rope_mean_rotation), in the layout the model's rows use. Pair i <
// rot_dim / 2 is (2i, 2i + 1) when adjacent (llama GGUFs), else (i, i + rot_dim / 2) (HF's
// rotate_half); dimensions from rot_dim on are left as they are.
struct PairRotation {
  bool adjacent = false;
  int rot_dim = 0;
  std::vector<float> cos, sin;  // [rot_dim / 2]
};

// One head's decision for keep_top: the head keeps the top k of its slots [0, prefix) by row
// `score_head` of the scores, and every slot of [prefix, len). 0 <= prefix <= len,
// 0 <= k < prefix (a head that keeps everything gets no KeepTop).
struct KeepTop {
  int head = 0;
  int score_head = 0;
  int len = 0;
  int prefix = 0;
  int k = 0;
  int kept() const { return k + (len - prefix); }
};

// SubGen's sketches where a device ops instance keeps them (Policy::attends_with_ops: `subgen`
// on a device; its CPU path keeps cpu::SubgenSketch values itself). Copyable through
// SubgenStatePtr: a copy clones the sketches where they live.
class SubgenState {
 public:
  virtual ~SubgenState() = default;
  virtual std::unique_ptr<SubgenState> clone() const = 0;
  // cpu::subgen_sketch_bytes summed over every stream (synchronous on a device: the cluster
  // counts come back; accounting, not a decode step).
  virtual size_t bytes() const = 0;
};

class SubgenStatePtr {
 public:
  SubgenStatePtr() = default;
  explicit SubgenStatePtr(std::unique_ptr<SubgenState> s) : s_(std::move(s)) {}
  SubgenStatePtr(const SubgenStatePtr& o) : s_(o.s_ ? o.s_->clone() : nullptr) {}
  SubgenStatePtr& operator=(const SubgenStatePtr& o) {
    if (this != &o) s_ = o.s_ ? o.s_->clone() : nullptr;
    return *this;
  }
  SubgenStatePtr(SubgenStatePtr&&) noexcept = default;
  SubgenStatePtr& operator=(SubgenStatePtr&&) noexcept = default;
  explicit operator bool() const { return s_ != nullptr; }
  SubgenState& operator*() const { return *s_; }
  SubgenState* get() const { return s_.get(); }
  SubgenState* operator->() const { return s_.get(); }

 private:
  std::unique_ptr<SubgenState> s_;
};

// A window's attention probabilities (window_attention's output), kept where the ops instance
// that made them keeps its rows (make_window_probs): f32 [heads][w][stride], host memory for the
// CPU instance, device memory for a device's. use_window points a LayerStats at them as the
// engine's recorded window, so the SnapKV family's window_scores reads them (valid while this
// lives and until the next window_attention into it).
class WindowProbs {
 public:
  virtual ~WindowProbs() = default;
  const float* data() const { return data_; }
  int heads() const { return heads_; }
  int w() const { return w_; }
  int stride() const { return stride_; }

 protected:
  const float* data_ = nullptr;
  int heads_ = 0, w_ = 0, stride_ = 0;
};

// One layer's queries for SubGen's estimator (the policy's AttendArgs where the ops live):
// query i of n, head h sees its cache head's sketch when compressed[cache head], plus the
// head's exact slots [0, length - n + i] (the block is appended already), each exact logit
// plus its slot's entry of exact_bias when given (cpu::SubgenQueryArgs::exact_bias). With no
// sketch and a bias this is weighted subgen_kcenter's attention: an exact softmax with a
// per-slot logit bias.
struct SubgenAttend {
  int layer = 0;
  int n = 0;
  int num_heads = 0;
  int head_dim = 0;
  float scale = 0;
  const float* q = nullptr;  // [n, num_heads, head_dim] where the ops read
  float* out = nullptr;      // [n, num_heads, head_dim]
  std::span<const uint8_t> compressed;  // host [cache heads]
  // f32 rows made by the same ops, nullable: row (layer, cache head) as long as the head, entry
  // j added to slot j's logit.
  const SlotRows* exact_bias = nullptr;
};

// One head's compression for subgen_kcenter's kcenter_keep: the head keeps the min(k, prefix)
// centres of greedy k-center over the keys of its slots [0, prefix), then every slot of
// [prefix, len) (len: the cache's length). 0 <= prefix <= len, k >= 0.
struct KCenterKeep {
  int head = 0;
  int prefix = 0;
  int k = 0;
};

// One head's share of erase: entries [first, first + count) of its row leave, the later ones
// move down (a slide's compaction of per-slot state).
struct RowErase {
  int head = 0;
  int first = 0;
  int count = 0;
};

// One head's absorb: cache slots [first, end) of `head`, in order, into its sketch with radius
// delta2 (cpu::subgen_absorb's rule); counter_head: the coins' head index (global); fresh: the
// head's first compression, its sketch starts empty.
struct SubgenAbsorb {
  int head = 0;
  int first = 0;
  int end = 0;
  uint32_t counter_head = 0;
  bool fresh = false;
  double delta2 = 0;
};

class PolicyOps {
 public:
  virtual ~PolicyOps() = default;
  // Where the rows and the statistics live: false for the host (the CPU instance).
  virtual bool on_device() const = 0;

  // State rows of `type` for `layers` x `heads`, every row empty.
  virtual std::unique_ptr<SlotRows> make_rows(SlotType type, int layers, int heads) = 0;
  // Throws unless these ops made `rows` (rows of another instance: a usage of the table that
  // mixes engines). Compositions check before their first op, so nothing runs in vain.
  virtual void require_own(const SlotRows& rows) const = 0;
  // Row (layer, h) of every head h < lengths.size() becomes lengths[h] entries long: truncated,
  // or extended with zeros (std::vector::resize).
  virtual void resize(SlotRows& rows, int layer, std::span<const int32_t> lengths) = 0;
  // f32 rows: for every head h and s < rows.length(layer, h),
  //   row(layer, h)[s] += reduce_gqa(src + h * head_stride, row_stride, group, ..., how)[s]
  // (cpu::reduce_gqa's order and bits). src: the statistics where the ops read them
  // (LayerStats pointers of the engine that hands these ops over).
  virtual void accumulate(SlotRows& rows, int layer, const float* src, size_t head_stride,
                          size_t row_stride, int group, GqaReduce how) = 0;
  // resize(rows, layer, lengths), then accumulate(rows, layer, src, ...): a device fuses the
  // new entries' zeros into the sum (one launch; 0 + x is x, so the bits are the two ops').
  virtual void resize_and_accumulate(SlotRows& rows, int layer, std::span<const int32_t> lengths,
                                     const float* src, size_t head_stride, size_t row_stride,
                                     int group, GqaReduce how) {
    resize(rows, layer, lengths);
    accumulate(rows, layer, src, head_stride, row_stride, group, how);
  }
  // Scissorhands' below-threshold history (POLICIES.md "scissorhands"), u64 rows of the stats'
  // layer whose heads hold `before` = length - st.n_new earlier slots: a head with no earlier
  // slot starts from zeros; new slots start at 0; the block's unrecorded queries shift the old
  // bits out; each recorded query (st.last_probs, GQA mean) shifts in "p < threshold"
  // (1 / visible keys, or 1 / (position + 1) with inv_position: the cache's positions where
  // they live), masked to `history` (1..64) bits. The rows end as long as the cache's heads.
  virtual void history_bits(SlotRows& bits, const LayerStats& st, const kernels::KvIndex& cache,
                            int history, bool inv_position) = 0;
  // Vocabulary: L2 norms of a block of vectors appended per row. For every head h <
  // before.size() (== rows.heads()), f32 row (layer, h) holds before[h] entries (0: it starts
  // empty whatever it held, a fresh sequence; otherwise exactly its length) and grows by n:
  // entry before[h] + t = float(sqrt(sum_i v[i]^2)) of v = vectors + (t * src_heads + h /
  // expand) * dim (squares of the f32 entries summed in f64 in index order, the root rounded to
  // f32). expand >= 1: rows that read the same source head (GQA expanded to query heads).
  virtual void append_norms(SlotRows& rows, int layer, std::span<const int32_t> before,
                            const float* vectors, int n, int src_heads, int dim, int expand) = 0;
  // Vocabulary: elementwise scaling. Entries [first[h], length) of f32 row (layer, h), h <
  // first.size(), become entry * factor (one f32 multiply: factor -1 negates exactly).
  virtual void scale(SlotRows& rows, int layer, std::span<const int32_t> first,
                     float factor) = 0;
  // Vocabulary: f32 row (out_layer, h) of `out` = float(popcount) of u64 row (layer, h) of
  // `bits`, as long (out.heads() == bits.heads()).
  virtual void popcount(const SlotRows& bits, int layer, SlotRows& out, int out_layer) = 0;
  // Vocabulary: a window of recorded queries' probabilities summed per query head. `out` has
  // st.num_heads rows (query heads); row (out_layer, q) becomes lengths[q] long (lengths:
  // st.num_heads entries, each <= st.stride; lengths.size() == out.heads()) and holds, for
  // j < lengths[q]:
  //   sum_{a = 0..w-1} st.last_probs[(q * w + a) * st.stride + j], w = st.last_w >= 1
  //   (f32, a in increasing order, from 0.0f; kMean then divides by float(w), not * 1/w).
  // kWeightedMean (FinchPress's normalize_scores: each window query weighted by its number of
  // earlier keys, lengths[q] + a when the window follows the summed prefix) holds instead
  //   float((sum_{a} double(p[a][j]) * double(lengths[q] + a)) / double(w))
  // (f64, a increasing, from 0.0: the products are exact, so contraction cannot change a bit).
  // `queries` (1..w; 0: w): only the window's first that many rows a are summed, and the mean
  // divides by it (the rows keep their place: head q's rows still start at q x w x stride).
  virtual void window_sum(SlotRows& out, int out_layer, const LayerStats& st,
                          std::span<const int32_t> lengths, WindowReduce how,
                          int queries = 0) = 0;
  // Vocabulary: GQA reduction of rows. in.heads() == out.heads() * group (group >= 1); row
  // (out_layer, h) of `out` becomes as long as row (in_layer, h * group) (every row of the
  // group must be as long) and holds cpu::reduce_gqa over rows h*group .. h*group + group - 1
  // (g increasing from the first row; mean divides the sum by float(group), max is std::max).
  // in and out are distinct rows of the same ops.
  virtual void reduce_heads(const SlotRows& in, int in_layer, int group, GqaReduce how,
                            SlotRows& out, int out_layer) = 0;
  // Vocabulary: pooling along positions. Row (out_layer, h) of `out` becomes as long as row
  // (in_layer, h) of `in` (in.heads() == out.heads()) and holds cpu::pool1d of that row over
  // its own length (stride 1, same padding; kernel odd >= 1, 1 copies). in and out distinct.
  virtual void pool(const SlotRows& in, int in_layer, SlotRows& out, int out_layer, int kernel,
                    cpu::PoolKind kind) = 0;
  // Vocabulary: the top k across a layer's heads. For the heads h < scores.heads() of f32 rows
  // (score_layer, h): how many of each head's entries are among the global top k of every row
  // together (kernels/cpu/budget.h global_topk_counts), ranked by score, then by the position of
  // slot j of cache head h in layer `layer` of `cache` (the more recent first), then the lower
  // head; returned to the host (k >= 0; k past the total counts every entry). A device instance
  // computes the counts on the device and makes one D2H copy of `heads` ints and one stream
  // sync (a prefill-only cost, counted in its transfers).
  virtual std::vector<int32_t> count_top_across_heads(const SlotRows& scores, int score_layer,
                                                      const kernels::KvIndex& cache, int layer,
                                                      int64_t k) = 0;
  // Fills `plan` (for `cache`'s layer plan.layer(); the other heads keep everything) for each
  // head in `heads`, selecting by row (score_layer, score_head) of `scores` (POLICIES.md
  // "Ties": higher scores stay, equal scores keep the higher index), and compacts row
  // (plan.layer(), head) of every rows in `state` with the same list. The CPU instance writes
  // a victim where one slot goes and a keep list otherwise; a device instance leaves every
  // list on the device (EvictionPlan::keep_on_device), valid until its next keep_top.
  virtual void keep_top(const SlotRows& scores, int score_layer, const kernels::KvIndex& cache,
                        std::span<const KeepTop> heads, std::span<SlotRows* const> state,
                        kernels::EvictionPlan& plan) = 0;

  // Vocabulary: per-entry division by the number of a prefill's queries that saw the slot
  // (kvpress's ObservedAttentionPress normalisation). For every head h < before.size() of f32
  // row (layer, h), of length len: entry s becomes entry / float(n_queries - max(0, s -
  // before[h])), one f32 division (a slot cached before the block was seen by all n_queries
  // queries, the block's t-th by n_queries - t). Requires len <= before[h] + n_queries.
  virtual void divide_by_query_counts(SlotRows& rows, int layer,
                                      std::span<const int32_t> before, int n_queries) = 0;
  // Vocabulary: each cached row's cosine similarity to its head's mean direction (KeyDiff's
  // anchor). For every cache head h < out.heads() (<= the cache's heads) of layer `layer`, with
  // L = cache.length(layer, h) slots x_j (keys as cached, or values; f32, bf16 widened), f32 row
  // (out_layer, h) becomes L long, entry j = float(dot(x_j, a) / (max(n_j, 1e-8) *
  // max(|a|, 1e-8))), where, in f64 with every product-sum an explicit fused multiply-add in
  // index order (so every instance gives the same bits):
  //   n_j = sqrt(sum_i x_j[i]^2);  u_j = x_j / max(n_j, 1e-12);
  //   a[i] = (sum_{j = 0..L-1} u_j[i]) / L;  |a| = sqrt(sum_i a[i]^2).
  // chunk > 0 (kvpress's ChunkPress): each run of slots [c * chunk, min((c + 1) * chunk, L)) has
  // its own anchor, the same sums over its own slots only (a run is scored as a cache of those
  // slots alone would be, bit for bit); chunk 0: one anchor for the head.
  virtual void cosine_to_mean(SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                              int layer, CacheRows which, int chunk = 0) = 0;

  // Vocabulary: L2 norms of the cached rows. For every cache head h < out.heads() (<= the
  // cache's heads) of layer `layer`, f32 row (out_layer, h) becomes cache.length(layer, h) long,
  // entry j = float(s) with squared, else float(sqrt(s)), s = sum_i x_j[i]^2 of slot j's key (as
  // cached) or value, in f64 as explicit fused multiply-adds in index order.
  virtual void cache_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                           CacheRows which, bool squared) = 0;
  // Vocabulary: each run of `chunk` entries divided by its sum. For every head h < rows.heads(),
  // f32 row (layer, h) is cut into chunks [c * chunk, min((c + 1) * chunk, length)) (chunk 0:
  // the whole row is one chunk); entry e of a chunk of sum s (f64, index order) becomes
  // float(e / s), in f64; a chunk whose sum is 0 stays as it is (kvpress's CURPress divides it
  // into NaNs).
  virtual void normalize_chunks(SlotRows& rows, int layer, int chunk) = 0;
  // Vocabulary: elementwise arithmetic of two rows. f32 row (layer, h) of `rows` becomes
  // row * in (kMul) or row + in (kAdd) with row (in_layer, h) of `in`, one f32 operation per
  // entry, for every head h < rows.heads() (in.heads() >= rows.heads(), equal lengths). `in`
  // may be `rows` itself at another layer.
  virtual void combine(SlotRows& rows, int layer, const SlotRows& in, int in_layer,
                       Combine how) = 0;
  // Vocabulary: entries [0, min(count, length)) of every f32 row (layer, h) become `value` (a
  // scorer's protected sinks).
  virtual void fill_prefix(SlotRows& rows, int layer, int count, float value) = 0;

  // Vocabulary: LagKV's lag-relative scores (kvpress LagKVPress, cross_scoring off). For every
  // cache head h < out.heads() of layer `layer`, with n = cache.length(layer, h), f32 row
  // (out_layer, h) becomes n long:
  //  - n < sinks + 2 * lag: entry j = 1 for j < sinks, else float((j - sinks) / (n - sinks))
  //    (the more recent, the higher);
  //  - otherwise the slots [sinks, sinks + P * lag), P = (n - sinks) / lag, form P partitions;
  //    partition p < P - 1 is scored against partition p + 1 (its reference) and every other
  //    slot (the sinks, the last partition and the remainder) scores 1. For partition p and
  //    rows x (keys, then values): per channel c, lo_c and hi_c are the reference's min and max;
  //    z_t[c] = (x_t[c] - lo_c) / (hi_c - lo_c) (0 where hi_c == lo_c); sd_t = the unbiased
  //    standard deviation of z_t over channels; a_t = softmax of sd over the partition's lag
  //    slots. With s_t = (a_t(keys) + a_t(values)) / 2, entry t = float(rank_t / lag), rank_t
  //    the number of slots u of the partition with s_u < s_t, or s_u == s_t and u < t.
  //  All in f64 in index order (a two-pass mean and variance; max-subtracted exp). A device's exp
  //  may differ from the host's in the last bit, so ranks agree except at such near-ties.
  virtual void lag_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache, int layer,
                          int sinks, int lag) = 0;

  // Vocabulary: the moments of a block's queries after a fixed rotation (kvpress
  // ExpectedAttentionPress's statistics of future queries). out.heads() == st.num_heads; for
  // query head q and its queries x_t (st.pre_rope_queries + (t * num_heads + q) * d, d = head_dim >=
  // rot.rot_dim) for t in [first, st.n_new), m = n_new - first >= 1: y_t = x_t rotated by
  // `rot`, per pair (a, b) with factors (c, s): y_a = fma(x_a, c, -(x_b * s)), y_b = fma(x_a, s,
  // x_b * c), in f64 from the f32 entries. f32 row (out_layer, q) becomes d long, or d + d * d
  // with covariance: mean[i] = (sum_t y_t[i]) / m, then cov[i * d + j] = (sum_t e_t[i] e_t[j]) /
  // m with e_t = y_t - mean (the f64 mean), in f64 with t increasing (the products fused
  // multiply-adds), each rounded to f32 at the end.
  virtual void query_moments(SlotRows& out, int out_layer, const LayerStats& st, int head_dim,
                             int first, const PairRotation& rot, bool covariance) = 0;
  // Vocabulary: a quadratic form of the cached keys per query head (ExpectedAttentionPress's
  // expected logits). out.heads() == moments.heads() == group x the cache heads it reads (query
  // head q reads cache head q / group); with L = cache.length(layer, q / group) and row
  // (moments_layer, q) = mean (d entries), then cov (d * d) when b != 0, f32 row (out_layer, q)
  // becomes L long: entry j = float(fma(b, quad, a * dot)) (b == 0: float(a * dot)) for slot j's
  // key k (as cached), dot = sum_i k[i] mean[i], quad = sum_i k[i] (sum_l cov[i * d + l] k[l]),
  // in f64 as fused multiply-adds in index order.
  virtual void quadratic_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                                int layer, const SlotRows& moments, int moments_layer, int group,
                                double a, double b) = 0;
  // Vocabulary: softmax along positions. Entries [first, length) of every f32 row (layer, h)
  // become float(exp(x - max) / sum) (max over those entries, exp in f64, the sum in index
  // order); entries before `first` are left as they are. A device's exp may differ from the
  // host's in the last bit.
  virtual void softmax(SlotRows& rows, int layer, int first) = 0;
  // Vocabulary: every entry of every f32 row (layer, h) becomes entry + value (one f32 addition).
  virtual void add_scalar(SlotRows& rows, int layer, float value) = 0;
  // Vocabulary: each row's top entries become `value` (kvpress AdaKVPress's safeguard,
  // CriticalKVPress's first stage). For every head h < k.size() (<= rows.heads()) of f32 rows
  // (layer, h): the min(k[h], length) highest entries of row (by_layer, h) of `by` (null: of the
  // row itself; by's row as long) in keep_top's order (higher scores; equal scores, the higher
  // index) are set to value in row (layer, h); k[h] >= 0.
  virtual void fill_top(SlotRows& rows, int layer, std::span<const int32_t> k, float value,
                        const SlotRows* by, int by_layer) = 0;
  // Vocabulary: the L1 norm of each cached value through its query head's slice of the output
  // projection (kvpress CriticalKVPress's vwl1norm). wo: [dim, num_heads x head_dim] where the
  // ops read (f32, or bf16 with wo_bf16), num_heads = out.heads() = group x the cache heads read.
  // For query head q and slot j of cache head q / group, value v, f32 row (out_layer, q) becomes
  // the head's length long: entry j = float(sum_o |z_o|) with z_o = sum_i v[i] W[o][q d + i], in
  // f64: each z_o fused multiply-adds in i order, the |z_o| added in o order.
  virtual void projected_value_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                                     int layer, const void* wo, bool wo_bf16, int dim,
                                     int group) = 0;
  // Vocabulary: attention within chunks of the prompt, every query seeing every key of its chunk
  // (no causal mask), summed over the queries per key (kvpress NonCausalAttnPress, Compactor's
  // non-causal chunked attention), over the tokens [first, first + count) of a block that fills
  // the cache (count >= 1, first + count <= n). out.heads() == st.num_heads == group x the cache
  // heads read (query head q reads cache head q / group), and every head read holds exactly the
  // block: cache.length(layer, h) == st.n_new = n (a prompt's prefill into an empty cache; the ops
  // check it), so token t is slot t. The queries are st.pre_rope_queries rotated by *st.rope at
  // positions st.block_end - n + t (cpu::rope: the engine's own bits), y_t.
  // The range is cut into chunks [c0, c0 + r) of `chunk` (>= 1) from `first` (the last the
  // remainder r). When r < chunk the chunk is padded as kvpress pads it: chunk - r padded keys
  // whose logit is -1e-9f (kvpress's mask value: not -inf, so they share the softmax) and chunk - r
  // padded queries whose logit is 0 on every real key and -1e-9f on every padded one. For each
  // query of the chunk (its real queries in order, then its padded ones):
  //   l_j = y_t . k_j for a real key (f32 fused multiply-adds in index order from 0.0f; keys as
  //   cached), m = max_j l_j (f32), e_j = expf(l_j - m) (the f32 difference; the C library's
  //   bits, kernels/cpu/exp_exact.h), s = sum_j e_j in f64 (real keys in order, then padding);
  // and row (out_layer, q) becomes count long: entry t - first = float(sum over those queries of
  // e_t / s), in f64 in query order. No scaling by 1 / sqrt(d) (kvpress has none). A device's expf
  // may differ from the host's in the last bit.
  virtual void chunk_attention_sums(SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                                    int layer, const LayerStats& st, int first, int count,
                                    int chunk) = 0;
  // Vocabulary: a run of each row. Row (out_layer, h) of `out` becomes entries [first, first +
  // count) of f32 row (in_layer, h) of `in` (out.heads() <= in.heads(), first + count <= that
  // row's length); in and out distinct.
  virtual void slice(const SlotRows& in, int in_layer, int first, int count, SlotRows& out,
                     int out_layer) = 0;
  // Vocabulary: cumulative sums along each row. Every f32 row (layer, h), h < rows.heads():
  // entry j becomes entry 0 + ... + entry j, f32 adds in index order (s = entry 0; s += entry i
  // for i = 1..j). The prefix mass of a score row (a budget by mass rather than by count).
  virtual void cumsum(SlotRows& rows, int layer) = 0;
  // Vocabulary: a gather along each row. Row (out_layer, h) of `out`, h < counts.size() (<=
  // out.heads() and <= in.heads()), becomes counts[h] long: entry t = entry indices[o_h + t] of
  // f32 row (in_layer, h) of `in`, o_h = counts[0] + ... + counts[h - 1] (indices.size() = their
  // sum; every index within its row: refused otherwise). in and out distinct. A keep list
  // applied to a row the plan does not compact (read_keep_list's slots), or any reordering. On a
  // device: the indices one counted upload, one launch.
  virtual void gather(const SlotRows& in, int in_layer, std::span<const int32_t> indices,
                      std::span<const int32_t> counts, SlotRows& out, int out_layer) = 0;
  // Vocabulary: rows padded with their layer's maximum (kvpress CompactorPress's protected ends).
  // Row (out_layer, h) of `out` becomes `before` entries of M, then f32 row (in_layer, h) of
  // `in`, then `after` entries of M (out.heads() <= in.heads()), M the largest entry of every
  // row h < out.heads() of `in` together (f32; std::max in (head, index) order, so a NaN first is
  // kept and a later NaN ignored; no entry at all: 0). in and out distinct.
  virtual void pad_with_max(const SlotRows& in, int in_layer, int before, int after,
                            SlotRows& out, int out_layer) = 0;
  // Vocabulary: approximate leverage scores of a block's pre-RoPE keys under a right sketch
  // (kvpress LeverageScorePress; Compactor). For every head h < out.heads() (<= key_heads) with its keys
  // K_t = st.pre_rope_keys + (t * key_heads + h) * d (d = head_dim) for the tokens t in [first,
  // first + count) of the block (count >= 1, first + count <= st.n_new) and its sketch Phi_h =
  // sketch + h * d * k (host memory, d x k row-major, k <= kMaxSketch), in f64 with every
  // product-sum an explicit fused multiply-add in index order:
  //   mean[i] = (sum_t K_t[i]) / count;  x_t[c] = sum_i (K_t[i] - mean[i]) Phi_h[i][c];
  //   G[a][b] = sum_t x_t[a] x_t[b] (t order) + jitter on the diagonal;
  //   L = the Cholesky factor of G (column by column: s = G[j][j] - sum_{p<j} L[j][p]^2 as fused
  //   multiply-adds in p order, L[j][j] = sqrt(s), L[i][j] = (G[i][j] - sum_p L[i][p] L[j][p]) /
  //   L[j][j]); a pivot s that is not > 0 retries with jitter max(1e-8, 10 x jitter), starting from
  //   1e-2, five tries (kvpress's chol_with_jitter), then the host throws (a device writes NaN
  //   scores: it does not wait to learn);
  //   y = L^{-1} x_t by forward substitution (y_a = (x_t[a] - sum_{b<a} L[a][b] y_b) / L[a][a]);
  // row (out_layer, h) becomes count long: entry t - first = float(max(0, sum_a y_a^2)), the
  // diagonal of X (X^T X + jitter I)^{-1} X^T. The sketch travels to a device with the call (one
  // counted upload).
  virtual void leverage_scores(SlotRows& out, int out_layer, const LayerStats& st, int key_heads,
                               int head_dim, int first, int count, const float* sketch,
                               int k) = 0;
  // Vocabulary: a layer's rows standardised together (kvpress's z-scores, taken over a layer's
  // whole score tensor). With the N entries x of every f32 row (layer, h), h < rows.heads():
  // mean = (sum x) / N and sd = max(sqrt((sum (x - mean)^2) / (N - 1)), 1e-6) (N < 2: sd = 1e-6),
  // in f64, each sum taken per run of kStandardizeRun entries of a row (index order; the squares
  // fused multiply-adds) and the runs' sums added in (head, run) order; every entry becomes
  // float((x - mean) / sd) in f64.
  virtual void standardize(SlotRows& rows, int layer) = 0;

  // Row (layer, head) of each listed head (distinct) loses entries [first, first + count).
  virtual void erase(SlotRows& rows, int layer, std::span<const RowErase> heads) = 0;
  // subgen_kcenter's one-shot compression (POLICIES.md `subgen_kcenter`; the CPU's
  // cpu::kcenter_keep_list per head, keys as the cache holds them, post-RoPE): fills `plan` (for
  // `cache`'s layer plan.layer(); the other heads keep everything) with each listed head's keep
  // list, its centres in increasing index order then [prefix, len), min(k, prefix) + len - prefix
  // slots (host-known). log_sizes (nullable; f32 rows made by these ops): row (plan.layer(),
  // head) of each listed head becomes as long as its list, log(cluster size) for a centre (the
  // CPU's std::log(float) bits) and 0 for the rest. The CPU instance writes host keep lists; a
  // device instance runs cuda::kcenter_greedy_batch (every head in one launch) on the cache's
  // device rows and leaves every list on the device (EvictionPlan::keep_on_device), valid until
  // its next keep_top or kcenter_keep: no copy, no sync.
  virtual void kcenter_keep(const kernels::KvIndex& cache, std::span<const KCenterKeep> heads,
                            SlotRows* log_sizes, kernels::EvictionPlan& plan) = 0;

  // SubGen on a device (Policy::attends_with_ops; kernels/policies/subgen.cc). The CPU policy
  // runs the reference (kernels/cpu/subgen_estimator.h) on host rows itself, so the CPU
  // instance has none of these (they throw); a device instance keeps the sketches, reads the
  // cache's device rows and waits for nothing, except read_keys and read_subgen (synchronous,
  // counted in its transfers).
  // Sketches of layers x heads streams (p: head_dim, s, t, max_clusters), every one empty.
  virtual std::unique_ptr<SubgenState> make_subgen_state(const kernels::cpu::SubgenParams& p,
                                                         int layers, int heads);
  // The estimator's answer for every query of a layer (cpu::subgen_query per row and head).
  // state: null when no head is compressed (weighted subgen_kcenter: no sketch, only exact
  // slots with their bias).
  virtual void subgen_query(const SubgenState* state, const SubgenAttend& args,
                            const kernels::KvIndex& cache);
  // cpu::subgen_absorb of each listed head's slots (distinct heads), bit for bit.
  virtual void subgen_absorb(SubgenState& state, int layer, const kernels::KvIndex& cache,
                             std::span<const SubgenAbsorb> heads, uint64_t seed);
  // Keys of slots [first, first + count) of (layer, head) as f32 on the host [count, head_dim]
  // (`delta: auto` at a head's first compression).
  virtual std::vector<float> read_keys(const kernels::KvIndex& cache, int layer, int head,
                                       int first, int count);
  // One stream's sketch in the CPU's layout (tests).
  virtual kernels::cpu::SubgenSketch read_subgen(const SubgenState& state, int layer, int head);

  // Vocabulary: the cached rows of slots [first, first + count) of (layer, head), keys (as cached,
  // post-RoPE) or values, as f32 on the host [count, head_dim] (bf16 widened exactly): what a
  // decision made on the host from the rows themselves reads (BlockPress). Synchronous on a
  // device: one copy and one sync, counted in its transfers.
  virtual std::vector<float> read_cache_rows(const kernels::KvIndex& cache, int layer, int head,
                                             int first, int count, CacheRows which) = 0;
  // Vocabulary: host values into f32 rows. Row (layer, h) of every head h < rows.heads() becomes
  // `length` entries long and holds values[h * length, (h + 1) * length) (a policy's fixed
  // vectors: qfilter's filters). On a device: one counted upload.
  virtual void write_rows(SlotRows& rows, int layer, std::span<const float> values,
                          int length) = 0;
  // Vocabulary: per cache head h of `layer`, per channel c, the mean over the head's slots of the
  // cached row's c-th entry squared (keys as cached, post-RoPE, or values), into (*out)[h x
  // head_dim + c] on the host: f64 squares of the f32 entries (exact) summed in slot order, / the
  // head's length (0 for an empty head). ThinK's key energy (POLICIES.md `think`). On a device:
  // one launch, one copy and one sync, counted in its transfers.
  virtual void channel_square_means(const kernels::KvIndex& cache, int layer, CacheRows which,
                                    std::vector<double>* out) = 0;
  // Vocabulary: KVzip's context-reconstruction scores (kvpress KVzipPress; POLICIES.md
  // `kvzip`). A block of m = st.n_queries queries (st.last_queries, host rows [m][st.num_heads]
  // [head_dim], post-RoPE) whose keys are each cache head's last m slots of `layer`. For every
  // cache head h < out.heads() (len its length, first + count <= len - m, sinks <= first), each
  // query head q of its group (q / (st.num_heads / heads) == h) and query i < m: the logits of
  // the keys of slots [0, sinks), [first, first + count) and [len - m, len - m + i] (causal),
  // each an f32 fused multiply-add chain of q_i . k over the head_dim in index order divided by
  // sqrtf(head_dim); e = expf(l - the max logit) (f32); Z = their f64 sum in 8 lanes (lane k
  // sums the e of the row's keys j = k mod 8 in that slot order, then ((s0 + s1) + (s2 + s3)) +
  // ((s4 + s5) + (s6 + s7))); p = float(e / Z). Row (out_layer, h) of `out` becomes count long and holds, for j <
  // count, the largest p of slot first + j over every (q, i), from 0.0f. On a device: the
  // queries' one counted upload and one launch, nothing waits.
  virtual void replay_attention_max(SlotRows& out, int out_layer, const kernels::KvIndex& cache,
                                    int layer, const LayerStats& st, int sinks, int first,
                                    int count) = 0;
  // Vocabulary: queries . keys with softmax over a cache layer: a window of the block's queries
  // attending the cache as it is now (kvpress's SnapKV over a compressed cache: `then:` with a
  // SnapKV-family second policy). The window is the last w (1 <= w <= st.n_queries) of
  // st.last_queries (host rows [st.n_queries][st.num_heads][head_dim], after RoPE); its query i
  // sits at position st.block_end - w + i, and query head q reads cache head q / (st.num_heads /
  // heads) (st.num_heads a multiple of the cache's heads). For each (q, i) the visible slots are
  // the head's first v, v the number of its slots whose position is <= the query's (positions
  // increase along a head's slots, as every cache keeps them):
  //   l_s = (sum_c double(query[c]) * double(key_s[c]), c increasing from 0.0) * (1.0 /
  //   sqrt(double(head_dim))) (keys as cached; each product is exact in f64, so contraction
  //   cannot change a bit); m = the largest l_s; e_s = exp(l_s - m) (f64); Z = sum_s e_s (f64,
  //   s increasing from 0.0); entry s = float(e_s / Z).
  // `out` becomes [st.num_heads][w][stride], stride = the layer's longest head, entries from v
  // on 0 (a row with no visible slot is all 0). On a device: the window's queries are one
  // counted upload and one launch computes the rows; nothing waits. A device's exp may differ
  // from glibc's in the last bit of the f64, which the f32 rounding almost always absorbs.
  virtual void window_attention(WindowProbs& out, const kernels::KvIndex& cache, int layer,
                                const LayerStats& st, int w) = 0;
  // An empty WindowProbs of this instance's (window_attention's out).
  virtual std::unique_ptr<WindowProbs> make_window_probs() = 0;
  // The slots head `head` (holding `len`) keeps under `plan`, increasing, on the host: the
  // plan's host decision, or its device list (EvictionPlan::keep_on_device: one copy and one
  // sync, counted). What a decision made after another policy's reads (`then:`, composition).
  virtual std::vector<int32_t> read_keep_list(const kernels::EvictionPlan& plan, int head,
                                              int len) = 0;
  // Row (layer, head) on the host (tests, accounting; synchronous on a device).
  virtual std::vector<float> read_f32(const SlotRows& rows, int layer, int head) = 0;
  virtual std::vector<uint64_t> read_u64(const SlotRows& rows, int layer, int head) = 0;

 protected:
  static void set_length(SlotRows& rows, int layer, int head, int len) {
    rows.set_length(layer, head, len);
  }
};

// Compositions of the vocabulary (kernels/ops/compose.cc): code written once against the table,
// so it runs where the table's instance runs.

// Scratch rows of window_scores, made by the ops on first use and kept by the caller (a
// policy's scratch, not its state).
// A copy starts empty: scratch is no state, and a policy's clone (a fork per unit of a shared
// prefill) need not copy rows the next call overwrites.
// One set of scratch rows a policy keeps between calls (its scores for the layer it decides,
// say): like WindowScratch, a copy starts empty.
struct ScratchRows {
  ScratchRows() = default;
  ScratchRows(const ScratchRows&) {}
  ScratchRows& operator=(const ScratchRows&) { return *this; }
  ScratchRows(ScratchRows&&) noexcept = default;
  ScratchRows& operator=(ScratchRows&&) noexcept = default;
  SlotRowsPtr rows;
};

struct WindowScratch {
  WindowScratch() = default;
  WindowScratch(const WindowScratch&) {}
  WindowScratch& operator=(const WindowScratch&) { return *this; }
  WindowScratch(WindowScratch&&) noexcept = default;
  WindowScratch& operator=(WindowScratch&&) noexcept = default;
  SlotRowsPtr per_query;  // 1 layer x query heads: the window sums
  SlotRowsPtr reduced;    // 1 layer x cache heads: their GQA reduction
};

// The SnapKV family's pooled prefix scores (POLICIES.md `snapkv`, "GQA statistics"). For every
// cache head h (scores.heads() == the cache's heads, st.num_heads a multiple of them: query
// heads h*g..h*g+g-1 belong to h) with prefix_h = max(0, length(st.layer, h) - w), w =
// st.last_w >= 1, f32 row (score_layer, h) becomes prefix_h long and holds, for j < prefix_h:
//   per query head q: r_q = window_sum over prefix_h (options' window_reduce);
//   reduced = reduce_heads of the group's r_q (options' gqa_reduce);
//   row = pool of `reduced` over the head's own prefix_h (options' kernel and kind).
// Three ops, each the CPU's exact arithmetic, so every instance gives the same bits.
void window_scores(PolicyOps& ops, SlotRows& scores, int score_layer, WindowScratch& scratch,
                   const LayerStats& st, const kernels::KvIndex& cache,
                   const WindowScoreOptions& options);
// The same with scratch made for this call (tests, one-shot use).
void window_scores(PolicyOps& ops, SlotRows& scores, int score_layer, const LayerStats& st,
                   const kernels::KvIndex& cache, const WindowScoreOptions& options);

// Knorm's state (POLICIES.md "Further baselines"): f32 rows of the stats' layer, one per cache
// head, whose heads hold `before` = length - st.n_new earlier entries (a head with none starts
// empty), grow by the negated L2 norms of the block's pre-RoPE keys (st.pre_rope_keys:
// [n_new, model_kv_heads, head_dim]); cache head h reads model KV head h / expand. append_norms
// then scale by -1 of the new entries.
void append_negated_key_norms(PolicyOps& ops, SlotRows& rows, const LayerStats& st,
                              const kernels::KvIndex& cache, int model_kv_heads, int expand);

// f32 row (out_layer, h) of `out` = -popcount of u64 row (layer, h) of `bits`, as long
// (Scissorhands' score): popcount, then scale by -1.
void negated_popcount(PolicyOps& ops, const SlotRows& bits, int layer, SlotRows& out,
                      int out_layer);

// Ada-KV's per-head budgets (kernels/cpu/budget.h ada_head_budgets, POLICIES.md `ada_*`) for
// the heads h < scores.heads() of f32 rows (score_layer, h), on the host:
// count_top_across_heads with k = heads * base (base >= 0), then B_h =
// cpu::ada_budgets_from_counts (alpha's floor, half-even rounding, capped by the row's length).
std::vector<int32_t> ada_head_budgets(PolicyOps& ops, const SlotRows& scores, int score_layer,
                                      const kernels::KvIndex& cache, int layer, int base,
                                      double alpha);

// Layer `layer`'s rows on the host, for a decision made there from them (BlockPress and
// ChunkPress, `then:`, the Python policy's ctx.keys, SubGen's and k-center's CPU code): where
// the cache holds its rows on the host (the CPU), a view of them (KvCache::rows_f32: no copy;
// f16 rows converted to f32); else (a device's index) a copy of the layer read through `ops`
// into *scratch, a one-layer host cache of the same slots, rows as f32 and positions (two
// copies and two syncs per head, counted in the ops' transfers), and a view of that. Valid until
// the cache or *scratch changes; `scratch` may be null where the cache is known to hold host
// rows (CPU-only code). Policies read a cache's rows through this alone
// (tests/layering/check_layering.py checks it), so the rows are the storage's business.
kernels::LayerKvView host_layer(PolicyOps& ops, const kernels::KvIndex& cache, int layer,
                                kernels::KvCache* scratch);

// Points st's recorded window (last_probs, last_w, stride) at `probs` (window_attention's),
// so window_scores and window_sum read it on the instance that made it.
void use_window(const WindowProbs& probs, LayerStats* st);

// The CPU instance every host hook without an engine uses (tests' policies::decode_layer).
PolicyOps& cpu_policy_ops();
// The ops a hook decides with: stats.ops, or the CPU instance.
PolicyOps& ops_of(const LayerStats& stats);
// rows, made by `ops` on first use (`type`, layers x heads): a policy's state binds to the ops
// of the first engine that runs it.
SlotRows& rows_of(SlotRowsPtr& rows, PolicyOps& ops, SlotType type, int layers, int heads);

}  // namespace kvb::kernels::ops
