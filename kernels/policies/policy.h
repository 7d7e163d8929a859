// The eviction-policy interface (DESIGN.md "Policy", POLICIES.md). A policy never touches
// attention maths: the engine calls its hooks with the statistics it asked for, and the policy
// decides which slots of each (layer, KV head) stay. A hook reads the cache and fills an
// EvictionPlan (kernels/eviction_plan.h: per head a keep list or a victim); it never edits the
// cache: the engine applies the plan to the cache index and storage together (on the host or a
// device), and the policy compacts its own per-slot state (slot_state.h) with the same list.
// Shared code (kernels/cpu/select, budget, pool) does selection.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/options.h"
#include "kernels/comm.h"
#include "kernels/cpu/gqa.h"
#include "kernels/eviction_plan.h"
#include "kernels/kv_cache.h"
#include "kernels/ops/layer_stats.h"
#include "kernels/ops/policy_ops.h"

namespace kvb::policies {

// The ops vocabulary a policy decides with lives below the policies (kernels/ops/, implemented
// by kernels/cpu/ and kernels/cuda/); a policy names its pieces as its own.
using kernels::cpu::GqaReduce;
using kernels::cpu::reduce_gqa;
using kernels::ops::ada_head_budgets;
using kernels::ops::append_negated_key_norms;
using kernels::ops::cpu_policy_ops;
using kernels::ops::host_layer;
using kernels::ops::KCenterKeep;
using kernels::ops::KeepTop;
using kernels::ops::LayerStats;
using kernels::ops::negated_popcount;
using kernels::ops::ops_of;
using kernels::ops::PolicyOps;
using kernels::ops::RowErase;
using kernels::ops::CacheRows;
using kernels::ops::Combine;
using kernels::ops::ScratchRows;
using kernels::ops::rows_of;
using kernels::ops::SlotRows;
using kernels::ops::SlotRowsPtr;
using kernels::ops::SlotType;
using kernels::ops::use_window;
using kernels::ops::WindowProbs;
using kernels::ops::StatsRequest;
using kernels::ops::merged;
using kernels::ops::SubgenAbsorb;
using kernels::ops::SubgenAttend;
using kernels::ops::SubgenState;
using kernels::ops::SubgenStatePtr;
using kernels::ops::WindowReduce;
using kernels::ops::window_scores;
using kernels::ops::WindowScoreOptions;
using kernels::ops::WindowScratch;

struct ModelShape {
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_seq_len = 0;
  // Some layer attends over a sliding window (Gemma 3, Mistral): `positions: rerotate` is refused.
  bool sliding_layers = false;
};

// Policy options are generic key=value options (common/options.h).
using PolicyOptions = kvb::Options;
using ParamDoc = kvb::ParamDoc;

struct PolicyConfig {
  std::string name;
  int kv_budget = 0;  // retained tokens per KV head per layer (average), sinks/windows included
  // When the budget was given as a fraction of the prompt (kvpress's compression_ratio c: 1 - c;
  // {ratio: r}: r), that fraction, else 0. kv_budget is then the prompt's tokens x it, truncated;
  // a policy whose reference computes with the fraction itself (pyramidkv's kvpress formula)
  // reads it here.
  double budget_fraction = 0;
  ModelShape shape;
  PolicyOptions options;
  uint64_t seed = 0;  // per unit; randomised policies draw from (seed, layer, head, step)
  // Tensor parallelism: the group this rank's share of the heads belongs to (null: one device).
  // `shape` is then the rank's LOCAL shape (num_heads / size query heads, num_kv_heads / size KV
  // heads); the rank holds global KV heads [rank * local, (rank + 1) * local). Decisions that
  // span heads (Ada-KV's top-k, TOVA's layer mean, the prompt length of a layer) go through the
  // group's collectives; seeds and orders use global head indices, so a policy decides exactly
  // as on one device.
  kernels::Communicator* tp = nullptr;
};

enum class PrefillMode { kOneshot, kStreaming };

// What a policy that reconstructs the context (KVzip, Policy::reconstructs_context) needs of the
// prompt's text, in tokens: the runner (or `generate`) tokenizes it with the model's tokenizer.
struct ReplayPrompt {
  int prefix = 0;  // the prompt's chat-template head: its tokens are not reconstructed
  // The instruction before the first chunk, and before each later one (then the previous chunk's
  // last tokens): kvpress KVzipPress's "\n\nRepeat the previous context exactly." and "\n\nRepeat
  // the part of the previous context exactly, starting with".
  std::vector<int32_t> first, next;
  std::vector<int32_t> suffix;  // the chat template's tail after a user turn ("\n" without one)
};

// One reconstruction pass: `tokens` fed on top of the prompt's cache, scoring the prompt's slots
// [first, first + count) (the chunk it repeats).
struct ReplayPass {
  std::vector<int32_t> tokens;
  int first = 0;
  int count = 0;
};

// What a policy that replaces attention (SubGen) receives for one layer. The block's K/V are
// already appended to the cache (post-RoPE); the policy writes the attention output and may
// fill an eviction plan for the layer (absorbed slots leave the cache).
struct AttendArgs {
  int layer = 0;
  int n = 0;                  // query tokens
  int num_heads = 0;
  int head_dim = 0;
  float scale = 0;
  const float* q = nullptr;   // [n, num_heads, head_dim], post-RoPE
  float* out = nullptr;       // [n, num_heads, head_dim]
  bool prefill = false;       // part of the prompt (oneshot block) rather than a decode step
  // A device engine's call to a policy that attends with ops (Policy::attends_with_ops): `ops`
  // is its device ops table, q and out are device pointers, the cache keeps its rows on the
  // device only, and `exact` runs the engine's own attention of q over the layer's cache into
  // out (what a layer owes `full` while nothing is compressed). Null and empty elsewhere: q and
  // out are host rows, the cache's rows are on the host.
  PolicyOps* ops = nullptr;
  std::function<void()> exact;
};

class Policy {
 public:
  // Reads the options every policy takes (common_params()); a policy's constructor reads its own
  // from `config.options` (the caller's object, which records what was used).
  explicit Policy(const PolicyConfig& config);
  virtual ~Policy() = default;
  const PolicyConfig& config() const { return config_; }
  int kv_budget() const { return config_.kv_budget; }
  // KV heads of the cache this policy runs on: num_kv_heads, or num_heads when GQA is expanded.
  // Size per-head state with this, never with shape.num_kv_heads directly.
  int cache_kv_heads() const {
    return gqa_expand_ ? config_.shape.num_heads : config_.shape.num_kv_heads;
  }
  // Tensor parallelism (PolicyConfig::tp): this rank, the group size, and the global index of
  // local cache head h (the same numbering a single device uses).
  int tp_rank() const { return config_.tp ? config_.tp->rank() : 0; }
  int tp_size() const { return config_.tp ? config_.tp->size() : 1; }
  int global_head(int h) const { return tp_rank() * cache_kv_heads() + h; }

  // How the engine feeds the prompt: oneshot (full causal prefill, then on_prefill_layer per
  // layer) or streaming (token by token through on_decode_layer).
  virtual PrefillMode prefill_mode() const { return PrefillMode::kOneshot; }
  // Called once per sequence before its prompt, with the prompt length (budgets may depend on it).
  virtual void begin_sequence(int prompt_len) { (void)prompt_len; }
  // The prompt's tokens after its context: the question's and the chat template's tail's, where
  // the prompt prefills them (both 0 when the question is placed after compression). The runner
  // calls it before begin_sequence and prefill_stats for a task's prompt; `generate`'s raw
  // prompt has no context and never calls it. Finch's window (POLICIES.md `finch`).
  virtual void set_question_tokens(int question, int tail) { (void)question; (void)tail; }
  // Context reconstruction (KVzip; POLICIES.md `kvzip`): after the prompt's prefill, whose hooks
  // compress nothing, engine::reconstruct_context feeds replay_passes(prompt) one at a time on top
  // of the prompt's cache. Between begin_replay and the pass's end, on_prefill_layer scores the
  // pass's chunk and plans to drop the pass's slots (the cache holds the prompt again after each
  // layer; the next position goes back to the prompt's end); after the last pass end_replay, then
  // on_replayed_layer plans each layer's compression. The runner and `generate` hand the
  // reconstruction prompt's tokens first (set_replay_prompt).
  virtual bool reconstructs_context() const { return false; }
  virtual void set_replay_prompt(ReplayPrompt prompt) { (void)prompt; }
  virtual std::vector<ReplayPass> replay_passes(std::span<const int32_t> prompt) const {
    (void)prompt;
    return {};
  }
  virtual void begin_replay(const ReplayPass& pass) { (void)pass; }
  virtual void end_replay() {}
  virtual void on_replayed_layer(int layer, const kernels::KvIndex& cache,
                                 kernels::EvictionPlan& plan) {
    (void)layer; (void)cache; (void)plan;
  }
  // Engine variants a policy may ask for (POLICIES.md "GQA", "Positions", "Decode step order").
  // gqa_expand: K/V copied to every query head (paper-era code; memory x group size), so the
  // cache has num_heads "KV heads" and decisions are per query head.
  virtual bool gqa_expand() const { return gqa_expand_; }
  // rolling_positions: keys cached before RoPE and rotated by their index in the cache at
  // attention time (StreamingLLM); queries by their own index. Slots keep true positions.
  virtual bool rolling_positions() const { return false; }
  // evict_before_attention: at decode, on_decode_layer runs (with no statistics) after the new
  // token is appended and before the query attends (the original StreamingLLM order).
  virtual bool evict_before_attention() const { return false; }
  // evicts_at_decode: on_decode_layer may plan evictions (a decode-time policy: window, h2o,
  // tova, ...; a scorer with decode_interval). `then:` (composition) refuses such a first policy:
  // the composition decides the prompt only, as kvpress's ComposedPress.
  virtual bool evicts_at_decode() const { return false; }
  // decides_on_cache_rows: the prompt decision reads only the cache (rows, lengths, positions)
  // and the layer index, never the prompt's statistics, so it can decide on a scratch cache of
  // another policy's survivors: what `then:` requires of its second policy (CacheScorer).
  virtual bool decides_on_cache_rows() const { return false; }
  // decides_on_window_attention: the prompt decision reads the cache and the probabilities of
  // the block's last w queries (LayerStats::last_probs, w = prefill_request's last_w), nothing
  // else of the prompt's statistics (the SnapKV family): `then:` can recompute those probabilities
  // over another policy's survivors from the block's last queries.
  virtual bool decides_on_window_attention() const { return false; }
  // decides_with_ops: the hooks read the statistics and keep their state through
  // LayerStats::ops (policy_ops.h), so on a device the statistics stay where attention wrote
  // them and the decisions are made there; the host sees only lengths (by the policy's law).
  // Such a policy reads no cache rows and no positions on the host (subgen_kcenter reads its
  // keys through the ops: kcenter_keep).
  virtual bool decides_with_ops() const { return false; }
  // replaces_attention: the engine calls attend() instead of its own attention (SubGen).
  virtual bool replaces_attention() const { return false; }
  // attends_with_ops: on a device engine attend() keeps its state and reads the cache rows
  // through AttendArgs::ops (policy_ops.h: SubGen's sketches); on the CPU it runs its host code
  // as before. A device refuses a policy that replaces attention without it (its cache holds no
  // rows on the host). Hooks that read rows on the host read a device's through the ops
  // (kernels::ops::host_layer); the cache's own host rows exist on the CPU only.
  virtual bool attends_with_ops() const { return false; }
  virtual void attend(const AttendArgs& args, const kernels::KvIndex& cache,
                      kernels::EvictionPlan& plan) {
    (void)args;
    (void)cache;
    (void)plan;
  }

  virtual StatsRequest prefill_request(int n_new) const { (void)n_new; return {}; }
  // What the engine records for the prompt's hooks: prefill_request(n_new), plus the queries
  // ThinK reads when the policy prunes key channels.
  StatsRequest prefill_stats(int n_new) const;

  // ThinK after the policy's token decision (POLICIES.md `think`; kvpress's ComposedPress([press,
  // ThinKPress])): the option `think: r` (or policy `think`'s key_channel_compression_ratio)
  // zeroes int(head_dim x r) key channels of each head after the prompt. Refused with policies
  // that cache keys before RoPE (rolling positions), replace attention, or stream the prompt.
  bool prunes_key_channels() const { return think_ratio_ > 0; }
  // `positions: rerotate` (POLICIES.md "KeyRerotation"; kvpress's KeyRerotationPress): after each
  // layer's prompt decision each head's kept keys are rotated from their positions to 0..len-1
  // (a pure RoPE rotation by len index - position, without the attention factor), the slots take
  // those positions, and after the prompt the sequence continues at the longest head's length.
  // Refused where `think` is (and by full and think, which keep every token) and, by the engine,
  // on models with sliding-window layers.
  bool rerotates() const { return rerotate_; }
  double think_ratio() const { return think_ratio_; }
  // After layer st.layer's prompt hook and its plan were applied (the cache as the policy left
  // it): the layer's key channels (EvictionPlan::zero_key_channels, `plan` arrives reset). Per
  // cache head h: score_c = (mean over the last think_window queries of each query head of h's
  // group of q_c^2, averaged over the group) x (mean over h's slots of k_c^2)
  // (PolicyOps::channel_square_means); the int(head_dim x r) lowest-scoring channels are zeroed
  // (equal scores: the lower channel first) in the slots before st.block_end.
  void on_prefill_channels(const LayerStats& st, const kernels::KvIndex& cache,
                           kernels::EvictionPlan& plan) const;
  virtual StatsRequest decode_request() const { return {}; }
  // After layer `stats.layer` attended over the whole prompt block (the layer's output used the
  // full cache): the plan that compresses that layer (`plan` arrives reset to keep everything).
  virtual void on_prefill_layer(const LayerStats& stats, const kernels::KvIndex& cache,
                                kernels::EvictionPlan& plan) {
    (void)stats; (void)cache; (void)plan;
  }
  // After one decode step's attention in a layer (the new token is the last slot of each head).
  virtual void on_decode_layer(const LayerStats& stats, const kernels::KvIndex& cache,
                               kernels::EvictionPlan& plan) {
    (void)stats; (void)cache; (void)plan;
  }
  // Bytes of the policy's own state (scores, counters, clusters), for memory accounting.
  virtual size_t state_bytes() const { return 0; }
  // A copy with the same state, to fork a cache after a shared prefill.
  virtual std::unique_ptr<Policy> clone() const = 0;

 protected:
  PolicyConfig config_;
  bool gqa_expand_ = false;
  double think_ratio_ = 0;  // `think`, 0: off
  int think_window_ = 32;   // `think_window`
  bool rerotate_ = false;   // `positions: rerotate`
};

// A hook on a host cache, its plan applied to that cache (the CPU engine's path, and what tests
// call): the plan starts reset to keep every head of the hook's layer.
void prefill_layer(Policy& policy, const LayerStats& stats, kernels::KvCache& cache);
void decode_layer(Policy& policy, const LayerStats& stats, kernels::KvCache& cache);
void attend_layer(Policy& policy, const AttendArgs& args, kernels::KvCache& cache);

// Options every policy accepts (listed by `kvbench ls policies` under each policy).
const std::vector<ParamDoc>& common_params();

// Registry (kernels/policies/registry.cc): explicit table, no static-init magic.
struct PolicyInfo {
  std::string name;
  std::string description;
  std::vector<ParamDoc> params;
  std::function<std::unique_ptr<Policy>(const PolicyConfig&)> make;
  // Whether the policy takes a kv budget: false for `full` and `think`, which keep every token
  // (one unit per cell, no budget axis).
  bool budgeted = true;
  // Whether `think` and `positions: rerotate` may follow its decision: false for `subgen`
  // (it replaces attention) and `kvzip` (it decides after its passes), which refuse them;
  // `kvbench ls policies` leaves them out there.
  bool composes = true;
};
// Whether policy `name` takes a kv budget (PolicyInfo::budgeted; an unknown name: true).
bool budgeted(const std::string& name);
const std::vector<PolicyInfo>& policy_registry();
const PolicyInfo* find_policy(const std::string& name);
// The policy of that name; an unknown name is a usage error that lists the known ones.
const PolicyInfo& require_policy(const std::string& name);
// Validates the name, budget and options; throws usage errors that list what is allowed.
std::unique_ptr<Policy> make_policy(const PolicyConfig& config);
// The composition `then:` of policy `info` (its options hold `then`; composed.cc): validated
// and built by make_policy, which callers use.
std::unique_ptr<Policy> make_composed(const PolicyInfo& info, const PolicyConfig& config);

}  // namespace kvb::policies
