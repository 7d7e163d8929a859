// Keep-list derivation and cache fingerprints of the GPU engine's host mirror (mirror_sync.h).
#include "workers/engine/mirror_sync.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace kvb::engine {

void snapshot_positions(kernels::KvCache& cache, int layer, LayerPositions* out) {
  const int heads = cache.shape().num_kv_heads;
  out->off.assign(heads + 1, 0);
  for (int h = 0; h < heads; ++h) out->off[h + 1] = out->off[h] + cache.length(layer, h);
  out->pos.resize(out->off[heads]);
  kernels::LayerKvView view = cache.layer(layer);
  for (int h = 0; h < heads; ++h) {
    std::copy(view.position(h), view.position(h) + cache.length(layer, h), &out->pos[out->off[h]]);
  }
}

bool derive_keep_lists(const LayerPositions& before, kernels::KvCache& after, int layer,
                       std::vector<int32_t>* slots, std::vector<int32_t>* counts, int* ld) {
  const int heads = after.shape().num_kv_heads;
  KVB_CHECK(static_cast<int>(before.off.size()) == heads + 1)
      << "derive_keep_lists: a snapshot of " << before.off.size() - 1 << " heads, the cache has "
      << heads;
  bool changed = false;
  int width = 1;
  for (int h = 0; h < heads; ++h) {
    const int old_len = static_cast<int>(before.off[h + 1] - before.off[h]);
    const int len = after.length(layer, h);
    KVB_CHECK(len <= old_len) << "layer " << layer << " head " << h << " grew from " << old_len
                              << " to " << len << " slots in a policy hook";
    changed = changed || len != old_len;
    width = std::max(width, len);
  }
  if (!changed) return false;
  kernels::LayerKvView view = after.layer(layer);
  slots->assign(static_cast<size_t>(heads) * width, 0);
  counts->assign(heads, 0);
  for (int h = 0; h < heads; ++h) {
    const int32_t* old = &before.pos[before.off[h]];
    const int old_len = static_cast<int>(before.off[h + 1] - before.off[h]);
    const int len = after.length(layer, h);
    const int32_t* now = view.position(h);
    int j = 0;
    for (int i = 0; i < len; ++i) {
      while (j < old_len && old[j] != now[i]) ++j;
      KVB_CHECK(j < old_len) << "layer " << layer << " head " << h << " holds position " << now[i]
                             << " after the policy's hook, which it did not hold before (or out "
                                "of order): keep_slots only removes";
      (*slots)[static_cast<size_t>(h) * width + i] = j++;
    }
    (*counts)[h] = len;
  }
  *ld = width;
  return true;
}

void CacheFingerprint::capture(kernels::KvCache& cache) {
  const kernels::KvCacheShape& sh = cache.shape();
  const size_t cells = static_cast<size_t>(sh.num_layers) * sh.num_kv_heads;
  cache_ = &cache;
  shape_ = sh;
  next_ = cache.next_position();
  lengths_.assign(cells, 0);
  last_pos_.assign(cells, -1);
  last_key_.assign(cells * sh.head_dim, 0.0f);
  for (int l = 0; l < sh.num_layers; ++l) {
    kernels::LayerKvView view = cache.layer(l);
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      const size_t i = static_cast<size_t>(l) * sh.num_kv_heads + h;
      const int len = cache.length(l, h);
      lengths_[i] = len;
      if (len == 0) continue;
      last_pos_[i] = view.position(h)[len - 1];
      std::memcpy(&last_key_[i * sh.head_dim], view.key(h, len - 1), sh.head_dim * sizeof(float));
    }
  }
}

bool CacheFingerprint::matches(kernels::KvCache& cache) const {
  const kernels::KvCacheShape& sh = cache.shape();
  if (cache_ != &cache || next_ != cache.next_position() || sh.num_layers != shape_.num_layers ||
      sh.num_kv_heads != shape_.num_kv_heads || sh.head_dim != shape_.head_dim) {
    return false;
  }
  for (int l = 0; l < sh.num_layers; ++l) {
    kernels::LayerKvView view = cache.layer(l);
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      const size_t i = static_cast<size_t>(l) * sh.num_kv_heads + h;
      const int len = cache.length(l, h);
      if (len != lengths_[i]) return false;
      if (len == 0) continue;
      if (view.position(h)[len - 1] != last_pos_[i] ||
          std::memcmp(view.key(h, len - 1), &last_key_[i * sh.head_dim],
                      sh.head_dim * sizeof(float)) != 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace kvb::engine
