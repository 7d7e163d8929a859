// Compactor's two halves (kvpress CompactorPress), written once for `noncausal_attn`, `leverage`
// and `compactor`: each scores the tokens [first, first + count) of a prompt prefilled in one
// block, on the ops vocabulary, into rows `count` long per cache head, z-scored over the layer.
#pragma once

#include <vector>

#include "kernels/policies/policy.h"

namespace kvb::policies {

// NonCausalAttnPress's score: chunk_attention_sums over the range (chunks of `chunk`), the GQA
// mean, times the values' norms, avg-pooled over 3, standardised. The rows it returns are
// scratch's.
struct NonCausalScratch {
  ScratchRows sums, reduced, norms, range_norms, pooled;
};
SlotRows& noncausal_scores(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache,
                           int first, int count, int chunk, NonCausalScratch& scratch);

// LeverageScorePress's score: the keys' leverage under kernels/cpu/sketch.h's key_sketches (seed,
// global heads from first_head, rows in HF's channel order as st.rope lays them out) of k
// columns, standardised. sketch: the caller's buffer for the layer's sketches.
SlotRows& leverage_scores(PolicyOps& ops, const LayerStats& st, const kernels::KvIndex& cache,
                          int first, int count, int k, uint64_t seed, int first_head,
                          std::vector<float>& sketch, ScratchRows& rows);

}  // namespace kvb::policies
