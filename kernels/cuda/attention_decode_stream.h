// Decode attention (n == 1) streamed through shared memory (issue 16 item 3): the split-K
// partial pass of cuda::attention's decode path by default (AttentionArgs::decode_kernel).
// One block per (KV head, chunk of keys) serves every query head of the GQA group, so each K/V
// row is read from memory once. The chunk's rows arrive in 32-key tiles through a three-stage
// cp.async pipeline (16-byte copies, zero-filled past the chunk): while a tile is scored, the
// next two are in flight, and several blocks share a multiprocessor, so the loads in flight
// cover the memory latency. Per tile: warp w scores the tile's keys for query heads w, w + 4,
// ... (one key per lane; the dot over head_dim as per-16-byte-vector sums added in order, from
// shared memory), folds the tile into the head's online softmax (one new maximum per tile), and
// stores the probabilities; then every thread adds p x V for its slice of its head's output
// dimensions over its subset of the tile's keys (subsets where a head has more threads than
// output vectors, added in order at the end). The block ends with one
// partial state per query head: the [num_heads, splits] (max, sum) and [num_heads, splits,
// head_dim] arrays decode_combine_kernel merges, and the raw scaled scores for statistics
// (scores[h * stride + key]) when asked. The softmax is the CPU's up to f32 summation order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_decode_seq.h"
#include "kernels/cuda/kernel_ready.h"

namespace kvb::kernels::cuda {

using DecodeStreamPlan = DecodeGridPlan;  // splits 0: the streamed kernel does not take it

// How the streamed kernel would run: rows of 16k bytes (bf16 head_dim % 8 == 0, f32 % 4), keys
// and values 16-byte aligned, group <= 8, a device of compute capability >= 8.0 (cp.async) whose
// shared memory per block holds three stages; otherwise splits == 0. Splits: about
// decode_blocks blocks over the KV heads (0: as many as fit on every multiprocessor at once,
// with the carveout set to all shared memory: four at bf16 head_dim 128), chunks of whole
// tiles. Sets the kernel's shared-memory attributes on the current device (once).
DecodeStreamPlan plan_decode_stream(const DeviceLayerKvView& kv, int group, int max_len,
                                    int decode_blocks);

// The partial pass of seqs.count decode steps (1..kMaxDecodeSeqs; a.n == 1, validated by
// cuda::attention) that share a's shape (its view's num_kv_heads, head_dim and dtype; its
// window and scale; the group): sequence i's rows, lengths, query, partial states ([num_heads,
// splits] and [num_heads, splits, head_dim]), raw scores ([num_heads, stride] or null) and plan
// (chunk, splits: plan_decode_stream's for its own longest head) in seqs.s[i]. smem: the plan's
// (the same for every sequence of the shape). Grid (num_kv_heads, the most splits, count): one
// launch, stream-ordered; each sequence's blocks compute what its own launch would.
void decode_stream(const AttentionArgs& a, int group, size_t smem, const DecodeSeqs& seqs,
                   cudaStream_t stream);

}  // namespace kvb::kernels::cuda
