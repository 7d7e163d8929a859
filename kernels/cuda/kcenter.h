// Greedy farthest-point k-center, CUDA twin of kernels/cpu/kcenter.h (SubGen's clustering,
// POLICIES.md `subgen_kcenter`) with the same tie rules; bit-identical results (distances in
// double, accumulated in coordinate order without contraction, as the CPU does) for finite
// keys. With inf/NaN keys a NaN distance can pick another centre than the CPU's scan (which
// never prefers a point over a NaN-distance one); keys come from the attention's K rows,
// which are finite for finite weights.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/kcenter.h"

namespace kvb::kernels::cuda {

using cpu::KCenterArgs;  // keys is a device pointer here

// centres: device [>= min(k, n)], increasing index order; returns the count min(max(k, 0), n)
// (known on the host). assignment: device [n], nullable; cluster_sizes: device [k], nullable.
// One block runs the whole greedy loop (k steps of a distance update and an argmax, ties to the
// lower index); scratch of 13 bytes per point.
int kcenter_greedy(const KCenterArgs& args, int32_t* centres, int32_t* assignment = nullptr,
                   int32_t* cluster_sizes = nullptr, cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
