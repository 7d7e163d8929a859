// The device-agnostic face of an engine (DESIGN.md "Backends and builds"): what generation, the
// runner and the sweep workers call. Engine (forward.h) is the CPU f32 reference; CudaEngine
// (cuda_engine.h, only in builds with CUDA) runs the same block stack (block_stack.h) on a GPU.
// Both take the host `kernels::KvCache` of a sequence: on the CPU it is the cache; on the GPU it
// is the sequence's index, which owns its K/V rows on the device (cuda_backend.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/comm.h"
#include "kernels/kv_cache.h"
#include "kernels/policies/policy.h"
#include "workers/engine/model.h"

namespace kvb::engine {

enum class LogitsMode {
  kNone,  // no classifier (e.g. prefilling context whose predictions are not needed)
  kLast,  // logits of the last token: [vocab]
  kAll,   // logits of every token: [n, vocab] (likelihood scoring, perplexity)
};

// Which policy hook runs after each layer's attention.
enum class PolicyHook {
  kNone,     // no hook (the policy does not see these tokens)
  kPrefill,  // Policy::on_prefill_layer with the statistics of prefill_request(n)
  kDecode,   // Policy::on_decode_layer (one token) with the statistics of decode_request()
};

// Statistics of one prompt prefill, recorded once so that several oneshot policies can compress
// copies of the same full cache without repeating the prefill (DESIGN.md "Scheduling": prefill
// sharing). The request is the union of the policies' prefill requests.
struct PrefillRecord {
  policies::StatsRequest request;  // what to record (set before the forward pass)
  int n_new = 0;
  int last_w = 0;                                 // rows recorded (request.last_w clamped to n_new)
  std::vector<int> strides;                       // [layer]
  std::vector<std::vector<float>> col_sums;       // [layer][num_heads, stride]
  std::vector<std::vector<float>> last_probs;     // [layer][num_heads, last_w, stride]
  std::vector<std::vector<float>> pre_rope_keys;  // [layer][n_new, num_kv_heads, head_dim]
  int n_queries = 0;  // rows recorded (request.last_queries clamped to n_new)
  std::vector<std::vector<float>> last_queries;   // [layer][n_queries, num_heads, head_dim]
  // A prefill in pieces (prefix reuse, workers/prefix_store.h): set before a forward() that
  // continues the same sequence's recorded prefill, whose col_sums (and strides) this record
  // holds. That pass adds its queries' probabilities to those sums, so after the last piece
  // they are, bit for bit, what one pass over every query records; last_probs and n_new are
  // the last piece's (the caller sets n_new to the whole prompt's length). Needs an engine
  // whose continues_prefill(); pre_rope_keys cannot be continued. forward() clears the flag.
  bool continues = false;
  std::vector<std::vector<float>> seed_col_sums;  // forward()'s working copy of the sums
  std::vector<int> seed_strides;
};

// Where an engine runs and in which precision: `--device cpu|cuda`, `--dtype f32|bf16`.
enum class Device { kCpu, kCuda };
enum class DType { kF32, kBf16 };
Device parse_device(const std::string& s);  // usage error naming the bad value
DType parse_dtype(const std::string& s);
// `--dtype` as given ("" for the device's default: f32 on the CPU, bf16 on the GPU). bf16 on the
// CPU means bf16 weights, f32 arithmetic and an f32 KV cache (CpuBackend).
DType resolve_dtype(Device d, const std::string& s);
const char* device_name(Device d);
const char* dtype_name(DType t);
// Bytes of one cache slot of a KV head stored in `dtype`: key and value rows of head_dim
// elements plus a 4-byte position (kernels::KvCache::bytes_per_slot for f32).
size_t kv_slot_bytes(int head_dim, DType dtype);

// What one forward pass of `n` tokens gathers, for both engines: drops the hook without a
// policy, checks it against the pass (a decode hook takes one token; a recorded prefill runs
// without a policy), counts a prompt prefill in *prefills, and sizes `record` (whose request
// then wins).
policies::StatsRequest forward_stats_request(int n, const kernels::KvCache& cache, int num_layers,
                                             policies::Policy* policy, PolicyHook* hook,
                                             PrefillRecord* record, int64_t* prefills);

class EngineBase {
 public:
  virtual ~EngineBase() = default;
  virtual const Model& model() const = 0;
  const ModelConfig& config() const { return model().config; }
  // The tensor-parallel group (null on one device).
  virtual kernels::Communicator* tp() const { return nullptr; }
  // Milliseconds spent inside policy hooks (scoring, selection, compaction) since construction:
  // the eviction overhead, measured apart from attention (on the GPU: including the copies of
  // the statistics the hooks read and the device compaction their plans cause).
  virtual double policy_ms() const = 0;
  // Prompt prefills executed (forward passes over more than one token, or a first token).
  virtual int64_t prefills() const = 0;
  // "cpu", or the GPU's name ("NVIDIA H100 80GB HBM3") for the run's provenance.
  virtual std::string device_description() const = 0;
  // Device memory high-water mark in bytes (0 on the CPU: measurements.device_peak_bytes NULL).
  virtual size_t device_peak_bytes() const { return 0; }
  // K/V memory of `cache` as this engine stores it (measurements.kv_bytes_*): logical = retained
  // slots x bytes per slot, physical = what is allocated. On the CPU the cache itself (f32); the
  // GPU engine counts the cache's device rows (bf16 halves the K/V bytes; their capacity may
  // differ from the index's).
  virtual size_t kv_logical_bytes(const kernels::KvCache& cache) const {
    return cache.logical_bytes();
  }
  virtual size_t kv_physical_bytes(const kernels::KvCache& cache) const {
    return cache.physical_bytes();
  }
  // Frees the storage `cache` holds beyond its longest head + `extra` slots per head, keeping
  // every row, position and length (the runner, after a unit's prompt: its decode needs no
  // more). Results do not change; kv_physical_bytes may fall. A no-op on the CPU, whose spare
  // capacity is address space that no slot has touched (KvCache's storage is calloc'd); the GPU
  // engine copies the device rows into an allocation of that size (a prompt-sized device cache
  // per unit would otherwise stay allocated while a bundle's units decode together).
  virtual void trim_storage(kernels::KvCache& cache, int extra) {
    (void)cache;
    (void)extra;
  }

  // A fresh cache for this model, with room for `initial_capacity` tokens per head.
  // With a policy that expands GQA, the cache has one "KV head" per query head.
  virtual kernels::KvCache new_cache(int initial_capacity = 0,
                                     const policies::Policy* policy = nullptr) const = 0;

  // Runs `tokens` at positions cache.next_position() onwards, appending their K/V to the cache
  // and advancing its position. Writes logits per `mode` into *logits (resized).
  // Precondition: token ids in [0, vocab_size) (checked).
  // With a policy, `hook` selects which of its hooks runs after each layer's attention.
  virtual void forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
                       std::vector<float>* logits, policies::Policy* policy = nullptr,
                       PolicyHook hook = PolicyHook::kNone, PrefillRecord* record = nullptr) = 0;

  // A check forward() calls while it is set: check(layer, layers) at the start of every pass
  // (layer 0, before anything is appended or counted) and, in a pass of more than one token,
  // before each later layer. It may throw to abandon a long pass (the runner's unit time limit
  // during a prompt's prefill, workers/unit_run.cc), which then leaves `cache` and a
  // PrefillRecord partly written: discard them. It reads, it never changes what a pass
  // computes. Not called by decode_batch or apply_recorded_prefill. On a GPU it runs on the
  // host, which may have queued earlier layers' work without waiting for it. Empty: none (the
  // default).
  using LayerCheck = std::function<void(int layer, int layers)>;
  void set_layer_check(LayerCheck check) { layer_check_ = std::move(check); }
  const LayerCheck& layer_check() const { return layer_check_; }

  // Whether forward() takes a PrefillRecord with `continues` set (StackEngine over the CPU
  // backend; not under tensor parallelism).
  virtual bool continues_prefill() const { return false; }

  // Sets `cache` to `full` (the cache right after the recorded prefill, no policy) with room for
  // `extra` more slots per head, as a copy of full and reserve_extra(extra) would, compressed by
  // `policy`'s oneshot rule layer by layer, exactly as a prefill with the policy would.
  virtual void apply_recorded_prefill(policies::Policy& policy, const kernels::KvCache& full,
                                      int extra, const PrefillRecord& record,
                                      kernels::KvCache& cache) = 0;
  // One decode step of B independent sequences (issue 16 "batched decode"): tokens[b] runs at
  // caches[b]->next_position() under policies[b] (null: none) with the decode hook; *logits gets
  // [B, vocab], row b the last-token logits of sequence b. Each sequence's logits, cache and
  // policy state are bit-identical to forward() of its token alone (the weight products take
  // the B rows at once; attention and hooks stay per sequence). With seq_policy_ms ([B]), each
  // sequence's time inside its policy hooks (policy_ms()'s share) is added to its entry. This
  // default runs the sequences one after another; StackEngine batches where its backend can
  // (CpuBackend).
  virtual void decode_batch(std::span<const int32_t> tokens,
                            std::span<kernels::KvCache* const> caches,
                            std::span<policies::Policy* const> policies,
                            std::vector<float>* logits, double* seq_policy_ms = nullptr);

 protected:
  // Calls the layer check, if any, before `layer` of a pass.
  void check_layer(int layer) const {
    if (layer_check_) layer_check_(layer, config().num_layers);
  }

 private:
  LayerCheck layer_check_;
};

// Whether a policy's prompt compression can be applied from a PrefillRecord: oneshot prefill on a
// cache of the model's own layout with the engine's own attention.
bool can_share_prefill(const policies::Policy& policy);

// The run's provenance for --device cuda: "cuda: <name of GPU 0> x<visible GPUs>". Usage error
// "this build has no CUDA" without the backend; with require_device, error "no GPU visible"
// when there is none (else the label says so).
std::string cuda_device_label(bool require_device);
// What a sweep records as its workers' device (runs.devices): "cpu" (the f32 reference),
// "cpu (bf16 weights)", or the cuda label with the precision the GPU computes in, e.g.
// "cuda: NVIDIA H200 x1 (bf16)" (cuda defaults to bf16, so a DB says which it was).
std::string run_device_label(Device device, DType dtype, const std::string& cuda_label);
// The precision a recorded device label computed in: "f32" or "bf16"; "" when the label does not
// say (a cuda label written before the precision was recorded, or a foreign one).
std::string label_precision(const std::string& device_label);
// The GPU a worker binds to: its node-local worker index modulo the visible GPUs (a warning when
// workers share a GPU). Error "no GPU visible" without one; 0 in builds without CUDA.
int node_local_gpu(int worker_index);

// An engine for `device` (the CPU Engine, or CudaEngine on `gpu` with `dtype`). `model` must
// outlive it. cuda: usage error "this build has no CUDA" without the backend, runtime error "no
// GPU visible" without a device; tensor-parallel groups (`tp`) run on the CPU only.
// On the CPU, f32 is the reference and bf16 rounds the linear layers' weights (CpuBackend; the
// KV cache stays f32).
std::unique_ptr<EngineBase> make_engine(const Model& model, Device device, DType dtype, int gpu = 0,
                                        kernels::Communicator* tp = nullptr);

}  // namespace kvb::engine
