// Deterministic top-k and argmin over f32 scores, CUDA twin of kernels/cpu/select.h with the
// same total order: a beats b when its score is larger, or the scores are equal and its index is
// higher (ties keep the more recent token); NaN ranks below every number; -0 == +0. Results are
// identical to the CPU's (the order is total, so the selected set is unique).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvb::kernels::cuda {

// Device scores/out/eligible. Each writes the selected indices in increasing order and returns
// their count, min(max(k, 0), candidates). Radix select over (score key << 32 | index) in one
// block, then an ordered compaction. select_topk_masked must read the count of eligible entries
// back from the device (one stream sync); the others know it on the host.
int select_topk(const float* scores, int n, int k, int32_t* out, cudaStream_t stream = 0);
int select_topk_range(const float* scores, int begin, int end, int k, int32_t* out,
                      cudaStream_t stream = 0);
int select_topk_masked(const float* scores, const uint8_t* eligible, int n, int k, int32_t* out,
                       cudaStream_t stream = 0);

// Per-row top-k, one block per row. scores: [rows, ld]; lengths, k: [rows]; out: [rows, ld];
// counts: [rows] = min(max(k[r], 0), lengths[r]); all device. lengths are checked on the device
// (0 <= lengths[r] <= ld; one stream sync) and a bad one throws kvb::Error.
void select_topk_rows(const float* scores, int rows, int ld, const int32_t* lengths,
                      const int32_t* k, int32_t* out, int32_t* counts, cudaStream_t stream = 0);

// The lowest-ranked eligible index (smallest score; equal scores: the lower index) or -1 when
// none is eligible. Device scores/eligible; the index comes back to the host (one stream sync).
int select_argmin(const float* scores, const uint8_t* eligible, int n, cudaStream_t stream = 0);

// select_argmin for many rows without a host round trip (one eviction per KV head and step):
// out[r] = argmin over scores[r * ld + j], j < n[r] (device n: [rows], each in [0, ld], -1 when
// n[r] <= 0; out: device [rows]). An n[r] > ld is clamped to ld (the row has no more entries).
void select_argmin_rows(const float* scores, int rows, int ld, const int32_t* n, int32_t* out,
                        cudaStream_t stream = 0);

}  // namespace kvb::kernels::cuda
