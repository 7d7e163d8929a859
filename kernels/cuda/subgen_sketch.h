// SubGen's sketches on the device (POLICIES.md `subgen`; issue 13 item 4): their storage, the
// absorb kernel (CUDA twin of cpu::subgen_absorb, bit for bit) and the estimator's query for
// every query of a layer at once over the device sketches and the device cache rows (the
// arithmetic of cuda::subgen_query, subgen_query.cuh). The engine reaches them through the
// policy ops table (CudaPolicyOps::subgen_*), so that a decode step of `subgen` on cuda copies
// nothing to the host and does not wait for the device.
//
// Bitwise absorb: per stream the tokens go in in order (one block per head, the heads of a
// layer in parallel), every decision is the CPU's: |v|^2 summed in double in coordinate order
// (float products are exact in double, so contraction cannot change it), distances to the
// representatives in double in coordinate order with each `s += d * d` fused or not as the
// host build fuses it (cpu::subgen_distance_fuses, passed in), ties to the lower index, IEEE
// divisions for p = |v|^2 / mu and 1 / n, and the same counter_uniform coins
// (kernels/cpu/subgen_counter.h). So M, the representatives, samples, counts, mu, absorbed and
// forced equal the CPU's exactly on the same rows (tests/cuda/test_cuda_subgen.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/subgen_estimator.h"
#include "kernels/cuda/kv_cache_device.h"

namespace kvb::kernels::cuda {

// Cache heads per launch of the absorb (a kernel argument table); more are chunked.
constexpr int kMaxSubgenAbsorbHeads = 64;
// KV heads of a layer the batched query serves (its per-head table is a kernel argument).
constexpr int kMaxSubgenQueryKvHeads = 128;

// One layer's sketches: device pointers, every array [heads, ...] at its capacity (s reservoir
// pairs, max_clusters clusters of t samples); a head's live clusters are clusters[head].
struct SubgenLayerSketches {
  float* m_keys = nullptr;      // [heads, s, d]
  float* m_values = nullptr;    // [heads, s, d]
  float* reps = nullptr;        // [heads, max_clusters, d]
  float* samples = nullptr;     // [heads, max_clusters, t, d]
  int64_t* counts = nullptr;    // [heads, max_clusters]
  double* mu = nullptr;         // [heads]
  int64_t* absorbed = nullptr;  // [heads]
  int64_t* forced = nullptr;    // [heads]
  int32_t* clusters = nullptr;  // [heads]
};

// Sketches of layers x heads streams (a policy's state). A layer's arrays are allocated at
// capacity, zeroed, the first time it is asked for (stream-ordered; the CPU's vectors grow
// instead). Copying deep-copies every allocated layer on the device (a fork after a prefill).
class DeviceSubgenSketches {
 public:
  // p: head_dim, s, t, max_clusters (delta2 is per stream, given at absorb).
  DeviceSubgenSketches(const cpu::SubgenParams& p, int layers, int heads, cudaStream_t stream);
  DeviceSubgenSketches(const DeviceSubgenSketches& o);
  DeviceSubgenSketches& operator=(const DeviceSubgenSketches&) = delete;
  // Freed on the legacy default stream, which waits for the (blocking) stream that used them.
  ~DeviceSubgenSketches();

  const cpu::SubgenParams& params() const { return p_; }
  int layers() const { return static_cast<int>(bufs_.size()); }
  int heads() const { return heads_; }
  bool allocated(int layer) const;
  // The layer's arrays, allocated at first use.
  SubgenLayerSketches layer(int layer);
  // Synchronous reads (tests, accounting): one head's sketch in the CPU's layout (vectors cut
  // to its clusters; empty before its first token, as a fresh cpu::SubgenSketch), and its
  // `forced` count; sketch_bytes() is cpu::subgen_sketch_bytes summed over every stream.
  cpu::SubgenSketch download(int layer, int head) const;
  size_t sketch_bytes() const;

 private:
  size_t layer_bytes() const;
  SubgenLayerSketches carve(void* base) const;

  cpu::SubgenParams p_;
  int heads_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> bufs_;  // per layer, null until used
};

// One head's share of an absorb: slots [first, end) of cache head `head` of the layer, in
// order, into sketch `head`. counter_head: the head index of the coins (the policy's global
// head). fresh: the head's first compression, the sketch is cleared first (a new sequence's).
struct SubgenAbsorbHead {
  int32_t head = 0;
  int32_t first = 0;
  int32_t end = 0;
  uint32_t counter_head = 0;
  int32_t fresh = 0;
  double delta2 = 0;
};

// cpu::subgen_absorb for every listed head (heads distinct), reading the keys, values and
// positions (the coins' step) of the device cache rows `kv` (f32 or bf16, widened exactly);
// fused_distance: cpu::subgen_distance_fuses() of the build whose bits are to be matched.
// Stream-ordered, nothing waits. Validates the sizes; throws kvb::Error naming the bad one.
void subgen_absorb(const cpu::SubgenParams& p, const SubgenLayerSketches& sketches,
                   const DeviceLayerKvView& kv, std::span<const SubgenAbsorbHead> heads,
                   uint64_t seed, uint32_t layer, bool fused_distance, cudaStream_t stream = 0);

// The estimator's answer for every query of a layer (what the CPU policy computes per (row,
// query head) with cpu::subgen_query): query i of n, head h (KV head h / (num_heads /
// kv.num_kv_heads)) sees its KV head's sketch when compressed[kv head] (else none) plus the
// head's exact slots [0, lengths[kv head] - n + i] of `kv`, exact slot j's logit plus
// exact_bias[kv head * bias_ld + j] when exact_bias is given (cpu::SubgenQueryArgs::exact_bias;
// with no head compressed: weighted subgen_kcenter's biased softmax, s, t and max_clusters may
// then be 0). One block per (row, head); the scratch (12 bytes per logit) is bounded by
// launching the rows in chunks.
struct SubgenQueryHeadsArgs {
  const float* q = nullptr;  // device [n, num_heads, head_dim], post-RoPE
  float* out = nullptr;      // device [n, num_heads, head_dim]
  int n = 0;
  int num_heads = 0;
  int head_dim = 0;
  float scale = 0;
  int s = 0, t = 0, max_clusters = 0;
  SubgenLayerSketches sketches;  // may be unallocated when no head is compressed
  DeviceLayerKvView kv;
  std::span<const uint8_t> compressed;  // host [kv.num_kv_heads]
  std::span<const int32_t> lengths;     // host [kv.num_kv_heads]: the heads' slots now
  const float* exact_bias = nullptr;    // device [kv.num_kv_heads, bias_ld], nullable
  int bias_ld = 0;                      // >= every length when exact_bias is given
};
void subgen_query_heads(const SubgenQueryHeadsArgs& args, cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
