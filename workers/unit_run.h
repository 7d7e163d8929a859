// The protocols that run one unit of a bundle, for workers/runner.cc (run_sample, run_bundle):
// prompt assembly, the prefill step (shared or its own), generation (started here, decoded alone
// or in a bundle's batch), choice scoring, streaming perplexity, and the unit's measurements.
// Internal to workers/.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "workers/engine/generate.h"
#include "workers/runner.h"

namespace kvb::workers::detail {

// Milliseconds since t0 (steady clock).
double ms_since(std::chrono::steady_clock::time_point t0);

// The unit time limit: throws UnitTimeout when `spent_ms` (of which `before_ms` in a shared
// prefill the unit started from) is above RunSettings::time_limit_s. With `pass`, the message
// says where the pass stopped ("stopped <pass> before layer <layer> of <layers>"). Under tensor
// parallelism the ranks decide together (kernels::any_rank): every rank must call it at the same
// points.
void check_time(const RunSettings& rs, double spent_ms, double before_ms, const tasks::Sample& s,
                kernels::Communicator* tp, const char* pass, int layer, int layers);

// While alive, `engine` calls `check` before each layer of its passes
// (Engine::set_layer_check); cleared when it goes, an exception included. One at a time.
class LayerDeadline {
 public:
  LayerDeadline(engine::Engine& engine, engine::Engine::LayerCheck check);
  ~LayerDeadline();
  LayerDeadline(const LayerDeadline&) = delete;
  LayerDeadline& operator=(const LayerDeadline&) = delete;

 private:
  engine::Engine& engine_;
};

// Occupancy and memory sampled after prefill compression and after each step. Under tensor
// parallelism each rank records its own heads per sample and finish() combines the ranks once
// (sums of slots and bytes, maxima of lengths, per sample), so no step pays a collective.
class Tracker {
 public:
  // Bytes as `engine` stores the cache (on the GPU: its device cache, not the host mirror).
  Tracker(const kernels::KvCache& cache, const engine::Engine& engine)
      : cache_(cache), engine_(engine), tp_(engine.tp()) {}
  void sample() {
    slots_.push_back(cache_.total_slots());
    longest_.push_back(cache_.max_length());
    logical_.push_back(engine_.kv_logical_bytes(cache_));
    physical_.push_back(engine_.kv_physical_bytes(cache_));
  }
  void finish(UnitMeasurements& m) {
    const auto& s = cache_.shape();
    sample();  // the final state counts toward the peaks too (the last step is sampled only here)
    std::vector<int64_t> pruned = {static_cast<int64_t>(engine_.kv_pruned_channel_bytes(cache_))};
    int lo = INT32_MAX, hi = 0;
    for (int l = 0; l < s.num_layers; ++l) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        lo = std::min(lo, cache_.length(l, h));
        hi = std::max(hi, cache_.length(l, h));
      }
    }
    int64_t heads = s.num_kv_heads;
    if (tp_) {
      combine(slots_, [](int64_t a, int64_t b) { return a + b; });
      combine(longest_, [](int64_t a, int64_t b) { return std::max(a, b); });
      combine(logical_, [](int64_t a, int64_t b) { return a + b; });
      combine(physical_, [](int64_t a, int64_t b) { return a + b; });
      combine(pruned, [](int64_t a, int64_t b) { return a + b; });
      lo = -kernels::all_max(*tp_, -lo);
      hi = kernels::all_max(*tp_, hi);
      heads *= tp_->size();
    }
    const double per_head = static_cast<double>(s.num_layers) * heads;
    const size_t n = slots_.size() - 1;  // samples before the final one
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += slots_[i] / per_head;
    m.occupancy_mean = n ? sum / n : 0;
    m.occupancy_final = slots_.back() / per_head;
    m.occupancy_min_final = lo;
    m.occupancy_max_final = hi;
    m.kv_bytes_final = logical_.back();
    m.channel_bytes_pruned = static_cast<size_t>(pruned[0]);
    m.kv_bytes_peak = *std::max_element(logical_.begin(), logical_.end());
    m.kv_physical_peak = *std::max_element(physical_.begin(), physical_.end());
    m.occupancy_peak = static_cast<int>(*std::max_element(longest_.begin(), longest_.end()));
  }

 private:
  // Element-wise over the ranks' series (every rank sampled at the same points).
  template <typename Op>
  void combine(std::vector<int64_t>& v, Op op) {
    const std::vector<std::vector<int64_t>> all = kernels::all_gather_vectors(*tp_, v);
    for (size_t r = 1; r < all.size(); ++r) {
      KVB_CHECK(all[r].size() == v.size()) << "tensor-parallel ranks sampled the cache "
                                           << v.size() << " and " << all[r].size() << " times";
    }
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = all[0][i];
      for (size_t r = 1; r < all.size(); ++r) v[i] = op(v[i], all[r][i]);
    }
  }

  const kernels::KvCache& cache_;
  const engine::Engine& engine_;
  kernels::Communicator* tp_;
  std::vector<int64_t> slots_, longest_, logical_, physical_;
};

struct PromptTokens {
  std::vector<int32_t> head, context, question, tail;
  int truncated = 0;
  size_t size() const { return head.size() + context.size() + question.size() + tail.size(); }
};

// Template head/tail around context + question; middle truncation of the user message
// (LongBench pred.py: keep the first and last halves) so the prompt plus max_new_tokens fits.
// `ctx_limit`: the model's context (0: lm.model's; a tokenizer-only LoadedModel, as `kvbench
// show` loads, passes its header's).
PromptTokens build_prompt(const LoadedModel& lm, const tasks::Sample& s, const RunSettings& rs,
                          int ctx_limit = 0);
// A perplexity sample's scored stream: its text encoded (with BOS where the model wants one), cut
// to its max_tokens and then to the context `ctx_limit`; `*truncated`: tokens cut by the latter.
std::vector<int32_t> perplexity_tokens(const LoadedModel& lm, const tasks::Sample& s,
                                       int ctx_limit, int* truncated);

// One prompt prefill shared by the bundle's oneshot policies.
struct SharedPrefill {
  engine::PrefillRecord record;
  kernels::KvCache full;
  std::vector<float> logits;
  double ms = 0;
  int reused = 0;  // prompt tokens whose forward pass an earlier prompt's prefill computed
};

// The tokens prefilled at once (`first`) and those streamed after compression (`rest`: the
// question and the template's tail, under QuestionPlacement::kAfterCompression).
void split_prompt(const PromptTokens& p, const RunSettings& rs, std::vector<int32_t>* first,
                  std::vector<int32_t>* rest);
// Policy::set_question_tokens (Finch's window) for a prompt split into `first` and `rest`: the
// question's and the template's tail's tokens that `first` prefills (none when they are
// streamed after compression).
void hand_question(policies::Policy& policy, const PromptTokens& p,
                   const std::vector<int32_t>& rest);

// One unit being run: what its protocol reads, its policy and what it fills in.
struct Unit {
  const LoadedModel& lm;
  engine::Engine& engine;
  const tasks::Sample& s;
  const RunSettings& rs;
  size_t index;  // in the bundle (RunFaults, on_final_cache)
  std::unique_ptr<policies::Policy> policy;
  UnitOutput out;
  double policy_ms = 0;  // time in its policy hooks (engine.policy_ms() deltas, batch shares)
};

// The prompt's state after the prefill step, which choice and generation start from.
struct Prompted {
  std::vector<float> logits;  // after the prompt (and a question streamed on top)
  std::chrono::steady_clock::time_point t0;
  double shared_ms = 0;  // the shared prefill this unit started from (0: its own)
};

// A prompted unit from its prefill to its end. On the heap: the tracker refers to the cache, the
// generation to the options, on_token to both.
struct PromptedRun {
  kernels::KvCache cache;
  Tracker tr;
  Prompted pre;
  engine::GenerateOptions go;
  std::unique_ptr<engine::Generation> gen;  // null for choice scoring
  std::vector<int32_t> ids;                 // generated so far (stop strings)
  bool first_token = true;
  bool stopped = false;
  std::string stopped_text;
  kernels::CommStats comm1;
  std::chrono::steady_clock::time_point decode_t0;
  double batch_sum = 0;  // over its decode steps: the number of sequences each ran with
  PromptedRun(kernels::KvCache c, const engine::Engine& engine)
      : cache(std::move(c)), tr(cache, engine) {}
};

// A prompted unit after its decode (or its choices): the generation's result, the tracker's
// occupancy and memory, and the final-cache hook.
void finish_prompted(Unit& u, PromptedRun& r);

// A unit's policy; its protocol then runs (run_perplexity, start_prompted ...).
std::unique_ptr<Unit> make_unit(const LoadedModel& lm, engine::Engine& engine,
                                const tasks::Sample& s, const policies::PolicyConfig& unit_pc,
                                const RunSettings& rs, size_t unit_index);

// What every protocol measures the same way, after it ended.
UnitOutput complete_unit(Unit& u);

// Starts a unit: perplexity runs whole; a prompted unit runs up to its decode (returned unless
// it needs none). The unit's policy time so far is in u.policy_ms.
std::unique_ptr<PromptedRun> start_unit(Unit& u, const SharedPrefill* shared);

}  // namespace kvb::workers::detail
