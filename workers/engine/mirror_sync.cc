// Cache fingerprints of the GPU engine's host mirror (mirror_sync.h).
#include "workers/engine/mirror_sync.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace kvb::engine {

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
