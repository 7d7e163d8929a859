// Greedy farthest-point k-center, CUDA twin of kernels/cpu/kcenter.h (SubGen's clustering,
// POLICIES.md `subgen_kcenter`) with the same tie rules; bit-identical results (distances in
// double, accumulated in coordinate order without contraction, as the CPU does) for finite
// keys. With inf/NaN keys a NaN distance can pick another centre than the CPU's scan (which
// never prefers a point over a NaN-distance one); keys come from the attention's K rows,
// which are finite for finite weights.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>

#include "kernels/cpu/kcenter.h"

namespace kvb::kernels::cuda {

using cpu::KCenterArgs;  // keys is a device pointer here

// The number of centres a problem chooses, known on the host: min(max(k, 0), n).
inline int kcenter_count(const KCenterArgs& args) { return std::min(std::max(args.k, 0), args.n); }

// One independent problem of a batch (e.g. one KV head of a layer). Device pointers; no two
// problems' outputs may overlap (their keys may).
struct KCenterProblem {
  KCenterArgs args;                  // keys: device [n, ld]
  int32_t* centres = nullptr;        // device [>= kcenter_count(args)], increasing index order
  int32_t* assignment = nullptr;     // device [n], nullable: each point's centre (a key index)
  int32_t* cluster_sizes = nullptr;  // device [>= kcenter_count(args)], nullable: by centre rank
};

// Problems per launch. The table travels as a kernel argument (48 bytes a problem, with the
// scratch offsets 56: 64 of them stay under the 4 KiB kernel-argument limit that holds on every
// driver), so no upload and nothing staged; a longer batch runs as several launches of at most
// this many problems, in stream order. A layer's KV heads (8 on Llama-3-8B) fit one launch.
constexpr int kMaxKCenterBatch = 64;

// Runs every problem on `stream`, one block per problem (grid = the problems that choose at
// least one centre), each block running the greedy loop of kcenter_greedy below; each problem's
// outputs are those of cpu::kcenter_greedy on its args, bit for bit, whatever the batch around
// it. Problems that choose no centre (k <= 0 or n == 0) are skipped and their outputs untouched
// (as the CPU's). One stream-ordered scratch for the whole batch, 13 bytes per point of the
// problems that run. Every problem is validated on the host before any CUDA call (kvb::Error
// naming the problem's index and values). Returns the number of kernel launches made:
// ceil(problems that run / kMaxKCenterBatch), 0 when none runs (then nothing touches the device).
int kcenter_greedy_batch(std::span<const KCenterProblem> problems, cudaStream_t stream = 0);

// One problem: kcenter_greedy_batch with a batch of one (the same kernel). centres: device
// [>= min(k, n)], increasing index order; returns the count kcenter_count(args). assignment:
// device [n], nullable; cluster_sizes: device [k], nullable. One block runs the whole greedy
// loop (k steps of a distance update and an argmax, ties to the lower index).
int kcenter_greedy(const KCenterArgs& args, int32_t* centres, int32_t* assignment = nullptr,
                   int32_t* cluster_sizes = nullptr, cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
