// The transformer forward pass on one GPU (DESIGN.md "Backends and builds"): the block stack
// (block_stack.h) over CudaBackend (cuda_backend.h: the weight upload, the ops, the K/V rows on
// the device under each sequence's host index). Only in builds with CUDA (KVB_WITH_CUDA).
// tests/cuda/test_cuda_engine.cc checks it against the CPU engine.
#pragma once

#include "workers/engine/block_stack.h"
#include "workers/engine/cuda_backend.h"

namespace kvb::engine {

class CudaEngine final : public StackEngine {
 public:
  // Selects GPU `gpu` (cudaSetDevice) and uploads the weights once (converted per `dtype`).
  // Throws kvb::Error when the device is missing or memory runs out.
  CudaEngine(const Model& model, DType dtype, int gpu = 0);

  DType dtype() const { return cuda().dtype(); }
  // Which decode attention kernel decode steps run (kernels/cuda/attention.h kDecode*: default,
  // grouped, streamed, tensor cores); for A/B measurements and their tests.
  void set_decode_kernel(int kernel) { cuda_mut().set_decode_kernel(kernel); }
  // Decode steps as CUDA graphs (kernels/cuda/graph.h; off by default): each decode step whose
  // host code never waits for the device (decode_step_capturable) is captured and launched as
  // one graph; the same kernels and arguments, so the same bits. graph_counters() counts the
  // captured steps, in-place updates, instantiations and nodes.
  void set_graphs(bool on) { cuda_mut().set_graphs(on); }
  bool graphs() const { return cuda().graphs(); }
  const kernels::cuda::GraphCounters& graph_counters() const { return cuda().graph_counters(); }
  int gpu() const { return cuda().gpu(); }
  // Bytes of the uploaded weights (both copies where bf16 keeps an f32 embedding).
  size_t weight_bytes() const { return cuda().weight_bytes(); }
  // Host<->device bytes moved since construction (statistics, host rows for policies that read
  // them, tokens, logits, keep-lists, uploads).
  size_t mirror_bytes() const {
    const TransferCounters t = transfer_counters();
    return t.d2h_bytes + t.h2d_bytes;
  }
  // Full uploads of a host cache to the device (a switch of sequence or a capacity growth).
  int64_t cache_uploads() const { return cuda().cache_uploads(); }
  // Decode-batch layers whose attention ran for all sequences at once (Backend::
  // attention_batch), the sequences they covered and the kernel launches they made.
  int64_t batch_attention_calls() const { return cuda().batch_attention_calls(); }
  int64_t batch_attention_seqs() const { return cuda().batch_attention_seqs(); }
  int64_t batch_attention_launches() const { return cuda().batch_attention_launches(); }
  // A cache's device rows as a host KvCache with rows (synchronous; tests compare them with
  // the index and with the CPU's cache). Empty shape before the cache's first forward().
  kernels::KvCache download_device_rows(const kernels::KvCache& cache) const {
    return cuda().download_device_rows(cache);
  }

 private:
  const CudaBackend& cuda() const { return static_cast<const CudaBackend&>(backend()); }
  CudaBackend& cuda_mut() { return static_cast<CudaBackend&>(backend()); }
};

}  // namespace kvb::engine
