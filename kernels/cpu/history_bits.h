// Scissorhands' below-threshold history for one KV head on the host (POLICIES.md
// "scissorhands"; the CPU twin of kernels/cuda/scores.h's scissorhands_update_bits, and the
// CPU instance's PolicyOps::history_bits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvb::kernels::cpu {

struct HeadHistoryArgs {
  int len = 0;        // the head's slots, this block's included
  int n_new = 0;      // tokens this block appended (the last n_new slots)
  int last_w = 0;     // recorded queries: the block's last last_w (1 <= last_w <= n_new)
  int group = 1;      // query heads of the KV head
  int history = 32;   // 1..64 bits kept per slot
  bool inv_position = false;
  const float* last_probs = nullptr;  // the head's first query-head row: [group, last_w, stride]
  int stride = 0;
  const int32_t* positions = nullptr;  // [len] the head's slot positions
};

// bits (the head's row, `len - n_new` entries on entry; cleared when that is 0) grows to len:
// new slots start at 0, the block's unrecorded queries shift the old bits out, then each
// recorded query shifts in "GQA-mean p < threshold" (1 / visible, or 1 / (position + 1)).
void update_history_bits(const HeadHistoryArgs& a, std::vector<uint64_t>& bits);

}  // namespace kvb::kernels::cpu
