// Python's `random.Random(seed).shuffle` (CPython's Mersenne Twister MT19937 seeded by
// init_by_array with the seed's 32-bit words, getrandbits, _randbelow_with_getrandbits, and
// shuffle's backwards Fisher-Yates), so that RULER's qa.py answer positions, which come from
// random.Random(random_seed).shuffle(all_docs), are reproduced exactly. Pinned against CPython
// by scripts/make_ruler_qa_fixture.py (tests/fixtures/tasks/ruler_qa/expected.json).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvb::tasks::py {

// order[j] = the index of the element that random.Random(seed).shuffle puts at position j of a
// list of n elements (seed >= 0, as RULER's --random_seed).
std::vector<size_t> shuffle_order(uint64_t seed, size_t n);

}  // namespace kvb::tasks::py
