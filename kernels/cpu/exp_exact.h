// exp of many floats with the bits of the C library's expf (std::exp(float)), faster.
//
// Why: the attention softmax takes one exp per probability (and SiLU one per hidden unit) (a
// 4,096-token prompt on SmolLM2: 2.3 billion), and glibc's expf, called one value at a time, was
// 15% of a CPU prefill's cycles. Its results are part of the reference bits, so any replacement
// must return exactly them.
//
// How (AVX-512 eight doubles at a time, AVX2 four): each x in [-87, 88] is evaluated in double,
// e^x = 2^(n/16) e^r with n = round(16 x / ln 2), |r| <= ln2 / 32, a table of 2^(i/16) and a
// degree-5 Taylor polynomial: relative error below 2^-42. glibc's expf computes a double within
// 1.69 * 2^-34 (relative) of e^x and rounds it to float once (its comments: 0.502 ULP); so where
// our double is farther than 2^-31 (relative) from the midpoint between two floats, e^x is on the
// same side of that midpoint as ours and as glibc's double, and both round to the same float.
// Values closer to a midpoint (about 1.6% of them), outside [-87, 88] (subnormal or overflowing
// results, non-finite inputs) and without AVX2 go to std::exp. exp_floats' test compares it with
// std::exp on every float of [-87.5, 88.5] and the special values, bit for bit, on each path: on a
// C library whose expf errs more than glibc's, that test fails (it is the arbiter, not this
// argument).
#pragma once

namespace kvb::kernels::cpu {

// y[i] = std::exp(x[i]) for i in [0, n), bit for bit; y may be x.
void exp_floats(float* y, const float* x, int n);

}  // namespace kvb::kernels::cpu
