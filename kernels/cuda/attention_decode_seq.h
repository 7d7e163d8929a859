// The per-sequence arguments of a decode step (n == 1) for the kernels that take several
// sequences in one launch (issue 16 items 1 and 3: a bundle's decode batch): the streamed and
// tensor-core partial passes and attention.cu's combine and probability passes pick their
// sequence with blockIdx.z. The sequences share the shape (heads, head_dim, dtype, window,
// scale); each has its own cache rows, lengths, query, output, statistics and split-K plan, so
// a sequence gets the same bits in a batch as alone. Passed by value as a kernel parameter (no
// copy to the device). Internal to the attention kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvb::kernels::cuda {

constexpr int kMaxDecodeSeqs = 16;  // sequences per launch: 16 x 112 bytes of parameters

struct DecodeSeq {
  const float* q = nullptr;    // [num_heads, head_dim], post-RoPE
  float* out = nullptr;        // [num_heads, head_dim]
  const void* keys = nullptr;  // the layer's rows (the launch's dtype)
  const void* values = nullptr;
  const int32_t* offsets = nullptr;  // device [num_kv_heads]
  const int32_t* lengths = nullptr;  // device [num_kv_heads]
  float2* part_ml = nullptr;         // [num_heads, splits]: each chunk's (max, sum)
  float* part_acc = nullptr;         // [num_heads, splits, head_dim]
  float* scores = nullptr;           // [num_heads, stride]: raw scaled scores, or null
  float2* row_stats = nullptr;       // [num_heads]: the combined (max, sum), with statistics
  float* col_sums = nullptr;         // [num_heads, stride] probabilities, or null
  float* last_probs = nullptr;       // [num_heads, stride] probabilities, or null
  int stride = 0;                    // statistics row length (>= the longest head)
  int chunk = 0;                     // keys per partial block
  int splits = 0;                    // chunks covering the longest head (<= grid y extent)
};

struct DecodeSeqs {
  DecodeSeq s[kMaxDecodeSeqs];
  int count = 0;
};

}  // namespace kvb::kernels::cuda
