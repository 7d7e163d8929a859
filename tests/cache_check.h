// Test helper: two KV caches hold the same lengths, positions and rows (bit for bit), capacity,
// physical bytes and next position (prefill sharing and prefix reuse compare a cache with the
// one its own prefill gives).
#pragma once

#include <gtest/gtest.h>

#include <cstring>

#include "kernels/kv_cache.h"

namespace kvb {

inline void expect_same_cache(const kernels::KvCache& a, const kernels::KvCache& b) {
  ASSERT_EQ(a.shape().num_layers, b.shape().num_layers);
  ASSERT_EQ(a.shape().num_kv_heads, b.shape().num_kv_heads);
  EXPECT_EQ(a.capacity(), b.capacity());
  EXPECT_EQ(a.physical_bytes(), b.physical_bytes());
  EXPECT_EQ(a.next_position(), b.next_position());
  const int d = a.shape().head_dim;
  for (int l = 0; l < a.shape().num_layers; ++l) {
    // rows_f32: an f16 cache's rows as f32 (exact), f32 rows themselves.
    const kernels::LayerKvView va = a.rows_f32(l), vb = b.rows_f32(l);
    for (int h = 0; h < a.shape().num_kv_heads; ++h) {
      ASSERT_EQ(a.length(l, h), b.length(l, h)) << "layer " << l << " head " << h;
      const size_t rows = static_cast<size_t>(a.length(l, h)) * d;
      EXPECT_EQ(0, std::memcmp(va.key(h, 0), vb.key(h, 0), rows * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(va.value(h, 0), vb.value(h, 0), rows * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(va.position(h), vb.position(h), a.length(l, h) * 4));
      EXPECT_EQ(a.pruned_key_channels(l, h), b.pruned_key_channels(l, h));  // ThinK's
      EXPECT_EQ(a.channel_pruned_slots(l, h), b.channel_pruned_slots(l, h));
    }
  }
}

}  // namespace kvb
