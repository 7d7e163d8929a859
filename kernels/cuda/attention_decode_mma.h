// Decode attention (n == 1) on bf16 tensor cores (issue 16 item 3): the split-K partial pass of
// cuda::attention's decode path where AttentionArgs::decode_kernel is kDecodeTensorCore, for a
// bf16 cache and no statistics. One block per (KV head, chunk of keys); the GQA group's query
// heads are the rows of one 16-row mma tile (rows past the group are zeros), so each K/V row is
// read once for the whole group and the products run as mma.sync.m16n8k16 (bf16 operands, f32
// accumulators). The block's 4 warps take the chunk's key tiles in turn (warp w: tiles w, w + 4,
// ...), each through its own three-stage cp.async pipeline (16-byte copies, zero-filled past the
// chunk) with its own online softmax; the block merges its warps' states (max, sum, output) and
// writes one partial state per query head for decode_combine_kernel, as the streamed kernel does.
//
// Numerics: the contract of attention_prefill_mma.h for one query: the query rounded to bf16
// (nearest even), keys and values the cache's bf16, scores accumulated in f32 inside the tensor
// cores, the softmax in f32, probabilities rounded to bf16 for P x V (f32 accumulation). Against
// the f32 reference fed the bf16-rounded query: outputs within 2^-9 max|v| plus the f32 score
// error (tests/cuda/parity_prefill_mma.h).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_decode_stream.h"

namespace kvb::kernels::cuda {

using DecodeMmaPlan = DecodeGridPlan;  // splits 0: the tensor-core kernel does not take it

// How the tensor-core decode kernel would run: a bf16 cache, head_dim one of 32, 64, 96, 128,
// 256, group <= 16, keys and values 16-byte aligned, a device of compute capability >= 8.0 whose
// shared memory per block holds the four warps' pipelines (about 213 KB at head_dim 128: an H100
// or H200, not an A100); otherwise splits == 0. Splits: about decode_blocks blocks over the KV
// heads (0: as many as fit on every multiprocessor at once), each at least four key tiles where
// the heads are long enough. Sets the kernel's shared-memory attributes on the current device.
DecodeMmaPlan plan_decode_mma(const DeviceLayerKvView& kv, int group, int max_len,
                              int decode_blocks);

// The partial pass of seqs.count decode steps (1..kMaxDecodeSeqs; a.n == 1, validated by
// cuda::attention) that share a's shape, as decode_stream (attention_decode_stream.h): sequence
// i's rows, lengths, query, partial states and plan (plan_decode_mma's) in seqs.s[i], no scores
// (a sequence that asks for statistics runs another kernel; a's own statistics are not looked
// at). One launch, stream-ordered.
void decode_mma(const AttentionArgs& a, int group, size_t smem, const DecodeSeqs& seqs,
                cudaStream_t stream);

}  // namespace kvb::kernels::cuda
