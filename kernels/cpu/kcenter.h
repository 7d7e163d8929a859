// Greedy farthest-point k-center (Gonzalez 1985; Dyer & Frieze 1985), the clustering SubGen's
// experiments ran once after prefill (POLICIES.md `subgen_kcenter`; SubGen, seed 003, Sec. 3.2).
#pragma once

#include <cstdint>
#include <vector>

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
// increasing coordinate order, s = fma(d, d, s) per coordinate (bit-reproducible on every path
// and compiler; squaring keeps the order of the distances).
// centres: [k] (at least min(k, n) entries) filled in increasing index order; returns the count.
// assignment: [n], nullable: for each point the index (into keys) of its nearest centre, ties to
// the lower centre index; a centre is assigned to itself.
// cluster_sizes: [k], nullable: the number of points assigned to centres[c] (itself included).
int kcenter_greedy(const KCenterArgs& args, int32_t* centres, int32_t* assignment = nullptr,
                   int32_t* cluster_sizes = nullptr);

// `subgen_kcenter`'s compression of one head (POLICIES.md): the head of `len` slots keeps the
// min(k, prefix) centres of its keys [0, prefix) (kcenter_greedy over `keys` [prefix, dim],
// ld = dim), then every slot of [prefix, len). *keep: that list; log_sizes (nullable): one entry
// per kept slot, std::log(float(cluster size)) for a centre and 0 for the rest (the weighted
// variant's logit bias). Returns the centre count. The CPU policy and the CPU policy ops share it.
int kcenter_keep_list(const float* keys, int prefix, int len, int dim, int k,
                      std::vector<int32_t>* keep, std::vector<float>* log_sizes);

}  // namespace kvb::kernels::cpu
