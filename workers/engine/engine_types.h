// The types and free functions around the engine (workers/engine/engine.h): logits modes, policy
// hooks, prefill records, devices and dtypes, the run's device labels, and make_engine.
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

class Engine;  // engine.h

enum class LogitsMode {
  kNone,  // no classifier (e.g. prefilling context whose predictions are not needed)
  kLast,  // logits of the last token: [vocab]
  kAll,   // logits of every token: [n, vocab] (likelihood scoring, perplexity)
};

// Which policy hook runs after each layer's attention.
enum class PolicyHook {
  kNone,     // no hook (the policy does not see these tokens)
  kPrefill,  // Policy::on_prefill_layer with the statistics of prefill_stats(n)
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
  std::vector<std::vector<float>> pre_rope_queries;  // [layer][n_new, num_heads, head_dim]
  int n_queries = 0;  // rows recorded (request.last_queries clamped to n_new)
  std::vector<std::vector<float>> last_queries;   // [layer][n_queries, num_heads, head_dim]
  // A prefill in pieces (prefix reuse, workers/prefix_store.h): set before a forward() that
  // continues the same sequence's recorded prefill, whose col_sums (and strides) this record
  // holds. That pass adds its queries' probabilities to those sums, so after the last piece
  // they are, bit for bit, what one pass over every query records; last_probs and n_new are
  // the last piece's (the caller sets n_new to the whole prompt's length). Needs an engine
  // whose continues_prefill(). pre_rope_keys and pre_rope_queries hold the piece's own rows (the
  // caller joins the pieces: workers/prefix_store.cc). forward() clears the flag.
  bool continues = false;
  std::vector<std::vector<float>> seed_col_sums;  // forward()'s working copy of the sums
  std::vector<int> seed_strides;
};

// Where an engine runs and in which precision: `--device cpu|cuda`, `--dtype f32|bf16|native`.
// native (CPU only): a GGUF model's linear layers and classifier multiply in their own quantized
// blocks with 8-bit activations (kernels/cpu/qmatmul.h) and the KV cache holds f16 rows
// (KvRows), llama.cpp's arithmetic family.
enum class Device { kCpu, kCuda };
enum class DType { kF32, kBf16, kNative };
// The CPU cache's row type (kernels::KvCacheShape::f16): by default f16 under --dtype native
// (llama.cpp's default cache type, half the bytes each decode step reads) and f32 otherwise.
// Not a command-line choice: a dtype names its cache type. Tests pick one to compare the two.
enum class KvRows { kDtypeDefault, kF32, kF16 };
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

// An engine for `device` (the block stack over the CPU backend, or over the CUDA backend on
// `gpu` with `dtype`). `model` must
// outlive it. cuda: usage error "this build has no CUDA" without the backend, runtime error "no
// GPU visible" without a device; tensor-parallel groups (`tp`) run on the CPU only.
// On the CPU, f32 is the reference and bf16 rounds the linear layers' weights (CpuBackend; the
// KV cache stays f32).
std::unique_ptr<Engine> make_engine(const Model& model, Device device, DType dtype, int gpu = 0,
                                    kernels::Communicator* tp = nullptr);

}  // namespace kvb::engine
