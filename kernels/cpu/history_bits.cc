// Scissorhands' history bits on the host: the loop kernels/policies/scissorhands.cc ran before
// the ops table, unchanged.
#include "kernels/cpu/history_bits.h"

#include "common/error.h"
#include "kernels/cpu/gqa.h"

namespace kvb::kernels::cpu {

void update_history_bits(const HeadHistoryArgs& a, std::vector<uint64_t>& bits) {
  const uint64_t window = a.history == 64 ? ~uint64_t{0} : (uint64_t{1} << a.history) - 1;
  const int before = a.len - a.n_new;  // slots cached before this block
  if (before == 0) bits.clear();       // a fresh cache (the policy may serve several sequences)
  KVB_ASSERT(static_cast<int>(bits.size()) == before);
  bits.resize(a.len, 0);  // new tokens: "not below" for the queries before they existed
  // Queries of the block older than the recorded ones only shift bits out of the window.
  const int unrecorded = a.n_new - a.last_w;
  for (auto& b : bits) b = unrecorded >= a.history ? 0 : (b << unrecorded) & window;
  std::vector<float> p(a.len);
  for (int j = 0; j < a.last_w; ++j) {
    const int i = unrecorded + j;        // query index in the block
    const int visible = before + i + 1;  // keys it attended over, itself included
    const float* row = a.last_probs + static_cast<size_t>(j) * a.stride;
    reduce_gqa(row, static_cast<size_t>(a.last_w) * a.stride, a.group, visible,
               GqaReduce::kMean, p.data());
    const int32_t pos = a.positions[before + i];
    const float threshold = 1.0f / static_cast<float>(a.inv_position ? pos + 1 : visible);
    for (int s = 0; s < a.len; ++s) {
      const uint64_t below = s < visible && p[s] < threshold ? 1 : 0;
      bits[s] = ((bits[s] << 1) | below) & window;
    }
  }
}

}  // namespace kvb::kernels::cpu
