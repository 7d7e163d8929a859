// Megatron-style tensor parallelism for the engine (issue "Multi-GPU workers"): a group of ranks
// runs one model, each rank holding a shard of every layer:
//   - attention: the query heads of a contiguous block of KV heads (GQA groups never straddle
//     ranks), i.e. the rows of wq, wk, wv (and their biases) of those heads, and the matching
//     columns of wo (row-parallel output projection);
//   - MLP: a contiguous block of hidden_dim / size columns: rows of w_gate and w_up, columns of
//     w_down (row-parallel down projection);
//   - replicated: the embedding, the norms, the final norm and the classifier.
// The forward pass needs one all-reduce (sum) of [tokens, dim] after each row-parallel
// projection: 2 per layer. Each rank's KV cache holds only its own KV heads.
#pragma once

#include <string>
#include <vector>

#include "workers/engine/model.h"

namespace kvb::engine {

// Degrees that split the model evenly: the common divisors of num_heads, num_kv_heads and
// hidden_dim (ascending; 1 always).
std::vector<int> valid_tp_degrees(int num_heads, int num_kv_heads, int hidden_dim);

// "" when `degree` can shard the model; otherwise the reason, naming the model, the numbers
// and the valid degrees (for usage errors in validate, sweep and the workers).
std::string tp_degree_error(const std::string& model, int num_heads, int num_kv_heads,
                            int hidden_dim, int degree);

// Rank `rank`'s shard of `full` for a group of `size` ranks (size 1: a copy). The shard's config
// is the rank's local shape: num_heads / size, num_kv_heads / size, hidden_dim / size; dim,
// head_dim, vocabulary and context unchanged. Throws a usage error when size does not divide the
// model (tp_degree_error). `full`'s tokenizer metadata (gguf) is shared.
Model shard_model(const Model& full, int rank, int size);

}  // namespace kvb::engine
