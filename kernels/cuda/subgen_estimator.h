// SubGen's query-time estimator (seed 003, Algorithm 1 lines 29-30; POLICIES.md `subgen`),
// CUDA twin of kernels/cpu/subgen_estimator.h subgen_query, for one query against a sketch
// described by the host (its arrays on the device). The engine's sketches live and are absorbed
// on the device (kernels/cuda/subgen_sketch.h), whose batched query shares this one's body.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cpu/subgen_estimator.h"

namespace kvb::kernels::cuda {

using cpu::SubgenQueryArgs;   // q, exact_*, out and the sketch view's arrays: device pointers
using cpu::SubgenSketchView;  // (mu, s, clusters, t are values)

// The CPU formula, computed in the CPU's order: logits in f32 with vec.h's dot order (8 FMA
// lanes, fixed tree), weights/exponentials/sums in double, z per output dimension over the slots
// in order, tau summed serially. Not promised bitwise: exp, and the contractions the host
// compiler chose for the CPU's double expressions, may differ in a double's last bit.
// One block; scratch of 12 bytes per logit. Validates sizes; throws kvb::Error.
void subgen_query(const SubgenQueryArgs& args, cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
