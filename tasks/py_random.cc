// CPython's random.Random(seed).shuffle (tasks/py_random.h): Modules/_randommodule.c (MT19937,
// init_by_array, random_seed) and Lib/random.py (getrandbits for k <= 32, _randbelow_with_
// getrandbits, shuffle).
#include "tasks/py_random.h"

#include <array>
#include <utility>

namespace kvb::tasks::py {
namespace {

class Mt19937 {
 public:
  // random.seed(n) for an int n >= 0: init_by_array over n's 32-bit words, least significant
  // first (one word 0 for n = 0).
  explicit Mt19937(uint64_t seed) {
    std::vector<uint32_t> key = {static_cast<uint32_t>(seed)};
    if (seed >> 32) key.push_back(static_cast<uint32_t>(seed >> 32));
    init_genrand(19650218u);
    size_t i = 1, j = 0;
    for (size_t k = std::max<size_t>(kN, key.size()); k; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] +
               static_cast<uint32_t>(j);
      if (++i >= kN) mt_[0] = mt_[kN - 1], i = 1;
      if (++j >= key.size()) j = 0;
    }
    for (size_t k = kN - 1; k; --k) {
      mt_[i] =
          (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
      if (++i >= kN) mt_[0] = mt_[kN - 1], i = 1;
    }
    mt_[0] = 0x80000000u;
  }

  uint32_t next() {
    if (index_ >= kN) twist();
    uint32_t y = mt_[index_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }

  uint32_t getrandbits(int k) { return k == 0 ? 0 : next() >> (32 - k); }  // 0 <= k <= 32

  // _randbelow_with_getrandbits(n), n >= 1: rejection on n.bit_length() bits.
  uint32_t randbelow(uint32_t n) {
    int k = 0;
    while (k < 32 && (n >> k)) ++k;
    uint32_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
  }

 private:
  static constexpr size_t kN = 624, kM = 397;
  void init_genrand(uint32_t s) {
    mt_[0] = s;
    for (size_t i = 1; i < kN; ++i) {
      mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
    }
    index_ = kN;
  }
  void twist() {
    for (size_t i = 0; i < kN; ++i) {
      const uint32_t y = (mt_[i] & 0x80000000u) | (mt_[(i + 1) % kN] & 0x7fffffffu);
      mt_[i] = mt_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    index_ = 0;
  }
  std::array<uint32_t, kN> mt_{};
  size_t index_ = kN;
};

}  // namespace

std::vector<size_t> shuffle_order(uint64_t seed, size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  Mt19937 rng(seed);
  for (size_t i = n; i-- > 1;) {  // for i in reversed(range(1, len(x)))
    const size_t j = rng.randbelow(static_cast<uint32_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace kvb::tasks::py
