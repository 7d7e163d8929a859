// The seam between the transformer block stack, written once (engine.h), and where it runs
// (issue 13 "One block stack"): a Backend owns the weights as it stores them, the activations of
// one forward pass, and the device side of a sequence's KV cache; the stack sequences its ops,
// decides everything that depends on the host-known cache index (lengths, positions, strides),
// and runs the policy hooks. Two instances: CpuBackend (cpu_backend.h, the f32 reference,
// tensor-parallel collectives included) and CudaBackend (cuda_backend.h, one GPU).
//
// Activations are [n, width] f32 row-major buffers named by Act; their widths are the model's
// (kX, kXb, kProj: dim; kQ, kAtt: num_heads * head_dim; kK, kV: num_kv_heads * head_dim; kGate,
// kUp: hidden_dim). They live where the backend computes (host vectors, device buffers) and are
// valid from begin_pass() to the next begin_pass(). Every op is ordered after the previous one
// (the CUDA instance enqueues on one stream; host-visible results are named as such).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/eviction_plan.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "kernels/ops/policy_ops.h"
#include "workers/engine/model.h"

namespace kvb::engine {

enum class Act { kX, kXb, kQ, kK, kV, kAtt, kProj, kGate, kUp };
// A layer's matrices by role; kWq, kWk, kWv carry the layer's bias when the model has one.
enum class Mat { kWq, kWk, kWv, kWo, kGate, kUp, kDown };
// kPostAttn, kPostFfn: Gemma's norms of the attention and MLP outputs (ModelConfig::post_norms).
enum class Norm { kAttn, kFfn, kPostAttn, kPostFfn };
// Qwen3's per-head norms of the projected queries and keys (LayerWeights::q_norm, k_norm).
enum class QkNorm { kQ, kK };

// What a backend moved between host and device and how often it waited for the device, since
// construction (the CPU backend moves nothing). The costs the issue asks to make countable:
// a decode step that copies statistics or K/V rows to the host, or syncs per layer, shows here.
struct TransferCounters {
  int64_t d2h_copies = 0;
  int64_t h2d_copies = 0;
  int64_t stream_syncs = 0;
  size_t d2h_bytes = 0;
  size_t h2d_bytes = 0;
  // Host milliseconds spent blocked in those syncs: near a step's time, the host queued its
  // launches well ahead of the device (device-bound); near 0, the device waited on the host's
  // launches (launch-bound). The CPU backend has none.
  double sync_wait_ms = 0;
};

// Appends a block's n new K/V rows (host, [n, num_kv_heads, head_dim]) to every head of `layer`
// of a host-rows cache at positions[0, n); a cache of num_heads heads (GQA expanded) takes a
// copy per query head. What both backends do with host rows.
void append_block_rows(const ModelConfig& config, int layer, int n, const float* keys,
                       const float* values, const int32_t* positions, kernels::KvCache& cache);

// One sequence of a decode batch in Backend::attention_batch: its row of the pass, its cache,
// and the statistics attention() would be asked for (stats receives their pointers).
struct BatchAttention {
  int row = 0;
  kernels::KvCache* cache = nullptr;
  bool col_sums = false;
  int last_w = 0;
  int stride = 0;
  policies::LayerStats* stats = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", or the GPU's name, for the run's provenance.
  virtual std::string device_description() const = 0;
  virtual size_t device_peak_bytes() const { return 0; }
  // What `cache` costs as this backend stores it (Engine::kv_logical_bytes and its two
  // siblings; measurements.kv_bytes_*): the storage's question, asked of the backend that holds
  // the storage (a device's rows, or what binding them would allocate).
  struct KvBytes {
    size_t logical = 0;          // retained K/V bytes, less pruned_channels
    size_t pruned_channels = 0;  // the key channels a plan zeroed (KvCache::pruned_key_elements:
                                 // what a store that drops them would not hold; POLICIES.md think)
    size_t physical = 0;         // allocated
  };
  virtual KvBytes kv_bytes(const kernels::KvCache& cache) const {
    KvBytes b;
    b.pruned_channels =
        cache.pruned_key_elements() * (cache.shape().f16_keys() ? 2 : sizeof(float));
    b.logical = cache.logical_bytes() - b.pruned_channels;
    b.physical = cache.physical_bytes();
    return b;
  }
  // `positions: rerotate` (Policy::rerotates): every head of `layer` rotates its kept keys from
  // their positions to its slot indices (rope's rotation by slot - position with `rope`'s
  // frequencies and no attention factor) where the rows live, and the index renumbers them
  // (KvCache::renumber_positions).
  virtual void rerotate_keys(int layer, const kernels::cpu::RopeParams& rope,
                             kernels::KvCache& cache);
  // The cache's next position moved by `delta` (after a rerotated prompt: back to the longest
  // head's length); a backend that mirrors it follows.
  virtual void moved_position(kernels::KvCache& cache, int delta) { (void)cache; (void)delta; }
  // Engine::trim_storage: the storage of `cache` beyond its longest head + extra slots per
  // head is freed, rows kept (nothing to do where the host cache is the storage).
  virtual void trim_storage(kernels::KvCache& cache, int extra) {
    (void)cache;
    (void)extra;
  }
  virtual TransferCounters counters() const { return {}; }
  // Whether a new cache stores its rows as f16 (KvCacheShape::f16): the CPU under --dtype
  // native, as llama.cpp's default cache; f32 everywhere else.
  virtual bool f16_rows() const { return false; }
  // The policy ops table (kernels/ops/policy_ops.h) whose instance lives where this
  // backend's statistics and storage do: policies that decide with ops (Policy::
  // decides_with_ops) get it in LayerStats::ops, and on a device their statistics stay there.
  virtual policies::PolicyOps& policy_ops() = 0;
  // A device backend: its storage, its policy ops and its policy time are the device's. The host
  // KvCache is then an index whose rows the backend keeps (KvCache::device_rows; host code that
  // reads them copies a layer through policy_ops(): kernels::ops::host_layer), and policy_ms is
  // device time (begin_policy_span below). Elsewhere (the CPU) the host KvCache holds the rows.
  bool on_device() { return policy_ops().on_device(); }
  // Makes host statistics (a recorded prefill's) readable by policy_ops(): on a device, copies
  // them into device buffers and replaces the pointers (valid until the next call).
  virtual void stats_to_device(policies::LayerStats* stats) { (void)stats; }
  // Layer `layer`'s output projection [dim, num_heads x head_dim] where policy_ops() reads it
  // (StatsRequest::output_projection: CriticalKV's projected value norms); *bf16 says its element
  // type. Valid until the next call.
  virtual const void* output_projection(int layer, bool* bf16) = 0;
  // policy_ms on the device (issue 13 item 5): on a device (on_device()), the engine brackets
  // each hook and the application of its plan with begin_policy_span / end_policy_span, and the
  // backend measures the device time between them (CUDA events: the policy's kernels, and any
  // host work the device waited on); take_policy_ms() returns the spans completed since the
  // last call and is called after end_pass (whose sync completes them) or waits for them.
  // Elsewhere the engine measures host wall time around the hook.
  virtual void begin_policy_span() {}
  virtual void end_policy_span() {}
  // With per_span, each span's milliseconds in the order begun (a decode batch attributes them
  // to its sequences).
  virtual double take_policy_ms(std::vector<double>* per_span = nullptr) {
    if (per_span) per_span->clear();
    return 0;
  }
  // Tensor-parallel collectives sit behind reduce_add().

  // Decode batching (Engine::decode_batch; every backend batches): select_rows(r) makes rope,
  // rope_rows, download, append_kv, attention and attend_replaced act on the pass's rows
  // [r, r + n) (their n), with the positions of those rows, until the next select_rows or
  // begin_pass (which selects row 0).
  virtual void select_rows(int row0) = 0;
  // After begin_pass (which takes sequence 0's cache), each further sequence of a decode batch
  // is bound with its cache (a device backend makes or grows its rows there).
  virtual void bind_sequence(kernels::KvCache& cache) { (void)cache; }

  // --- one forward pass of n tokens ---
  // Sizes the activations for n = tokens.size() rows, embeds the tokens (ids already validated)
  // into kX, times ModelConfig::embed_scale where it is not 1, and takes positions[0, n) as the
  // pass's positions. cache_rows: how many of the pass's rows go into `cache` (n for one
  // sequence; 1 for a decode batch, whose other sequences bind_sequence binds); `cache` already
  // has room for that many more slots per head (KvCache::reserve_extra), and the backend makes
  // its storage hold the cache.
  virtual void begin_pass(std::span<const int32_t> tokens, const int32_t* positions,
                          kernels::KvCache& cache, int cache_rows) = 0;
  // out[r] = rmsnorm(in[r]) * weight for rows [row0, row0 + rows); out's rows start at 0.
  // layer < 0 selects the final norm.
  virtual void rmsnorm(Act out, Act in, int layer, Norm which, int row0, int rows) = 0;
  // Qwen3's q/k norm: a[r] = rmsnorm(a[r]) * weight for the n * heads rows of width head_dim of
  // `a` (kQ with heads = num_heads, kK with num_kv_heads), in place, with the layer's q_norm or
  // k_norm ([head_dim], the same for every head) and the model's norm_eps. After the
  // projection, before RoPE.
  virtual void head_rmsnorm(Act a, int layer, QkNorm which, int heads, int n) = 0;
  // out = in x W^T (+ bias) over n rows.
  virtual void linear(Act out, Act in, int layer, Mat which, int n) = 0;
  // q, k and v of xb (the three linears in that order); gate and up of xb (the two). A device
  // runs each as one product of the concatenated weights; the CPU as the separate ones.
  virtual void linear_qkv(int layer, int n) {
    linear(Act::kQ, Act::kXb, layer, Mat::kWq, n);
    linear(Act::kK, Act::kXb, layer, Mat::kWk, n);
    linear(Act::kV, Act::kXb, layer, Mat::kWv, n);
  }
  virtual void linear_gate_up(int layer, int n) {
    linear(Act::kGate, Act::kXb, layer, Mat::kGate, n);
    linear(Act::kUp, Act::kXb, layer, Mat::kUp, n);
  }
  // x += y over n rows of dim, after summing y over the tensor-parallel group (row-parallel
  // projections: each rank's product is a partial sum).
  virtual void reduce_add(Act x, Act y, int n) = 0;
  // reduce_add with a norm between the sum and the residual (Gemma's post-norms): y = the
  // group's sum of y, then x += rmsnorm(y) * weight (`which` kPostAttn or kPostFfn of `layer`).
  virtual void reduce_norm_add(Act x, Act y, int layer, Norm which, int n) = 0;
  // kGate = act(kGate) * kUp over n rows, act per ModelConfig::ffn_act (SiLU, or tanh GELU).
  virtual void glu(int n) = 0;
  // Rotates `heads` heads of n rows of `a` by the pass's positions, with `layer`'s RoPE
  // (ModelConfig::rope_of: a sliding-window layer has its own base).
  virtual void rope(Act a, int layer, int heads, int n) = 0;
  // Rotates `rows` rows of one head of `a` ([rows, head_dim]) by positions[r] (host array).
  virtual void rope_rows(Act a, int layer, const int32_t* positions, int rows) = 0;
  // Copies `count` floats of `a`, from float `offset` on, to the host (synchronous; host-visible
  // on return).
  virtual void download(Act a, size_t count, float* dst, size_t offset = 0) = 0;
  // A copy of `count` floats of `a` where policy_ops() reads statistics (a device instance:
  // device memory, stream-ordered, valid until the next stash of the same activation): the
  // pre-RoPE keys (kK) or queries (kQ) of a policy that decides with ops on a device. Only where
  // policy_ops().on_device().
  virtual const float* stash(Act a, size_t count) {
    (void)a;
    (void)count;
    KVB_FAIL() << "stash: this backend's policy ops read host statistics";
  }

  // Appends the pass's n new K/V rows (kK post-RoPE, or raw for rolling positions; kV) to every
  // head of `layer` at the pass's positions; a cache of num_heads heads (GQA expanded) takes a
  // copy per query head.
  virtual void append_kv(int layer, int n, kernels::KvCache& cache) = 0;
  // The next attention() on `layer` reads the keys rotated by their slot index (rolling
  // positions) instead of the stored ones; the cache keeps them raw.
  virtual void roll_keys(int layer, kernels::KvCache& cache) = 0;
  // kAtt = causal attention of kQ over the layer's cache (query i of n sees slots
  // [0, length - n + i] of its KV head; on a sliding-window layer only the last
  // ModelConfig::window[layer] of those, and no statistics are asked). With col_sums /
  // last_w > 0, the statistics of POLICIES.md into rows of `stride` entries: stats->col_sums,
  // stats->last_probs, stats->last_w are set (pointers where the backend computed them: call
  // stats_to_host before a host reads).
  virtual void attention(int layer, int n, float scale, kernels::KvCache& cache, bool col_sums,
                         int last_w, int stride, policies::LayerStats* stats) = 0;
  // A prefill continued from a checkpoint (PrefillRecord::continues): the next attention() with
  // col_sums starts its sums from `seed` ([num_heads, seed_stride]: the earlier queries' sums;
  // seed_stride <= its stride, entries past it 0) and adds its queries to them, so they equal
  // one pass's over all the queries, bit for bit. Where seeds_col_sums() (the CPU); the
  // pointer must stay valid until that call.
  virtual bool seeds_col_sums() const { return false; }
  virtual void seed_col_sums(const float* seed, int seed_stride) {
    (void)seed;
    (void)seed_stride;
    KVB_FAIL() << "this backend cannot continue a recorded prefill (prefix reuse is CPU-only)";
  }
  // A decode batch's attention on a global layer for several sequences at once (one query row
  // each, every cache of the same shape, no rolled keys; Engine::attention_batches says when):
  // the results of select_rows(item.row) then attention(layer, 1, scale, *item.cache, ...) for
  // each item in turn, the statistics of each in its own rows (valid until the next attention
  // call). The CUDA instance runs them in a few launches (cuda::attention_batch), the CPU's
  // over the sequences in parallel.
  virtual void attention_batch(int layer, float scale, std::span<const BatchAttention> items) = 0;
  // Makes stats' statistics host-readable (pointers replaced by host copies); returns the
  // milliseconds spent (0 where they already are).
  virtual double stats_to_host(policies::LayerStats* stats) = 0;
  // A policy's replacement attention (Policy::replaces_attention): q and out are kQ and kAtt,
  // wherever they live; the policy's eviction plan for the layer goes into *plan (applied by the
  // caller). The CPU runs Policy::attend over its host rows; a device runs a policy that attends
  // with ops (Policy::attends_with_ops) and refuses any other.
  virtual void attend_replaced(policies::Policy& policy, policies::AttendArgs args,
                               const kernels::KvCache& cache, kernels::EvictionPlan* plan) = 0;
  // Applies a policy's plan for one layer to the host cache (index) and the backend's storage
  // together (on the CPU the host cache is the storage).
  virtual void apply_plan(const kernels::EvictionPlan& plan, kernels::KvCache& cache) = 0;
  // After the last layer: the backend's storage has advanced by n positions.
  virtual void end_layers(int n) { (void)n; }
  // logits ([rows, vocab], host) = classifier(final-normed kXb rows [0, rows)).
  virtual void classify(int rows, std::vector<float>* logits) = 0;
  // End of the pass: host-visible results (logits) are complete; `cache` is what the storage
  // holds.
  virtual void end_pass(kernels::KvCache& cache) { (void)cache; }

  // Decode steps as CUDA graphs (kernels/cuda/graph.h, issue 16 "launch overhead"): where a
  // backend has them on, the stack brackets the layers of a decode step whose host code never
  // waits for the device (decode_step_capturable, engine.h) with begin_graph, which starts
  // capturing the ops and returns true, and end_graph, which launches what was captured;
  // abort_graph ends a capture that an error interrupted (its work never runs). Elsewhere
  // begin_graph returns false and the ops run as they are called.
  virtual bool begin_graph() { return false; }
  virtual void end_graph() {}
  virtual void abort_graph() noexcept {}
};

}  // namespace kvb::engine
