// Budget allocation arithmetic of POLICIES.md: "Integer budgets" (heavy/recent splits, the
// Scissorhands and SnapKV windows), `pyramidkv`'s per-layer budgets (Ada-KV's code, beta = 20)
// and `ada_*`'s per-head allocation (Ada-KV, seed 004, Algorithm 2 + the code's alpha floor).
// Pure host functions; only global_topk_counts has a data-parallel (and multi-GPU) counterpart.
#pragma once

#include <cstdint>
#include <vector>

namespace kvb::kernels::cpu {

// ---- "Integer budgets": every split rounds the first part down -------------------------------

struct HeavyRecentSplit {
  int heavy = 0;   // floor(kv_budget * heavy_fraction)
  int recent = 0;  // kv_budget - heavy
};
// heavy_fraction in [0, 1]. The product is taken in double, as the reference code's
// int(ratio * budget) does (so 100 * 0.29 gives 28, exactly as Python does).
HeavyRecentSplit split_heavy_recent(int kv_budget, double heavy_fraction);

struct ScissorhandsSplit {
  int recent = 0;  // min(32, floor(kv_budget / 4)): the protected recent window r
  int drop = 0;    // floor(kv_budget / 2): tokens dropped per compression m
};
// Scissorhands' defaults. kv_budget >= 2 (usage error otherwise): with drop = 0 an over-budget
// cache could never shrink.
ScissorhandsSplit scissorhands_split(int kv_budget);

// The SnapKV family's observation window: w = max(1, min(window, floor(kv_budget / 2))), so that
// small budgets still select. kv_budget >= 1, window >= 1.
int snapkv_window(int kv_budget, int window);

struct KCenterSplit {
  int recent = 0;   // the last `recent` tokens kept verbatim
  int centres = 0;  // kv_budget - recent, chosen by greedy k-center
};
// subgen_kcenter: recent < 0 selects the default floor(kv_budget / 2); else 0 <= recent <= budget.
KCenterSplit subgen_kcenter_split(int kv_budget, int recent = -1);

// ---- pyramidkv ------------------------------------------------------------------------------

// Per-layer number of selected prefix tokens (the policy adds the w window tokens), exactly as
// POLICIES.md writes it, in integer arithmetic (all operands are >= 0 where it is evaluated):
//   base = kv_budget - w; min = base / beta; max = 2*base - min;
//   if max >= n - w: max = n - w, min = 2*base - max;
//   step = (max - min) / (L - 1); layer l selects max - l*step.
// window is the caller's w (snapkv_window). Returns [num_layers] entries.
// Edge cases, decided here: prompt_len <= kv_budget is the no-compression case of `snapkv`, and
// every layer gets the whole prefix max(0, prompt_len - w) (the formula would give budgets above
// the prefix there); num_layers == 1 gives layer 0 = max (the literal "max - 0*step"; step
// itself is undefined). The mean over layers may exceed base (the reference code did too).
std::vector<int32_t> pyramid_layer_budgets(int kv_budget, int window, int prompt_len,
                                           int num_layers, int beta = 20);

// ---- ada_snapkv / ada_pyramidkv -------------------------------------------------------------

// Pooled prefix scores of the KV heads of one layer, heads possibly of different lengths.
struct RaggedScores {
  const float* scores = nullptr;       // [num_heads, ld]; head h uses its first lengths[h] entries
  const int32_t* positions = nullptr;  // [num_heads, ld] token positions; nullptr: slot index
  const int32_t* lengths = nullptr;    // [num_heads], each in [0, ld]
  int num_heads = 0;
  int ld = 0;  // row stride of scores and positions
};

// The global top-k over all heads of the layer together: counts[h] = how many of the k
// highest-ranked (head, slot) entries lie in head h. Ranking: higher score, then the more recent
// position, then the lower head index (NaN lowest, -0 == +0, as in select.h). k >= total: every
// entry counts; k <= 0: none. counts: [num_heads]. Multi-GPU replaces just this step with a
// collective over the heads of all ranks; the result must equal this one.
void global_topk_counts(const RaggedScores& s, int k, int32_t* counts);

// Ada-KV's allocation from the counts: B_h = round_half_even((1-alpha)*count_h +
// floor(alpha*base)), capped by lengths[h]. Emulates the reference's torch arithmetic:
// floor(alpha*base) in double (Python int()), the rest in f32, torch.round (half to even).
// alpha in [0, 1] (0: pure adaptive; 0.5: the paper's), base >= 0. budgets: [num_heads].
void ada_budgets_from_counts(const int32_t* counts, const int32_t* lengths, int num_heads, int base,
                             double alpha, int32_t* budgets);

// Both steps: global_topk_counts with k = num_heads * base, then ada_budgets_from_counts.
// counts: [num_heads], nullable (the intermediate counts, for logging and tests).
// Sum of budgets: before rounding it is h*base - h*frac(alpha*base) (minus any capping), and each
// head rounds by at most 1/2, so for alpha = 0.5 and even base it is within h/2 of h*base.
void ada_head_budgets(const RaggedScores& s, int base, double alpha, int32_t* budgets,
                      int32_t* counts = nullptr);

}  // namespace kvb::kernels::cpu
