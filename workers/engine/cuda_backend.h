// The CUDA instance of the block stack's Backend (backend.h) on one GPU, built from the
// kernels/cuda twins. Only in builds with CUDA (KVB_WITH_CUDA).
//
// Precision (`--dtype`): f32 keeps f32 weights and f32 GEMMs (cuBLAS pedantic, no TF32), an f32
// KV cache; bf16 stores the weights in bf16, rounds each GEMM's activations to bf16 and
// accumulates in f32 (cublasGemmEx), and keeps a bf16 KV cache. Norms, RoPE, softmax, residuals
// and logits are f32 in both. The embedding table stays f32 (rows are gathered, not multiplied).
//
// KV cache: the host KvCache the stack passes is the sequence's index (lengths, positions, next
// position) and owns its K/V rows on the device, a kernels::cuda::DeviceKvCache (one flat buffer
// per layer with per-head offsets, capacities and lengths; the attention reads it directly).
// Copying the KvCache copies the rows device to device. begin_pass creates the rows at a
// sequence's first pass (uploading host rows only for a cache made elsewhere, which then drops
// them: the index and its device rows, as any cache here) and grows them on the device (1.5x)
// when a head would overflow. No cache here keeps K/V rows on the host: code that reads rows on
// the host copies a layer through the ops when it needs one (kernels::ops::host_layer:
// BlockPress and ChunkPress, `then:`, the Python policy's ctx.keys).
//
// Policies that decide with the ops table (Policy::decides_with_ops: h2o, tova, scissorhands,
// knorm, snapkv, pyramidkv, ada_snapkv, ada_pyramidkv) decide on the device: their state lives in
// CudaPolicyOps rows, they read the statistics where attention wrote them (the SnapKV family's
// last-w probabilities stay on the device; Ada-KV brings one layer's per-head budgets to the host
// per prefill layer: one D2H copy of num_kv_heads ints and one sync), and their keep lists stay
// on the device (apply_plan hands them to DeviceKvCache::keep_slots; the index takes the counts
// and reads positions back only when host code asks, KvCache::positions_stale). One decode step of
// theirs copies nothing to the host but the logits and syncs once. policy_ms is device time: CUDA
// events around each hook and its plan (take_policy_ms).
//
// Other policies decide on the host, from the index and the statistics they asked for:
//  - append_kv appends the block's positions to the index (the rows stay on the device);
//  - stats_to_host copies the statistics a hook asked for (col_sums [num_heads, stride],
//    last_probs [num_heads, last_w, stride]) to the host; pre-RoPE keys come through download();
//  - apply_plan applies the hook's eviction plan to the index (which validates it) and the same
//    decision to the device rows, unchecked on the device and without waiting: a plan whose
//    changed heads each drop one slot (window, streaming_llm and random at the budget) as
//    victims in a kernel argument (DeviceKvCache::evict_slots, nothing uploaded), any other as
//    keep-lists (one upload, DeviceKvCache::keep_slots). The device lengths follow in the same
//    kernels (appends too): nothing else goes up per layer.
// Host traffic per decode step: the logits and one sync at the end; per layer, the statistics a
// decode hook reads (col_sums of num_heads * stride floats, e.g. H2O, 4 * 32 * 2048 = 256 KiB at
// budget 2048 on Llama-3-8B; one sync), pre-RoPE keys when asked (one sync), a layer's rows
// where a host decision reads them (through the ops), and H2D the keep-lists of a layer changed by a host
// plan that is not one victim per head (4 bytes per kept slot). counters() counts every copy and
// sync, so these costs show in tests and benchmarks.
//
// Policies that replace attention:
//  - SubGen attends with ops (Policy::attends_with_ops): its sketches live in CudaPolicyOps'
//    device storage (kernels/cuda/subgen_sketch.h), attend_replaced hands it the device queries
//    and output, the ops and this backend's attention (while no head of the layer is
//    compressed); the absorbs run on the device rows, bit for bit the CPU's decisions, and its
//    keep-lists go up as H2D lists. Its cache keeps no host rows. A decode step copies the
//    logits to the host and syncs once, as `full`; `delta: auto` reads a head's keys once, at
//    its first compression (counted in the ops' transfers).
//  - Weighted subgen_kcenter attends with ops too: its bias rows (log cluster size per slot)
//    are CudaPolicyOps rows, its k-center runs on the device rows (kcenter_keep: device keep
//    lists), and its biased softmax is the ops' subgen_query with no sketch (this backend's
//    attention while no head of the layer has a centre). The plain variant decides with ops in
//    its hooks (Policy::decides_with_ops) the same way. Neither keeps host rows; a `slide` step
//    drops one slot per head as a victim, so a decode step copies the logits and syncs once.
//    (The ops upload their log-size table when a longer prefix than before compresses.)
//  - A policy that replaces attention without ops is refused here (attend_replaced): on a
//    device the replacement attends through the ops, where the rows are.
//
// CUDA graphs (set_graphs, off by default): a decode step whose host code never waits for the
// device (engine.h decode_step_capturable) is captured from stream_ between begin_graph and
// end_graph and launched as one graph (kernels/cuda/graph.h): the same kernels with the same
// arguments, so the same bits as launching them one by one. Inside a capture copy_h2d stages
// its bytes in pinned memory, copy_d2h and sync throw (they would wait for work that has not
// run), and the policy spans' events are graph nodes. end_pass's sync completes the graph; the
// logits' copy runs after it, outside the graph.
//
// Not supported on the GPU (a clear usage error): tensor-parallel groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_policy_ops.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/kv_cache_device.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/runtime.h"
#include "workers/engine/backend.h"
#include "workers/engine/engine_types.h"
#include "workers/engine/model.h"

namespace kvb::engine {

class CudaBackend final : public Backend {
 public:
  // Selects GPU `gpu` (cudaSetDevice) and uploads the weights once (converted per `dtype`).
  // Throws kvb::Error when the device is missing or memory runs out.
  CudaBackend(const Model& model, DType dtype, int gpu);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string device_description() const override { return device_name_; }
  // Max over forward passes of the device's used memory (cudaMemGetInfo total - free, sampled
  // at the end of each pass: the whole device, CUDA context and cuBLAS workspace included).
  size_t device_peak_bytes() const override { return peak_bytes_; }
  // Bytes of the device rows: slots x (2 x head_dim x 2 or 4 bytes + a 4-byte position). The
  // physical bytes are the cache's device rows' allocation, or before its first pass the
  // index's capacity at the device's slot size (what binding it would allocate at least).
  KvBytes kv_bytes(const kernels::KvCache& cache) const override;
  // The device rows rotated there (DeviceKvCache::rerotate_keys: one counted upload, two
  // launches, no wait); host rows not on the device yet are rotated on the host.
  void rerotate_keys(int layer, const kernels::cpu::RopeParams& rope,
                     kernels::KvCache& cache) override;
  void moved_position(kernels::KvCache& cache, int delta) override;
  // The device rows copied into an allocation of max_length() + extra slots per head
  // (DeviceKvCache::fork: synchronous, counted as one sync), when that is smaller.
  void trim_storage(kernels::KvCache& cache, int extra) override;
  // The backend's own copies and syncs plus those of its policy ops (Ada-KV's per-head budgets).
  TransferCounters counters() const override;
  policies::PolicyOps& policy_ops() override;
  void stats_to_device(policies::LayerStats* stats) override;
  // The device weights as the products read them (bf16 or f32).
  const void* output_projection(int layer, bool* bf16) override;
  void begin_policy_span() override;
  void end_policy_span() override;
  double take_policy_ms(std::vector<double>* per_span = nullptr) override;

  DType dtype() const { return dtype_; }
  int gpu() const { return gpu_; }
  // cuda::AttentionArgs::decode_kernel for every decode step (A/B of the decode kernels).
  void set_decode_kernel(int kernel);
  int decode_kernel() const { return decode_kernel_; }
  // Decode steps the stack finds capturable run as one CUDA graph each (kernels/cuda/graph.h;
  // off by default), but the backend's first (it loads the decode kernels outside a capture).
  // Not while a step is being captured.
  void set_graphs(bool on);
  bool graphs() const { return graphs_; }
  const kernels::cuda::GraphCounters& graph_counters() const { return graph_->counters(); }
  bool begin_graph() override;
  void end_graph() override;
  void abort_graph() noexcept override;
  size_t weight_bytes() const { return weight_bytes_; }
  int64_t cache_uploads() const { return cache_uploads_; }
  // The cache's device rows as a host KvCache with rows (synchronous; tests). Empty shape when
  // the cache has none yet.
  kernels::KvCache download_device_rows(const kernels::KvCache& cache) const;

  // Decode batching (Backend::batches_rows): the pass's rows share the weight GEMMs; per row,
  // RoPE, the append, attention and the policy run on that sequence's own device rows
  // (bind_sequence binds each; the ops find them through the cache they are given).
  void select_rows(int row0) override;
  void bind_sequence(kernels::KvCache& cache) override;
  void begin_pass(std::span<const int32_t> tokens, const int32_t* positions,
                  kernels::KvCache& cache, int cache_rows) override;
  void rmsnorm(Act out, Act in, int layer, Norm which, int row0, int rows) override;
  void head_rmsnorm(Act a, int layer, QkNorm which, int heads, int n) override;
  void linear(Act out, Act in, int layer, Mat which, int n) override;
  void linear_qkv(int layer, int n) override;
  void linear_gate_up(int layer, int n) override;
  void reduce_add(Act x, Act y, int n) override;
  void reduce_norm_add(Act x, Act y, int layer, Norm which, int n) override;
  void glu(int n) override;
  void rope(Act a, int layer, int heads, int n) override;
  void rope_rows(Act a, int layer, const int32_t* positions, int rows) override;
  void download(Act a, size_t count, float* dst, size_t offset = 0) override;
  const float* stash(Act a, size_t count) override;
  void append_kv(int layer, int n, kernels::KvCache& cache) override;
  void roll_keys(int layer, kernels::KvCache& cache) override;
  void attention(int layer, int n, float scale, kernels::KvCache& cache, bool col_sums,
                 int last_w, int stride, policies::LayerStats* stats) override;
  // A decode batch's attention in a few launches (cuda::attention_batch): each sequence's
  // statistics in its own rows of the shared scratch.
  void attention_batch(int layer, float scale, std::span<const BatchAttention> items) override;
  // attention_batch calls, the sequences they took, and the kernel launches they made, since
  // construction (tests: the batched path ran; benches: launches per step).
  int64_t batch_attention_calls() const { return batch_calls_; }
  int64_t batch_attention_seqs() const { return batch_seqs_; }
  int64_t batch_attention_launches() const { return batch_launches_; }
  double stats_to_host(policies::LayerStats* stats) override;
  void attend_replaced(policies::Policy& policy, policies::AttendArgs args,
                       const kernels::KvCache& cache, kernels::EvictionPlan* plan) override;
  void apply_plan(const kernels::EvictionPlan& plan, kernels::KvCache& cache) override;
  void end_layers(int n) override;
  void classify(int rows, std::vector<float>* logits) override;
  void end_pass(kernels::KvCache& cache) override;

 private:
  // Records the policy spans of a captured step whose graph did not run (empty spans).
  void record_dropped_spans() noexcept;
  struct DeviceLayer;  // one layer's weights on the device
  struct Scratch;      // activations, sized for the largest n seen
  void upload_weights();
  void bind_cache(kernels::KvCache& cache, int n);
  float* act(Act a) const;
  // act(a) from the selected row (select_rows) on.
  float* rows_at(Act a) const;
  float* rows_at(Act a, int row) const;  // from row `row` on (attention_batch: any sequence's)
  const float* norm_weight(int layer, Norm which) const;
  // x (f32 [n, k]) times w ([m, k], dtype_) into y [n, m].
  void gemm(float* y, const float* x, const void* w, const float* bias, int n, int k, int m);
  // Counted stream-ordered copies and syncs (TransferCounters).
  void copy_d2h(void* dst, const void* src, size_t bytes);
  void copy_h2d(void* dst, const void* src, size_t bytes);
  // Adds what `rows` uploaded since (copies0, bytes0) to the transfer counters.
  void count_uploads(const kernels::cuda::DeviceKvCache& rows, int64_t copies0, size_t bytes0);
  void sync();
  // An op wrote `count` floats at dst; with_x16: and their bf16 copy into x16 (gemm then skips
  // converting dst); else a copy of dst's old contents in x16 is stale.
  void wrote(const float* dst, bool with_x16, size_t count);

  const Model& model_;
  DType dtype_;
  int gpu_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceLayer> layers_;
  kernels::cuda::DeviceBuffer<float> embedding_, final_norm_, output_f32_;
  kernels::cuda::DeviceBuffer<__nv_bfloat16> output_bf16_;
  std::unique_ptr<Scratch> s_;
  kernels::cuda::DeviceKvCache* dev_ = nullptr;  // the rows of the current sequence's cache
  std::vector<kernels::cuda::DeviceKvCache*> bound_;  // every sequence's rows in this pass
  int row0_ = 0;                                      // select_rows
  int rolled_layer_ = -1;  // the layer whose next attention reads the rolled keys
  // x16 holds bf16(x16_src_[0, x16_count_)) while x16_src_ is set (by rmsnorm into xb and by
  // glu: the inputs of the next products); gu_pending_: rows of a gate|up product glu has not
  // read yet (it stays in the fused scratch: act(kGate) and act(kUp) do not hold it).
  const float* x16_src_ = nullptr;
  size_t x16_count_ = 0;
  int gu_pending_ = 0;
  // Host staging.
  std::vector<float> col_sums_, last_probs_;
  int decode_kernel_ = 0;  // cu::kDecodeDefault
  std::vector<int32_t> pos_h_, tokens_h_, slots_h_, counts_h_, victims_h_, keep_scratch_;
  int64_t cache_uploads_ = 0;
  std::unique_ptr<kernels::cuda::CudaPolicyOps> ops_;
  bool graphs_ = false;
  bool warmed_ = false;                              // a capturable step has run (begin_graph)
  int spans_at_graph_ = 0;                           // spans_ when the current capture began
  std::unique_ptr<kernels::cuda::StepGraph> graph_;  // on stream_
  // policy_ms spans: event pairs recorded on the stream, read by take_policy_ms.
  std::vector<cudaEvent_t> span_begin_, span_end_;
  int spans_ = 0;
  size_t peak_bytes_ = 0, weight_bytes_ = 0;
  TransferCounters counters_;
  std::vector<kernels::cuda::RopeTable> rope_tables_;  // per layer (ModelConfig::rope_of)
  int64_t batch_calls_ = 0, batch_seqs_ = 0, batch_launches_ = 0;
  std::vector<kernels::cuda::AttentionArgs> batch_args_;  // attention_batch's, reused
};

}  // namespace kvb::engine
