// A float's IEEE-754 bit pattern and back, for tests that compare results bit for bit.
#pragma once

#include <bit>
#include <cstdint>

namespace kvb::test {

inline uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
inline float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

}  // namespace kvb::test
