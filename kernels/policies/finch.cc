// `finch` (kvpress FinchPress; Corallo and Papotti 2024, "FINCH: Prompt-guided Key-Value Cache
// Compression for Large Language Models", TACL): SnapKV's observation-window scores with the
// prompt's question as the window. After each layer's prompt, every KV head keeps the window
// (the tokens after the context: the question and the template's tail) and its top
// kv_budget - w context tokens by the question's attention (kvpress's evaluation compresses the
// question with the context and adds the tail after it: the tail's queries do not score), each
// question query weighted by its number of earlier keys before the mean (kvpress's
// normalize_scores), averaged over the GQA group, without pooling. Optionally per run of chunk_length slots (kvpress's chunk_length).
// Keys are re-rotated to 0..n-1 by default (kvpress's rerotate_keys; `positions: rerotate`).
// It decides through the ops table (window_scores, keep_top), so on a device the statistics and
// the keep lists stay there; only chunk_length's scores come to the host.
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "kernels/policies/policies.h"
#include "kernels/policies/scorer.h"

namespace kvb::policies {
namespace {

class Finch final : public Policy {
 public:
  explicit Finch(const PolicyConfig& c) : Policy(c) {
    window_size_ = c.options.get_int("window_size", 0, 0, 1 << 20);
    chunk_length_ = c.options.get_int("chunk_length", 0, 0, 1 << 30);
    scoring_.pool_kernel = 1;
    scoring_.window_reduce = c.options.get_bool("normalize_scores", true)
                                 ? WindowReduce::kWeightedMean
                                 : WindowReduce::kMean;
    scoring_.gqa_reduce = GqaReduce::kMean;
    // kvpress's rerotate_keys defaults to true: `positions` defaults to rerotate here, except on
    // models with sliding-window layers, where re-rotation is refused (make_policy) and the
    // default is true (an explicit rerotate is still refused there).
    const char* positions = c.shape.sliding_layers ? "true" : "rerotate";
    rerotate_ = c.options.get_string("positions", positions, {"true", "rolling", "rerotate"}) ==
                "rerotate";
  }

  void set_question_tokens(int question, int tail) override {
    question_ = question;
    tail_ = tail;
  }

  StatsRequest prefill_request(int n_new) const override {
    (void)n_new;  // the engine clamps last_w to the block length
    return {.last_w = window()};
  }
  bool decides_with_ops() const override { return true; }

  void on_prefill_layer(const LayerStats& st, const kernels::KvIndex& cache,
                        kernels::EvictionPlan& plan) override {
    const int heads = cache.shape().num_kv_heads;
    int prompt_len = 0;
    for (int h = 0; h < heads; ++h) prompt_len = std::max(prompt_len, cache.length(st.layer, h));
    if (config_.tp) prompt_len = kernels::all_max(*config_.tp, prompt_len);
    // POLICIES.md "Compression threshold": a prompt of at most kv_budget tokens stays whole.
    if (prompt_len <= kv_budget()) return;
    const int w = st.last_w;
    KVB_CHECK(st.last_probs != nullptr && w >= 1 && w <= window())
        << "finch: prefill statistics carry last_w = " << w << ", expected 1.." << window();
    PolicyOps& ops = ops_of(st);
    SlotRows& scores = rows_of(scores_, ops, SlotType::kF32, 1, heads);
    // The question's queries score (kvpress compresses the question with the context and adds
    // the template's tail after); the tail's slots stay with the window's.
    WindowScoreOptions scoring = scoring_;
    const int asking = window_size_ > 0 || question_ <= 0 ? 0 : question_;
    if (w == window() && asking < w) scoring.queries = asking;
    window_scores(ops, scores, 0, scratch_, st, cache, scoring);
    const int budget = kv_budget();
    if (chunk_length_ > 0) {
      keep_per_run(ops, scores, cache, w, plan);
    } else if (budget >= w) {
      // The window stays (kvpress pads its scores with the maximum + 1); the context's top
      // budget - w by score (equal scores: the later slot).
      tops_.clear();
      for (int h = 0; h < heads; ++h) {
        const int len = cache.length(st.layer, h), prefix = scores.length(0, h);
        if (budget - w < prefix) {
          tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = prefix,
                           .k = budget - w});
        }
      }
      if (!tops_.empty()) ops.keep_top(scores, 0, cache, tops_, {}, plan);
    } else {
      // A budget below the window: kvpress's top-k among the window's equal padded scores, which
      // POLICIES.md "Ties" settles towards the recent: each head's last kv_budget slots.
      for (int h = 0; h < heads; ++h) {
        const int len = cache.length(st.layer, h);
        if (len <= budget) continue;
        std::vector<int32_t> slots(budget);
        std::iota(slots.begin(), slots.end(), len - budget);
        plan.keep(h, slots);
      }
    }
    zeros_.assign(heads, 0);
    ops.resize(scores, 0, zeros_);  // the scratch holds nothing between layers (forks copy it)
  }

  std::unique_ptr<Policy> clone() const override { return std::make_unique<Finch>(*this); }

 private:
  // The window: window_size, or the prompt's tokens after its context (the question's, whose
  // queries score, and the template's tail's; without a question the tail's queries score).
  int window() const {
    if (window_size_ > 0) return window_size_;
    KVB_USAGE_CHECK(question_ + tail_ != 0)
        << "policy finch: its window is the prompt's question (the tokens after the context), "
           "and this prompt prefills none: the question is placed after compression or the "
           "task has none. Place the question in the prompt (question: in_prompt) or give "
           "window_size=N";
    KVB_USAGE_CHECK(question_ >= 0)
        << "policy finch: this prompt has no question to take as the window (kvbench generate's "
           "prompt is one text); give --policy-opt window_size=N: its last N tokens";
    return question_ + tail_;
  }

  // chunk_length (kvpress's): each run of chunk_length slots of a head keeps its max(1, int(size
  // x f)) best, f = 1 - compression_ratio (kv_budget / n for a token budget), the window's slots
  // above every context slot (kvpress's padding).
  void keep_per_run(PolicyOps& ops, const SlotRows& scores, const kernels::KvIndex& cache, int w,
                    kernels::EvictionPlan& plan) const {
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      const int len = cache.length(plan.layer(), h);
      std::vector<float> row = ops.read_f32(scores, 0, h);
      KVB_CHECK(static_cast<int>(row.size()) == len - std::min(w, len))
          << "finch: a score row is not as long as its head's context";
      row.resize(len, std::numeric_limits<float>::infinity());
      const double f = config_.budget_fraction > 0
                           ? config_.budget_fraction
                           : static_cast<double>(kv_budget()) / len;
      const std::vector<int32_t> slots = per_run_keep_list(row, chunk_length_, f);
      if (static_cast<int>(slots.size()) < len) plan.keep(h, slots);
    }
  }

  int window_size_ = 0;
  int chunk_length_ = 0;
  int question_ = -1, tail_ = 0;  // set_question_tokens; -1: none given
  WindowScoreOptions scoring_;
  // One layer's scores and their intermediate rows, where the ops keep them: scratch emptied
  // after each decision.
  SlotRowsPtr scores_;
  WindowScratch scratch_;
  std::vector<KeepTop> tops_;
  std::vector<int32_t> zeros_;
};

}  // namespace

PolicyInfo finch_policy_info() {
  return {"finch",
          "FINCH (kvpress FinchPress): per KV head, the question (the prompt after its context) "
          "stays and the context's top kv_budget - w tokens by the question's attention, each "
          "query weighted by its earlier keys; no pooling; positions default to rerotate (true "
          "on models with sliding-window layers)",
          {
              {"window_size", "0",
               "the window w: 0 takes the prompt's tokens after its context (a task's prompt "
               "with question: in_prompt): the question, whose queries score, and the template's "
               "tail, which stays; N: the prompt's last N tokens, all scoring (kvbench "
               "generate's one-text prompt needs it)"},
              {"chunk_length", "0",
               "kvpress's chunk_length: each run of this many slots keeps its max(1, int(size x "
               "(1 - compression_ratio))) best, the window first; 0: the whole prompt at once"},
              {"normalize_scores", "true",
               "weight window query a by its earlier keys (n - w + a) before the mean (kvpress's "
               "normalize_scores); false: SnapKV's plain mean"},
              {"positions", "rerotate",
               "rerotate (kvpress's rerotate_keys=True): after the prompt each head's kept keys "
               "are re-rotated to positions 0..n-1 and the sequence continues at the longest "
               "head's n; true: slots keep their positions (the default on models with "
               "sliding-window layers, where rerotate is refused)",
               {"true", "rerotate"}},
          },
          [](const PolicyConfig& c) { return std::make_unique<Finch>(c); }};
}

}  // namespace kvb::policies
