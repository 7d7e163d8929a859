// Engine: the block stack on the CPU backend.
#include "workers/engine/forward.h"

#include <memory>

#include "workers/engine/cpu_backend.h"

namespace kvb::engine {

Engine::Engine(const Model& model, kernels::Communicator* tp, DType dtype)
    : StackEngine(model, std::make_unique<CpuBackend>(model, tp, dtype), tp) {}

}  // namespace kvb::engine
