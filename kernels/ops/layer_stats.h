// What the engine hands a policy hook for one layer (LayerStats) and what a policy asks it to
// record (StatsRequest): the statistics the policy ops read (policy_ops.h). Declared below the
// policies (kernels/policies/policy.h names them kvb::policies::LayerStats, ...) so that the
// ops' CPU and CUDA instances need nothing above them.
#pragma once

#include <cstdint>

#include "kernels/cpu/rope.h"

namespace kvb::kernels::ops {

class PolicyOps;  // policy_ops.h

// Statistics the engine hands to a hook. Probabilities are per QUERY head (num_heads rows),
// indexed by the slot of that head's KV head; policies reduce over a GQA group themselves
// (kernels/cpu/gqa.h reduce_gqa). Rows have `stride` entries.
struct LayerStats {
  int layer = 0;
  int n_new = 0;                    // tokens this forward pass appended (1 in decode)
  int num_heads = 0;
  int stride = 0;
  const float* col_sums = nullptr;  // [num_heads, stride] sum over the n_new queries
  const float* last_probs = nullptr;  // [num_heads, last_w, stride]
  int last_w = 0;
  const float* pre_rope_keys = nullptr;  // [n_new, num_kv_heads, head_dim], if requested
  // The block's last n_queries queries after RoPE, [n_queries, num_heads, head_dim], on the host,
  // if requested (StatsRequest::last_queries; the Python policy's ctx.queries).
  const float* last_queries = nullptr;
  int n_queries = 0;
  // The block's queries before RoPE (after Qwen3's and Gemma 3's q_norm), [n_new, num_heads,
  // head_dim], where the ops read them, if requested (StatsRequest::pre_rope_queries).
  const float* pre_rope_queries = nullptr;
  // How the layer rotates its queries and keys (the model's RoPE for this layer), and the position
  // the token after this block takes: what a policy that predicts future queries needs
  // (expected_attention). Null rope: the engine gave none (host hooks in tests).
  const kernels::cpu::RopeParams* rope = nullptr;
  int32_t block_end = 0;
  // The layer's output projection [wo_dim, num_heads x head_dim] where the ops read it (f32, or
  // bf16 with wo_bf16), if requested (StatsRequest::output_projection).
  const void* wo = nullptr;
  bool wo_bf16 = false;
  int wo_dim = 0;
  // The ops table of the engine's backend (policy_ops.h): where a policy that decides with ops
  // keeps its state, and where col_sums and last_probs point (host memory for the CPU instance,
  // device memory for a device instance). Null: the CPU instance (host statistics).
  PolicyOps* ops = nullptr;
};

struct StatsRequest {
  bool col_sums = false;
  int last_w = 0;                // probabilities of the last w queries (clamped to n_new)
  bool pre_rope_keys = false;
  int last_queries = 0;          // the block's last q queries after RoPE (clamped to n_new)
  bool pre_rope_queries = false;  // every query of the block before RoPE
  bool output_projection = false;  // the layer's output projection (LayerStats::wo)
};

// What both requests ask for (a shared prefill's record; a composition's two policies).
inline StatsRequest merged(StatsRequest a, const StatsRequest& b) {
  a.col_sums |= b.col_sums;
  a.last_w = a.last_w > b.last_w ? a.last_w : b.last_w;
  a.pre_rope_keys |= b.pre_rope_keys;
  a.last_queries = a.last_queries > b.last_queries ? a.last_queries : b.last_queries;
  a.pre_rope_queries |= b.pre_rope_queries;
  a.output_projection |= b.output_projection;
  return a;
}

}  // namespace kvb::kernels::ops
