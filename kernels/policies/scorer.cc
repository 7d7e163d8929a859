// kvpress's wrappers of a scorer, AdaKVPress and CriticalKVPress (scorer.h ScorerWrappers),
// written once on the ops vocabulary.
#include "kernels/policies/scorer.h"

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <string>

#include "common/error.h"

namespace kvb::policies {

ScorerWrappers::ScorerWrappers(const PolicyConfig& c, bool rescores, bool chunks)
    : ada_(c.options.get_bool("ada", false)),
      critical_(c.options.get_bool("critical", false)),
      alpha_(c.options.get_double("alpha_safeguard", 0.2, 0.0, 1.0)),
      epsilon_(c.options.get_double("critical_epsilon", 1e-4, 0.0, 1e30)),
      first_(c.options.get_double("first_stage_ratio", 0.5, 0.0, 1.0)),
      interval_(c.options.get_int("decode_interval", 0, 0, 1 << 30)),
      chunk_(c.options.get_int("chunkkv", 0, 0, 1 << 30)),
      chunk_runs_(c.options.get_int("chunk", 0, 0, 1 << 30)),
      fraction_(c.budget_fraction),
      thresholded_(c.options.has("threshold")),
      threshold_(static_cast<float>(c.options.get_double("threshold", 0, -1e30, 1e30))),
      window_(c.options.get_int("threshold_window", 128, 0, 1 << 30)),
      slide_(c.options.get_bool("threshold_decode", false)),
      block_(c.options.get_int("block", 0, 0, 1 << 30)) {
  KVB_USAGE_CHECK(block_ == 0 || rescores)
      << "policy " << c.name << ": block (kvpress's BlockPress) scores subsets of the cache, "
      << "which needs a score of the cache alone (keydiff, cur, lagkv); " << c.name
      << "'s reads the prompt's queries, keys or attention";
  KVB_USAGE_CHECK(block_ == 0 ||
                  (!ada_ && !critical_ && interval_ == 0 && chunk_ == 0 && chunk_runs_ == 0 &&
                   !c.options.has("threshold")))
      << "policy " << c.name << ": block (kvpress's BlockPress wraps a plain scorer) does not "
      << "combine with ada, critical, decode_interval, chunkkv, chunk or threshold; drop one of "
      << "them";
  KVB_USAGE_CHECK(chunk_runs_ == 0 || chunks)
      << "policy " << c.name << ": chunk scores each run of slots with its own statistics, "
      << "which " << c.name << " does not compute per run (keydiff, cur, lagkv and "
      << "expected_attention do)";
  KVB_USAGE_CHECK(chunk_runs_ == 0 ||
                  (!ada_ && !critical_ && interval_ == 0 && chunk_ == 0 &&
                   !c.options.has("threshold") && c.options.get_string("layer_ratios", "").empty()))
      << "policy " << c.name << ": chunk (kvpress's ChunkPress) does not combine with ada, "
      << "critical, decode_interval, chunkkv, threshold or layer_ratios; drop one of them";
  KVB_USAGE_CHECK(interval_ == 0 || rescores)
      << "policy " << c.name << ": decode_interval needs a score of the cache alone (keydiff, "
      << "cur, lagkv); " << c.name << "'s reads the prompt's queries or attention";
  // chunkkv and threshold replace the per-head selection the other wrappers change (kvpress's
  // ChunkKVPress and DMSPress wrap a ScorerPress, not AdaKV or a DecodingPress).
  auto alone = [&](bool on, const char* what) {
    if (!on) return;
    const char* other = ada_            ? "ada"
                        : critical_     ? "critical"
                        : interval_ > 0 ? "decode_interval"
                                        : nullptr;
    KVB_USAGE_CHECK(other == nullptr)
        << "policy " << c.name << ": " << what << " does not combine with " << other
        << " (kvpress's " << (chunk_ > 0 ? "ChunkKVPress" : "DMSPress")
        << " wraps a plain scorer); drop one of them";
  };
  alone(chunk_ > 0, "chunkkv");
  alone(thresholded_, "threshold");
  KVB_USAGE_CHECK(!(chunk_ > 0 && thresholded_))
      << "policy " << c.name << ": give chunkkv or threshold, not both";
  KVB_USAGE_CHECK(!c.options.has("threshold_window") || thresholded_)
      << "policy " << c.name << ": threshold_window applies to threshold; give threshold too";
  KVB_USAGE_CHECK(!slide_ || thresholded_)
      << "policy " << c.name << ": threshold_decode applies to threshold; give threshold too";
  KVB_USAGE_CHECK(!slide_ || rescores)
      << "policy " << c.name << ": threshold_decode scores each generated token alone, which "
      << "needs a score of the cache alone (keydiff, cur, lagkv); " << c.name
      << "'s reads the prompt's queries or attention";
  const std::string list = c.options.get_string("layer_ratios", "");
  if (list.empty()) return;
  KVB_USAGE_CHECK(!thresholded_) << "policy " << c.name
                                 << ": layer_ratios sets budgets, which threshold replaces; "
                                    "drop one of them";
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const double r = std::strtod(item.c_str(), &end);
    KVB_USAGE_CHECK(!item.empty() && end == item.c_str() + item.size() && r >= 0 && r < 1)
        << "policy " << c.name << ": layer_ratios entry '" << item << "' of '" << list
        << "' is not a compression ratio in [0, 1) (kvpress's fraction removed per layer)";
    layer_ratios_.push_back(r);
  }
  KVB_USAGE_CHECK(static_cast<int>(layer_ratios_.size()) == c.shape.num_layers)
      << "policy " << c.name << ": layer_ratios gives " << layer_ratios_.size()
      << " ratios for a model of " << c.shape.num_layers << " layers (one per layer)";
}

bool ScorerWrappers::decode_due(int layer, int num_layers) {
  if (interval_ == 0) return false;
  if (steps_.empty()) steps_.assign(num_layers, 0);
  if (++steps_.at(layer) < interval_) return false;
  steps_[layer] = 0;
  return true;
}

int ScorerWrappers::budget(int layer, const kernels::KvIndex& cache, int kv_budget) const {
  if (layer_ratios_.empty()) return kv_budget;
  int n = 0;
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) n = std::max(n, cache.length(layer, h));
  const double r = layer_ratios_.at(layer);
  // At least one slot (kvpress's int() can leave a head none).
  return r == 0 ? n : std::max(1, static_cast<int>(n * (1 - r)));
}

namespace {
ParamDoc chunkkv_param() {
  return {"chunkkv",
          "0",
          "kvpress ChunkKVPress: chunks of this many tokens, scored by the mean of the heads' "
          "summed scores; the best chunks (kvpress's count, within kv_budget) stay whole in every "
          "head (0: off)",
          {}};
}
}  // namespace

std::vector<ParamDoc> with_chunkkv(std::vector<ParamDoc> params) {
  params.push_back(chunkkv_param());
  return params;
}

void ScorerWrappers::slide(const kernels::KvIndex& cache, float lone, kernels::EvictionPlan& plan) {
  const int heads = cache.shape().num_kv_heads;
  if (window_scores_.empty()) {  // a cache the prompt's hook did not see
    window_scores_.resize(static_cast<size_t>(cache.shape().num_layers) * heads);
  }
  for (int h = 0; h < heads; ++h) {
    std::vector<float>& w = window_scores_[static_cast<size_t>(plan.layer()) * heads + h];
    w.push_back(lone);
    if (static_cast<int>(w.size()) <= window_) continue;
    const float leaving = w.front();
    w.erase(w.begin());
    // The slot that left the window: window_ slots before the last (the token just appended).
    if (leaving < threshold_) plan.evict(h, cache.length(plan.layer(), h) - 1 - window_);
  }
}

bool ScorerWrappers::acts(const kernels::KvIndex& cache, int layer, int budget) const {
  if (slide_) return true;  // the window's scores are kept for the decode steps, however short
  return over_budget(cache, layer, thresholded_ ? window_ : budget);
}

std::vector<ParamDoc> ScorerWrappers::params() {
  return {
      {"ada",
       "false",
       "Ada-KV's allocation (kvpress AdaKVPress): the layer's heads x kv_budget best slots "
       "across heads, each head keeping at least alpha_safeguard x kv_budget",
       {"true", "false"}},
      {"alpha_safeguard", "0.2", "with ada: the share of kv_budget every head keeps", {}},
      {"critical",
       "false",
       "CriticalKV (kvpress CriticalKVPress): the score times each value's L1 norm through "
       "the output projection, after the score's first_stage_ratio x kv_budget best",
       {"true", "false"}},
      {"critical_epsilon", "0.0001", "with critical: added to the score before the product", {}},
      {"first_stage_ratio",
       "0.5",
       "with critical: the share of the budget kept by the score alone",
       {}},
      {"decode_interval",
       "0",
       "kvpress DecodingPress: every this many decode steps, score the cache again and keep "
       "kv_budget (0: compress the prompt only; keydiff, cur and lagkv)",
       {}},
      {"layer_ratios",
       "",
       "kvpress PerLayerCompressionPress: one compression ratio per layer, comma-separated "
       "(layer l keeps int(n x (1 - r_l)) of its n tokens instead of kv_budget)",
       {}},
      chunkkv_param(),
      {"threshold",
       "",
       "kvpress DMSPress (dense prefill): tokens before the last threshold_window whose score is "
       "below this leave, per head; replaces kv_budget (not given: off)",
       {}},
      {"threshold_window", "128", "with threshold: the last tokens always kept", {}},
      {"chunk",
       "0",
       "kvpress ChunkPress: score each run of this many tokens on its own and keep the best "
       "max(1, int(run x f)) of each, f the budget's fraction (keydiff, cur, lagkv, qfilter, "
       "expected_attention; 0: off)",
       {}},
      {"block",
       "0",
       "kvpress BlockPress: keep kv_budget by scoring the kept tokens with each next block of "
       "this many prompt tokens in turn (keydiff, cur, lagkv; 0: off)",
       {}},
      {"threshold_decode",
       "false",
       "with threshold (kvpress DMSPress decoding=True): score each generated token alone and "
       "drop each token leaving the window whose score is below the threshold (keydiff, cur, "
       "lagkv)",
       {"true", "false"}}};
}

void CacheScorer::host_decide(const LayerStats& st, const kernels::KvIndex& cache, int budget,
                              kernels::EvictionPlan& plan) {
  const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
  const int layer = st.layer, block = wrap_.block();
  PolicyOps& ops = ops_of(st);
  // The layer's rows on the host: the cache's own, or read once from a device (two copies and
  // two syncs per head, counted in the ops' transfers).
  kernels::KvCache pulled;
  int longest = 0;
  for (int h = 0; h < heads; ++h) longest = std::max(longest, cache.length(layer, h));
  const kernels::LayerKvView rows = host_layer(ops, cache, layer, &pulled);
  PolicyOps& host = cpu_policy_ops();
  LayerStats one = st;
  one.layer = 0;
  one.ops = &host;
  // A scratch cache of `slots[h]` of each head, in that order.
  auto scratch_of = [&](const std::vector<std::vector<int32_t>>& slots, int capacity) {
    kernels::KvCache scratch({1, heads, d}, capacity);
    for (int h = 0; h < heads; ++h) {
      for (int32_t s : slots[h]) {
        scratch.append(0, h, rows.key(h, s), rows.value(h, s), rows.position(h)[s]);
      }
    }
    return scratch;
  };
  if (block == 0) {
    // kvpress's ChunkPress: each run of chunk() slots scored as a cache of its rows alone; the
    // heads' rows assembled on the host and kept per run by the wrappers.
    const int run = wrap_.chunk();
    std::vector<float> all(static_cast<size_t>(heads) * longest, 0.0f);
    std::vector<std::vector<int32_t>> slots(heads);
    for (int c0 = 0; c0 < longest; c0 += run) {
      for (int h = 0; h < heads; ++h) {
        slots[h].clear();
        for (int s = c0; s < std::min(c0 + run, cache.length(layer, h)); ++s) slots[h].push_back(s);
      }
      const kernels::KvCache scratch = scratch_of(slots, run);
      SlotRows& score = this->score(host, one, scratch);
      for (int h = 0; h < heads; ++h) {
        const std::vector<float> sc = host.read_f32(score, 0, h);
        std::copy(sc.begin(), sc.end(), all.begin() + static_cast<size_t>(h) * longest + c0);
      }
    }
    SlotRows& runs = rows_of(runs_.rows, host, SlotType::kF32, 1, heads);
    std::vector<int32_t> lengths(heads);
    for (int h = 0; h < heads; ++h) lengths[h] = cache.length(layer, h);
    host.resize(runs, 0, std::vector<int32_t>(heads, 0));
    host.resize_and_accumulate(runs, 0, lengths, all.data(), longest, longest, 1,
                               GqaReduce::kMean);
    wrap_.keep(host, runs, 0, one, cache, budget, plan);
    return;
  }
  // kvpress's BlockPress: each head starts from its first `budget` slots; each next block of
  // `block` slots joins them, the scorer scores the union as a cache of those rows (in the kept
  // slots' order, then the block's), and the best `budget` stay, best first (equal scores: the
  // later slot first). The host ops score: the rows are on the host.
  std::vector<std::vector<int32_t>> kept(heads);
  for (int h = 0; h < heads; ++h) {
    const int len = cache.length(layer, h);
    kept[h].resize(std::min(budget, len));
    std::iota(kept[h].begin(), kept[h].end(), 0);
  }
  std::vector<int32_t> order;
  for (int i = budget; i < longest; i += block) {
    std::vector<std::vector<int32_t>> current(heads);
    for (int h = 0; h < heads; ++h) {
      current[h] = kept[h];
      for (int s = i; s < std::min(i + block, cache.length(layer, h)); ++s) current[h].push_back(s);
    }
    const kernels::KvCache scratch = scratch_of(current, budget + block);
    SlotRows& score = this->score(host, one, scratch);
    for (int h = 0; h < heads; ++h) {
      if (static_cast<int>(current[h].size()) <= budget) continue;
      const std::vector<float> sc = host.read_f32(score, 0, h);
      order.resize(current[h].size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        if (sc[a] != sc[b]) return sc[a] > sc[b];
        return current[h][a] > current[h][b];
      });
      kept[h].resize(budget);
      for (int r = 0; r < budget; ++r) kept[h][r] = current[h][order[r]];
    }
  }
  for (int h = 0; h < heads; ++h) {
    if (cache.length(layer, h) <= budget) continue;
    std::sort(kept[h].begin(), kept[h].end());
    plan.keep(h, kept[h]);
  }
}

void require_whole_prompt(const char* policy, const char* what, const LayerStats& st,
                          const kernels::KvIndex& cache) {
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    KVB_USAGE_CHECK(cache.length(st.layer, h) == st.n_new)
        << "policy " << policy << " scores a prompt by its own " << what
        << ", so the prompt must be prefilled in one block into an empty cache; layer "
        << st.layer << " head " << h << " holds " << cache.length(st.layer, h)
        << " slots after a block of " << st.n_new;
  }
}

void refuse_cross_head_wrappers_under_tp(const PolicyConfig& c) {
  const bool across_heads = c.options.get_bool("ada", false) ||
                            c.options.get_bool("critical", false) || c.options.has("chunkkv") ||
                            c.options.has("threshold");
  KVB_USAGE_CHECK(!across_heads || !c.tp || c.tp->size() == 1)
      << "policy " << c.name << ": its scores are standardised over every head of a layer, which "
      << "tensor parallelism splits across ranks, so ada, critical, chunkkv and threshold (which "
      << "compare scores across heads or against a fixed value) would differ; run it without "
      << "--gpus-per-worker";
}

std::vector<int32_t> chunk_keep_list(std::span<const float> sum, int chunk_length, int budget) {
  const int n = static_cast<int>(sum.size());
  KVB_CHECK(chunk_length >= 1 && budget >= 1)
      << "chunkkv: chunk " << chunk_length << ", budget " << budget;
  // Chunks of min(chunk_length, budget) slots (a budget below the chunk keeps one smaller chunk),
  // the last one the remainder.
  const int chunk = std::min(chunk_length, budget);
  const int chunks = (n + chunk - 1) / chunk;
  std::vector<double> mean(chunks);
  for (int c = 0; c < chunks; ++c) {
    const int lo = c * chunk, hi = std::min(n, lo + chunk);
    double s = 0;
    for (int j = lo; j < hi; ++j) s += sum[j];
    mean[c] = s / (hi - lo);
  }
  std::vector<int> order(chunks);
  std::iota(order.begin(), order.end(), 0);
  // Higher means first; equal means keep the later chunk (POLICIES.md "Ties": the more recent).
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return mean[a] > mean[b] || (mean[a] == mean[b] && a > b);
  });
  // kvpress keeps max(1, int(chunks x (1 - c))) chunks. Its budget b = int(n x (1 - c)) puts
  // 1 - c in [b / n, (b + 1) / n), so floor((b + 1) x chunks / n) is its count unless chunks x
  // (1 - c) falls just below an integer (within chunks / n); never more tokens than the budget.
  const int most = std::max(1, static_cast<int>((static_cast<int64_t>(budget) + 1) * chunks / n));
  std::vector<uint8_t> take(chunks, 0);
  int total = 0, taken = 0;
  for (int c : order) {
    const int len = std::min(n, (c + 1) * chunk) - c * chunk;
    if (taken == most || total + len > budget) break;
    ++taken;
    take[c] = 1;
    total += len;
  }
  std::vector<int32_t> slots;
  slots.reserve(total);
  for (int c = 0; c < chunks; ++c) {
    if (!take[c]) continue;
    for (int j = c * chunk; j < std::min(n, (c + 1) * chunk); ++j) slots.push_back(j);
  }
  return slots;
}

void ScorerWrappers::keep_chunks(PolicyOps& ops, const SlotRows& score, int score_layer,
                                 const kernels::KvIndex& cache, int budget,
                                 kernels::EvictionPlan& plan) {
  const int heads = cache.shape().num_kv_heads, layer = plan.layer();
  const int n = cache.length(layer, 0);
  for (int h = 1; h < heads; ++h) {
    KVB_CHECK(cache.length(layer, h) == n)
        << "chunkkv: the heads of layer " << layer << " hold " << n << " and "
        << cache.length(layer, h) << " slots (its chunks are the same in every head)";
  }
  if (n < chunk_) {  // kvpress's fallback to the scorer's own compression
    keep_top_per_head(ops, score, score_layer, cache, budget, &tops_, plan);
    return;
  }
  // The heads' scores summed per slot, in f32 and head order (kvpress's sum over heads).
  std::vector<float> sum = ops.read_f32(score, score_layer, 0);
  KVB_CHECK(static_cast<int>(sum.size()) == n) << "chunkkv: a score row is not as long as its head";
  for (int h = 1; h < heads; ++h) {
    const std::vector<float> row = ops.read_f32(score, score_layer, h);
    for (int j = 0; j < n; ++j) sum[j] += row[j];
  }
  const std::vector<int32_t> slots = chunk_keep_list(sum, chunk_, budget);
  for (int h = 0; h < heads; ++h) plan.keep(h, slots);
}

void ScorerWrappers::keep_per_chunk(PolicyOps& ops, const SlotRows& score, int score_layer,
                                    const kernels::KvIndex& cache, int budget,
                                    kernels::EvictionPlan& plan) {
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    const int len = cache.length(plan.layer(), h);
    if (len <= budget) continue;
    const std::vector<float> row = ops.read_f32(score, score_layer, h);
    KVB_CHECK(static_cast<int>(row.size()) == len)
        << "chunk: a score row is not as long as its head";
    // kvpress keeps max(1, int(run x (1 - compression_ratio))) per run; a token budget's
    // fraction is kv_budget / n.
    const double f = fraction_ > 0 ? fraction_ : static_cast<double>(budget) / len;
    const std::vector<int32_t> slots = per_run_keep_list(row, chunk_runs_, f);
    if (static_cast<int>(slots.size()) < len) plan.keep(h, slots);
  }
}

std::vector<int32_t> per_run_keep_list(std::span<const float> row, int run, double f) {
  KVB_CHECK(run >= 1) << "per-run keep list: run " << run;
  const int len = static_cast<int>(row.size());
  std::vector<int32_t> order, slots;
  for (int c0 = 0; c0 < len; c0 += run) {
    const int c1 = std::min(len, c0 + run);
    const int k = std::max(1, static_cast<int>((c1 - c0) * f));
    order.resize(c1 - c0);
    std::iota(order.begin(), order.end(), c0);
    // Higher scores first; equal scores keep the later slot (POLICIES.md "Ties").
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a > b);
    });
    if (k < c1 - c0) order.resize(k);
    std::sort(order.begin(), order.end());
    slots.insert(slots.end(), order.begin(), order.end());
  }
  return slots;
}

void ScorerWrappers::keep_above(PolicyOps& ops, const SlotRows& score, int score_layer,
                                const kernels::KvIndex& cache, kernels::EvictionPlan& plan) {
  const int heads = cache.shape().num_kv_heads;
  if (slide_ && window_scores_.empty()) {
    window_scores_.resize(static_cast<size_t>(cache.shape().num_layers) * heads);
  }
  for (int h = 0; h < heads; ++h) {
    const int len = cache.length(plan.layer(), h), prefix = len - window_;
    if (prefix <= 0 && !slide_) continue;
    const std::vector<float> row = ops.read_f32(score, score_layer, h);
    KVB_CHECK(static_cast<int>(row.size()) == len)
        << "threshold: a score row is not as long as its head";
    if (slide_) {  // the window's scores, for the decode steps
      window_scores_[static_cast<size_t>(plan.layer()) * heads + h].assign(
          row.begin() + std::max(0, prefix), row.end());
    }
    if (prefix <= 0) continue;
    std::vector<int32_t> slots;
    slots.reserve(len);
    // kvpress evicts where score < threshold (a NaN score stays); the threshold as an f32.
    for (int j = 0; j < prefix; ++j) {
      if (!(row[j] < threshold_)) slots.push_back(j);
    }
    if (static_cast<int>(slots.size()) == prefix) continue;
    for (int j = prefix; j < len; ++j) slots.push_back(j);
    plan.keep(h, std::move(slots));
  }
}

std::vector<int32_t> ScorerWrappers::ada_counts(PolicyOps& ops, SlotRows& score, int score_layer,
                                                const kernels::KvIndex& cache, int layer,
                                                int budget) {
  const int heads = cache.shape().num_kv_heads;
  // At least one slot per head: kvpress's alpha 0 can leave a head none (its attention then
  // divides 0 by 0).
  k_.assign(heads, std::max(1, static_cast<int>(budget * alpha_)));
  ops.fill_top(score, score_layer, k_, FLT_MAX, nullptr, 0);
  return ops.count_top_across_heads(score, score_layer, cache, layer,
                                    static_cast<int64_t>(heads) * budget);
}

void ScorerWrappers::keep_counts(PolicyOps& ops, SlotRows& score, int score_layer,
                                 const kernels::KvIndex& cache, std::span<const int32_t> counts,
                                 kernels::EvictionPlan& plan) {
  tops_.clear();
  for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
    const int len = cache.length(plan.layer(), h);
    if (len <= counts[h]) continue;
    tops_.push_back({.head = h, .score_head = h, .len = len, .prefix = len, .k = counts[h]});
  }
  if (!tops_.empty()) ops.keep_top(score, score_layer, cache, tops_, {}, plan);
}

void ScorerWrappers::keep(PolicyOps& ops, SlotRows& score, int score_layer, const LayerStats& st,
                          const kernels::KvIndex& cache, int budget, kernels::EvictionPlan& plan) {
  const int heads = cache.shape().num_kv_heads, layer = plan.layer();
  if (thresholded_) {
    keep_above(ops, score, score_layer, cache, plan);
    return;
  }
  if (chunk_runs_ > 0) {
    keep_per_chunk(ops, score, score_layer, cache, budget, plan);
    return;
  }
  if (chunk_ > 0) {
    keep_chunks(ops, score, score_layer, cache, budget, plan);
    return;
  }
  if (!critical_) {
    if (!ada_) {
      keep_top_per_head(ops, score, score_layer, cache, budget, &tops_, plan);
      return;
    }
    const std::vector<int32_t> counts = ada_counts(ops, score, score_layer, cache, layer, budget);
    keep_counts(ops, score, score_layer, cache, counts, plan);
    return;
  }
  KVB_CHECK(st.wo != nullptr && st.wo_dim > 0 && st.num_heads % heads == 0)
      << "critical: the engine gave no output projection";
  const int group = st.num_heads / heads;
  // work layer 0: the projected value norms, the mean over each KV head's query heads.
  SlotRows& per_query = rows_of(per_query_.rows, ops, SlotType::kF32, 1, st.num_heads);
  ops.projected_value_norms(per_query, 0, cache, layer, st.wo, st.wo_bf16, st.wo_dim, group);
  SlotRows& work = rows_of(work_.rows, ops, SlotType::kF32, 2, heads);
  ops.reduce_heads(per_query, 0, group, GqaReduce::kMean, work, 0);
  if (!ada_) {
    // work layer 1: (score + epsilon) x norms, the score's top int(budget x first) first.
    ops.reduce_heads(score, score_layer, 1, GqaReduce::kMean, work, 1);  // a copy
    ops.add_scalar(work, 1, static_cast<float>(epsilon_));
    ops.combine(work, 1, work, 0, Combine::kMul);
    k_.assign(heads, static_cast<int>(budget * first_));
    ops.fill_top(work, 1, k_, FLT_MAX, &score, score_layer);
    keep_top_per_head(ops, work, 1, cache, budget, &tops_, plan);
    return;
  }
  const std::vector<int32_t> counts = ada_counts(ops, score, score_layer, cache, layer, budget);
  k_.resize(heads);
  for (int h = 0; h < heads; ++h) k_[h] = static_cast<int>(counts[h] * first_);
  ops.fill_top(score, score_layer, k_, FLT_MAX, nullptr, 0);
  ops.add_scalar(score, score_layer, static_cast<float>(epsilon_));
  ops.combine(score, score_layer, work, 0, Combine::kMul);
  keep_counts(ops, score, score_layer, cache, counts, plan);
}

}  // namespace kvb::policies
