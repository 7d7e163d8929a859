// CudaEngine: the block stack on the CUDA backend. Compiled only with KVB_WITH_CUDA.
#include "workers/engine/cuda_engine.h"

#include <memory>

namespace kvb::engine {

CudaEngine::CudaEngine(const Model& model, DType dtype, int gpu)
    : StackEngine(model, std::make_unique<CudaBackend>(model, dtype, gpu), nullptr) {}

}  // namespace kvb::engine
