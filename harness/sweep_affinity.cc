// Prefix-affine hand-out of bundles (sweep_affinity.h).
#include "harness/sweep_affinity.h"

#include <utility>

#include "common/error.h"

namespace kvb::harness {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<uint64_t> prefix_chain(const std::vector<int32_t>& ids) {
  std::vector<uint64_t> chain;
  uint64_t h = 0x6b76626e63686169ULL;
  for (size_t b = 0; b + kPrefixBlock <= ids.size() && chain.size() < kPrefixBlocks;
       b += kPrefixBlock) {
    for (size_t i = b; i < b + kPrefixBlock; ++i) {
      h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(ids[i])) + 0x9e3779b97f4a7c15ULL));
    }
    chain.push_back(h);
  }
  return chain;
}

PrefixAffinity::PrefixAffinity(std::vector<int> order, std::vector<std::vector<uint64_t>> chains)
    : order_(std::move(order)), chains_(std::move(chains)), taken_(chains_.size(), false) {
  for (int b : order_) {
    KVB_CHECK(b >= 0 && static_cast<size_t>(b) < chains_.size())
        << "bundle " << b << " of the order has no prefix chain";
    for (uint64_t h : chains_[b]) buckets_[h].bundles.push_back(b);
  }
  left_ = order_.size();
}

int PrefixAffinity::first_left(uint64_t h) {
  auto it = buckets_.find(h);
  if (it == buckets_.end()) return -1;
  Bucket& bk = it->second;
  while (bk.head < bk.bundles.size() && taken_[bk.bundles[bk.head]]) ++bk.head;
  return bk.head < bk.bundles.size() ? bk.bundles[bk.head] : -1;
}

int PrefixAffinity::next(int worker) {
  if (left_ == 0) return -1;
  int best = -1;
  size_t best_depth = kMinSharedBlocks - 1;  // a choice must share more whole blocks than this
  std::deque<int>& hist = history_[worker];
  for (int h : hist) {  // the latest first: among equal depths, the latest prompt's bundle wins
    const std::vector<uint64_t>& c = chains_[h];
    for (size_t d = c.size(); d > best_depth; --d) {
      const int b = first_left(c[d - 1]);
      if (b < 0) continue;
      best = b;
      best_depth = d;
      break;  // shallower depths of this prompt share less
    }
  }
  if (best < 0) {
    while (taken_[order_[cursor_]]) ++cursor_;
    best = order_[cursor_];
  }
  taken_[best] = true;
  --left_;
  hist.push_front(best);
  if (hist.size() > kHistory) hist.pop_back();
  return best;
}

}  // namespace kvb::harness
