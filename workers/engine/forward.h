// The CPU engine: the block stack (block_stack.h) over CpuBackend (cpu_backend.h), f32 with
// OpenMP: prefill of many tokens with blocked matrix products, decode of one, over a
// per-sequence KvCache. The reference every other engine is checked against.
#pragma once

#include "kernels/comm.h"
#include "workers/engine/block_stack.h"
#include "workers/engine/model.h"

namespace kvb::engine {

class Engine final : public StackEngine {
 public:
  // tp: the tensor-parallel group when `model` is this rank's shard (engine/tensor_parallel.h);
  // null (or a group of 1) for a whole model. With a group, forward() all-reduces the outputs of
  // the two row-parallel projections of every layer (attention output, MLP down), every rank of
  // the group must call forward() with the same tokens, and every rank gets the same logits.
  // dtype kBf16: the linear layers' weights as bf16 (CpuBackend); kF32 is the reference.
  explicit Engine(const Model& model, kernels::Communicator* tp = nullptr,
                  DType dtype = DType::kF32);
};

}  // namespace kvb::engine
