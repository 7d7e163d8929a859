// What kvpress's ScorerPress does with a score (POLICIES.md "kvpress's presses"): after the
// prompt, each cache head of the layer keeps its kv_budget highest-scoring slots (ties keep the
// more recent, POLICIES.md "Ties"); heads within the budget keep everything.
#pragma once

#include <span>
#include <vector>

#include "kernels/policies/policy.h"

namespace kvb::policies {

// Whether a head of `layer` holds more than `budget` slots (the layer has something to evict).
inline bool over_budget(const kernels::KvIndex& cache, int layer, int budget) {
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    if (cache.length(layer, h) > budget) return true;
  }
  return false;
}

// Fills `plan` for layer plan.layer() of `cache` from f32 rows (score_layer, h) of `score`, one
// per cache head, each as long as its head. tops: the caller's scratch.
inline void keep_top_per_head(PolicyOps& ops, const SlotRows& score, int score_layer,
                              const kernels::KvIndex& cache, int budget, std::vector<KeepTop>* tops,
                              kernels::EvictionPlan& plan) {
  tops->clear();
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    const int len = cache.length(plan.layer(), h);
    if (len <= budget) continue;
    tops->push_back({.head = h, .score_head = h, .len = len, .prefix = len, .k = budget});
  }
  if (!tops->empty()) ops.keep_top(score, score_layer, cache, *tops, {}, plan);
}

// ChunkKV's choice (kvpress ChunkKVPress) for a layer whose per-slot scores summed over its heads
// are `sum` (n > budget entries): chunks of min(chunk_length, budget) slots (the last the
// remainder) ranked by their mean (f64; equal means: the later chunk first), kept in rank order
// while at most max(1, floor((budget + 1) x chunks / n)) (kvpress's count under a
// compression_ratio budget) and within `budget` tokens. The kept slots, increasing.
std::vector<int32_t> chunk_keep_list(std::span<const float> sum, int chunk_length, int budget);

// ChunkPress's and FinchPress's per-run choice for one head's per-slot scores `row`: each run of
// `run` consecutive slots (the last the remainder) keeps its max(1, int(size x f)) best (kvpress's
// compute_n_kept with f = 1 - compression_ratio), higher scores first and equal scores the later
// slot (POLICIES.md "Ties"). The kept slots, increasing.
std::vector<int32_t> per_run_keep_list(std::span<const float> row, int run, double f);

// kvpress's wrappers of a scorer (POLICIES.md "kvpress's presses"; scorer.cc), as options of
// every kvpress scorer:
//  - `ada: true` (AdaKVPress): the layer keeps heads x budget slots in all, each head at least its
//    top max(1, int(budget x alpha_safeguard)). Each row's top that many entries are raised to
//    the largest float (fill_top), the layer's top heads x budget entries across heads are counted
//    per head (count_top_across_heads: equal scores, the more recent first), and each head keeps
//    its count of its own top. kvpress masks the pruned slots in attention; kvbench evicts them.
//  - `critical: true` (CriticalKVPress): the score becomes (score + critical_epsilon) x the mean
//    over the head's query heads of the L1 norm of each value through the output projection
//    (projected_value_norms), except that the score's top int(budget x first_stage_ratio) stay
//    first. With ada too (CriticalAdaKVPress): Ada-KV's per-head budgets B_h from the
//    safeguarded scores, each head's top int(B_h x first_stage_ratio) raised, then the product,
//    and each head keeps its B_h best.
//  - `layer_ratios: r_0,r_1,...` (PerLayerCompressionPress): one kvpress compression ratio per
//    layer; layer l keeps int(n x (1 - r_l)) of its n slots per head instead of kv_budget.
//  - `decode_interval: N` (DecodingPress after the prompt's compression, PrefillDecodingPress):
//    every N decode steps a layer is scored again and compressed back to kv_budget (scorers whose
//    score reads only the cache: keydiff, cur, lagkv).
//  - `chunkkv: N` (ChunkKVPress): the heads' scores summed per slot and averaged over chunks of N
//    consecutive slots; the best chunks are kept whole, the same slots in every head, as many as
//    fit in the budget (keep_chunks).
//  - `chunk: N` (ChunkPress): the scorer scores each run of N slots as a cache of those slots
//    alone (its statistics per chunk; keydiff) and each run keeps its own max(1, int(len x f))
//    best, f the budget's fraction (kvpress's 1 - compression_ratio; kv_budget / n for a token
//    budget) (keep_per_chunk).
//  - `block: N` (BlockPress): kv_budget kept per head by scoring the kept slots with each next block
//    of N prompt slots as a cache of those rows, in turn (CacheScorer::block_decide).
//  - `threshold: t` (DMSPress, its dense prefill): every slot before the last threshold_window
//    whose score is below t leaves; kv_budget does not decide (keep_above). With
//    `threshold_decode: true` (DMSPress's decoding) each generated token is scored alone
//    (CacheScorer::lone_score) and every token leaving the window goes when its score is below
//    t (slide).
class ScorerWrappers {
 public:
  // rescores: the scorer can score the cache again at decode (its score reads only the cache);
  // `decode_interval` is refused otherwise.
  // chunks: the scorer scores runs of slots with their own statistics (`chunk`, ChunkPress).
  explicit ScorerWrappers(const PolicyConfig& c, bool rescores = false, bool chunks = false);
  // `chunk`'s run length, 0: off.
  int chunk() const { return chunk_runs_; }
  // `block`'s block length (kvpress BlockPress), 0: off.
  int block() const { return block_; }
  // The options, for a scorer's PolicyInfo (with_wrappers).
  static std::vector<ParamDoc> params();
  // The layer's budget per head: kv_budget, or with `layer_ratios` (kvpress's
  // PerLayerCompressionPress) int(n x (1 - r_l)) of the layer's n slots (its longest head; r_l 0
  // keeps every slot).
  int budget(int layer, const kernels::KvIndex& cache, int kv_budget) const;
  // Whether layer `layer` has anything to decide at this budget: a head longer than it, or with
  // `threshold` a head longer than threshold_window.
  bool acts(const kernels::KvIndex& cache, int layer, int budget) const;
  // The scorer's own request plus what the wrappers read (the output projection).
  StatsRequest request(StatsRequest scorer) const {
    scorer.output_projection |= critical_;
    return scorer;
  }
  // At decode: the output projection where a compression may run.
  StatsRequest decode_request() const { return {.output_projection = critical_ && interval_ > 0}; }
  // `decode_interval: N` (kvpress's DecodingPress under PrefillDecodingPress): true at every Nth
  // decode step of `layer` (of num_layers), when the policy compresses the cache back to kv_budget
  // with its score; counts per layer, as kvpress's.
  bool decode_due(int layer, int num_layers);
  // threshold_decode: the window's scores move on by a token at each decode step of `layer`.
  bool slides() const { return slide_; }
  // Whether a decode step may evict (decode_interval or threshold_decode).
  bool decodes() const { return interval_ > 0 || slide_; }
  // The decode step's token (the last slot of each head of layer plan.layer()) scored `lone`
  // enters the window; the token leaving it (the slot threshold_window before the last) goes
  // when its score, buffered since it entered, is below the threshold.
  void slide(const kernels::KvIndex& cache, float lone, kernels::EvictionPlan& plan);
  // Fills `plan` (layer plan.layer() of `cache`, the hook's st) from the score rows
  // (score_layer, h), one per cache head, each as long as its head: the scorer's kv_budget best
  // per head, or as the wrappers above say. The score rows may be changed.
  void keep(PolicyOps& ops, SlotRows& score, int score_layer, const LayerStats& st,
            const kernels::KvIndex& cache, int budget, kernels::EvictionPlan& plan);

 private:
  std::vector<int32_t> ada_counts(PolicyOps& ops, SlotRows& score, int score_layer,
                                  const kernels::KvIndex& cache, int layer, int budget);
  void keep_counts(PolicyOps& ops, SlotRows& score, int score_layer, const kernels::KvIndex& cache,
                   std::span<const int32_t> counts, kernels::EvictionPlan& plan);
  // chunkkv: the layer's slot scores (the heads' sum) read to the host, chunk means in f64, the
  // chunks ranked (equal means: the later chunk first) and kept while they fit in `budget`.
  void keep_chunks(PolicyOps& ops, const SlotRows& score, int score_layer,
                   const kernels::KvIndex& cache, int budget, kernels::EvictionPlan& plan);
  // chunk (ChunkPress): per head and run of chunk_runs_ slots, its max(1, int(len x f)) best
  // (equal scores: the later slot), read to the host.
  void keep_per_chunk(PolicyOps& ops, const SlotRows& score, int score_layer,
                      const kernels::KvIndex& cache, int budget, kernels::EvictionPlan& plan);
  // threshold: per head, the slots before the last threshold_window whose score (read to the
  // host) is below float(t) leave.
  void keep_above(PolicyOps& ops, const SlotRows& score, int score_layer,
                  const kernels::KvIndex& cache, kernels::EvictionPlan& plan);

  bool ada_ = false, critical_ = false;
  double alpha_ = 0.2, epsilon_ = 1e-4, first_ = 0.5;
  std::vector<double> layer_ratios_;  // [num_layers], or empty
  int interval_ = 0;                  // decode_interval, 0: off
  int chunk_ = 0;                     // chunkkv's chunk length, 0: off
  int chunk_runs_ = 0;                // chunk's (ChunkPress) run length, 0: off
  double fraction_ = 0;               // PolicyConfig::budget_fraction
  bool thresholded_ = false;          // threshold given
  float threshold_ = 0;
  int window_ = 128;    // threshold_window
  bool slide_ = false;  // threshold_decode
  int block_ = 0;       // block (BlockPress), 0: off
  // threshold_decode: per (layer, head), the scores of the slots in the window, oldest first.
  std::vector<std::vector<float>> window_scores_;
  std::vector<int> steps_;  // decode steps per layer since its last compression
  ScratchRows per_query_, work_;
  std::vector<int32_t> k_;
  std::vector<KeepTop> tops_;
};

// A kvpress scorer whose score reads only the cache (keydiff, cur, lagkv): the hooks and the
// wrappers written once. After the prompt each layer is scored and kept by the wrappers (its
// layer_ratios budget, or kv_budget); with decode_interval, every N decode steps again, back to
// kv_budget. A subclass writes the layer's scores.
class CacheScorer : public Policy {
 public:
  // chunks: the subclass's score() scores runs of chunk() slots on their own (ChunkPress, in the
  // ops: keydiff); otherwise `chunk` scores each run as a cache of its rows, on the host
  // (host_decide).
  explicit CacheScorer(const PolicyConfig& c, bool chunks = false)
      : Policy(c), wrap_(c, /*rescores=*/true, /*chunks=*/true), native_chunks_(chunks) {}
  StatsRequest prefill_request(int) const override { return wrap_.request({}); }
  StatsRequest decode_request() const override { return wrap_.decode_request(); }
  bool decides_with_ops() const override { return true; }
  bool evicts_at_decode() const override { return wrap_.decodes(); }
  bool decides_on_cache_rows() const override { return true; }
  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    decide(st, cache, wrap_.budget(st.layer, cache, kv_budget()), plan);
  }
  void on_decode_layer(const LayerStats& st, const kernels::KvIndex& cache,
                       kernels::EvictionPlan& plan) override {
    if (wrap_.slides()) {
      wrap_.slide(cache, lone_score(), plan);
      return;
    }
    if (wrap_.decode_due(st.layer, cache.shape().num_layers)) decide(st, cache, kv_budget(), plan);
  }

 protected:
  // `chunk: N` (ChunkPress): a subclass made with chunks = true gives each run of N slots in
  // score() the score a cache of those slots alone would get; 0: off.
  int chunk() const { return wrap_.chunk(); }
  // The model's layer being decided: st.layer, except where `block` or `chunk` score a scratch
  // cache of the layer's rows (its layer 0) on the host. For scores that depend on the layer
  // itself (qfilter's filters).
  int model_layer() const { return model_layer_; }
  // The score of a cache holding one slot (threshold_decode: kvpress's DMSPress scores each
  // generated token alone). test_policy_kvpress checks it against score() of a one-slot cache.
  virtual float lone_score() const = 0;
  // Layer st.layer's scores: layer 0 of rows made by `ops`, one row per cache head as long as it.
  virtual SlotRows& score(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache) = 0;

 private:
  void decide(const LayerStats& st, const kernels::KvIndex& cache, int budget,
              kernels::EvictionPlan& plan) {
    if (!wrap_.acts(cache, st.layer, budget)) return;
    model_layer_ = st.layer;
    if (wrap_.block() > 0 || (wrap_.chunk() > 0 && !native_chunks_)) {
      host_decide(st, cache, budget, plan);
      return;
    }
    PolicyOps& ops = ops_of(st);
    wrap_.keep(ops, score(ops, st, cache), 0, st, cache, budget, plan);
  }
  // The wrappers that score subsets of the cache as caches of their own rows, on the host ops (a
  // device's rows are read once per layer: scorer.cc): `block: N` (kvpress BlockPress: the
  // prompt's blocks scored in turn with the kept slots) and, for a scorer without runs of its
  // own, `chunk: N` (ChunkPress: each run scored alone).
  void host_decide(const LayerStats& st, const kernels::KvIndex& cache, int budget,
                   kernels::EvictionPlan& plan);
  ScorerWrappers wrap_;
  bool native_chunks_ = false;
  int model_layer_ = 0;
  ScratchRows runs_;  // chunk's assembled run scores (host rows)
};

// The scorers that read the prompt's own queries or keys (noncausal_attn, leverage, compactor):
// a usage error unless every head of st.layer holds exactly the block (the prompt prefilled in one
// block into an empty cache, as kvpress scores a prefill), naming `what` the policy reads.
void require_whole_prompt(const char* policy, const char* what, const LayerStats& st,
                          const kernels::KvIndex& cache);
// A usage error under tensor parallelism when `c` asks for a wrapper that compares scores across
// heads or with a fixed value (ada, critical, chunkkv, threshold), for a policy whose scores are
// standardised over a layer's heads (which the ranks split).
void refuse_cross_head_wrappers_under_tp(const PolicyConfig& c);

// `params` followed by the chunkkv option's documentation (snapkv's; the kvpress scorers have it
// among ScorerWrappers::params).
std::vector<ParamDoc> with_chunkkv(std::vector<ParamDoc> params);

// A scorer's PolicyInfo parameters followed by ScorerWrappers'.
inline std::vector<ParamDoc> with_wrappers(std::vector<ParamDoc> params) {
  for (ParamDoc& p : ScorerWrappers::params()) params.push_back(std::move(p));
  return params;
}

}  // namespace kvb::policies
