// The engine on one GPU (DESIGN.md "Backends and builds"): Engine (engine.h), the block stack,
// over CudaBackend (cuda_backend.h: the weight upload, the ops, the K/V rows on the device under
// each sequence's host index). Only in builds with CUDA (KVB_WITH_CUDA).
//   engine::Engine gpu(model, engine::cuda_backend(model, DType::kBf16));
//   engine::cuda_of(gpu).set_graphs(true);
// tests/cuda/test_cuda_engine.cc checks it against the CPU engine.
#pragma once

#include <memory>

#include "workers/engine/cuda_backend.h"
#include "workers/engine/engine.h"

namespace kvb::engine {

// The CUDA backend for `model` on GPU `gpu` (cudaSetDevice), its weights uploaded once
// (converted per `dtype`). Throws kvb::Error when the device is missing or memory runs out.
std::unique_ptr<Backend> cuda_backend(const Model& model, DType dtype, int gpu = 0);

// The CUDA backend of an engine made over one: its device knobs and counters (set_graphs,
// set_decode_kernel, graph_counters, weight_bytes, cache_uploads, batch_attention_*,
// download_device_rows, dtype, gpu). A usage of an engine over another backend is an error.
CudaBackend& cuda_of(Engine& engine);
const CudaBackend& cuda_of(const Engine& engine);

// Host<->device bytes an engine moved since construction (statistics, host rows for policies
// that read them, tokens, logits, keep-lists, uploads).
inline size_t mirror_bytes(const Engine& engine) {
  const TransferCounters t = engine.transfer_counters();
  return t.d2h_bytes + t.h2d_bytes;
}

}  // namespace kvb::engine
