// Greedy farthest-point k-center (Gonzalez 1985; Dyer & Frieze 1985), the clustering SubGen's
// experiments ran once after prefill (POLICIES.md `subgen_kcenter`; SubGen, seed 003, Sec. 3.2).
#pragma once

#include <cstdint>

namespace kvb::kernels::cpu {

struct KCenterArgs {
  const float* keys = nullptr;  // [n, ld], the first dim entries of a row are the point
  int n = 0;
  int dim = 0;
  int ld = 0;  // row stride in floats, >= dim (head_dim for one KV head's cache slots)
  int k = 0;   // centres wanted; min(max(k, 0), n) are chosen
};

// Chooses the centres: the first is index 0; each next one is the non-centre point whose
// squared L2 distance to its nearest chosen centre is largest, ties to the lower index. Points
// identical to a centre (distance 0) are still taken once the others are exhausted, so exactly
// min(k, n) distinct indices come back. Distances are squared L2 accumulated in double in
// increasing coordinate order (bit-reproducible; squaring keeps the order of the distances).
// centres: [k] (at least min(k, n) entries) filled in increasing index order; returns the count.
// assignment: [n], nullable: for each point the index (into keys) of its nearest centre, ties to
// the lower centre index; a centre is assigned to itself.
// cluster_sizes: [k], nullable: the number of points assigned to centres[c] (itself included).
int kcenter_greedy(const KCenterArgs& args, int32_t* centres, int32_t* assignment = nullptr,
                   int32_t* cluster_sizes = nullptr);

}  // namespace kvb::kernels::cpu
