// The engine over the CUDA backend (cuda_engine.h). Compiled only with KVB_WITH_CUDA.
#include "workers/engine/cuda_engine.h"

#include <memory>

#include "common/error.h"

namespace kvb::engine {

std::unique_ptr<Backend> cuda_backend(const Model& model, DType dtype, int gpu) {
  return std::make_unique<CudaBackend>(model, dtype, gpu);
}

CudaBackend& cuda_of(Engine& engine) {
  auto* cuda = dynamic_cast<CudaBackend*>(&engine.backend());
  KVB_CHECK(cuda != nullptr) << "cuda_of: the engine runs on " << engine.device_description()
                             << ", not on the CUDA backend";
  return *cuda;
}

const CudaBackend& cuda_of(const Engine& engine) {
  return cuda_of(const_cast<Engine&>(engine));
}

}  // namespace kvb::engine
