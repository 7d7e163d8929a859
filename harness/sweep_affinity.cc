// Prefix-affine hand-out of bundles (sweep_affinity.h).
#include "harness/sweep_affinity.h"

#include <algorithm>
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
    for (uint64_t h : chains_[b]) buckets_[h].push_back(b);
  }
  left_ = order_.size();
}

PrefixAffinity::Worker& PrefixAffinity::worker_state(int worker) {
  Worker& w = workers_[worker];
  if (w.share.empty()) w.share.resize(chains_.size());
  return w;
}

void PrefixAffinity::add_prompt(Worker& w, int b, int64_t stamp) {
  const std::vector<uint64_t>& c = chains_[b];
  for (size_t d = 0; d < c.size(); ++d) {
    for (int x : buckets_[c[d]]) {
      if (taken_[x]) continue;
      Share& s = w.share[x];
      s = std::max(s, Share{static_cast<int>(d) + 1, stamp});
    }
  }
}

int PrefixAffinity::next(int worker) {
  const int b = peek(worker);
  if (b >= 0) take(worker, b);
  return b;
}

int PrefixAffinity::shared_blocks(int worker, int bundle) {
  KVB_CHECK(bundle >= 0 && static_cast<size_t>(bundle) < chains_.size())
      << "bundle " << bundle << " has no prefix chain";
  return worker_state(worker).share[bundle].depth;
}

int PrefixAffinity::peek(int worker) {
  if (left_ == 0) return -1;
  Worker& me = worker_state(worker);
  while (taken_[order_[cursor_]]) ++cursor_;
  int affine = -1, cold = -1;
  Share affine_share;
  int cold_other = 0;
  for (size_t i = cursor_; i < order_.size(); ++i) {  // the bundles left, in order
    const int b = order_[i];
    if (taken_[b]) continue;
    int other = 0;  // the most blocks another worker's recent prompts share with b
    for (const auto& [id, w] : workers_) {
      if (id != worker) other = std::max(other, w.share[b].depth);
    }
    const Share& mine = me.share[b];
    if (mine.depth >= kMinSharedBlocks && mine.depth >= other &&
        (affine < 0 || affine_share < mine)) {
      affine = b;
      affine_share = mine;
    }
    if (cold < 0 || other < cold_other) {
      cold = b;
      cold_other = other;
    }
  }
  return affine >= 0 ? affine : cold;
}

void PrefixAffinity::take(int worker, int best) {
  KVB_CHECK(best >= 0 && static_cast<size_t>(best) < chains_.size() && !taken_[best])
      << "bundle " << best << " is not one left to hand out";
  Worker& me = worker_state(worker);
  last_shared_blocks_ = me.share[best].depth;
  taken_[best] = true;
  --left_;
  me.history.emplace_front(best, stamp_);
  add_prompt(me, best, stamp_++);
  if (me.history.size() > kHistory) {  // the oldest leaves: the shares are rebuilt without it
    me.history.pop_back();
    std::fill(me.share.begin(), me.share.end(), Share{});
    for (const auto& [b, stamp] : me.history) add_prompt(me, b, stamp);
  }
}

}  // namespace kvb::harness
