// The factorisation and solve of kvpress's LeverageScorePress (policy_ops.h leverage_scores), in
// a header that the CPU instance and its CUDA twin both compile: one definition, so the device's
// Cholesky factor and scores are the host's bits (f64 fused multiply-adds, IEEE sqrt and division).
#pragma once

#include <cmath>

#include "kernels/cpu/subgen_counter.h"  // KVB_HOST_DEVICE

namespace kvb::kernels::cpu {

// L (k x k, row-major, lower; the upper part left as it is) with L L^T = G + jitter I for the
// first jitter of 1e-2, 1e-1, 1, 10, 100 (kvpress's chol_with_jitter from 1e-2, five tries) whose
// every pivot is > 0; false when none is.
KVB_HOST_DEVICE inline bool cholesky_with_jitter(const double* g, int k, double* l) {
  double jitter = 1e-2;
  for (int attempt = 0; attempt < 5; ++attempt) {
    bool ok = true;
    for (int j = 0; j < k && ok; ++j) {
      double s = g[j * k + j] + jitter;
      for (int p = 0; p < j; ++p) s = fma(-l[j * k + p], l[j * k + p], s);
      if (!(s > 0)) {
        ok = false;
        break;
      }
      const double d = sqrt(s);
      l[j * k + j] = d;
      for (int i = j + 1; i < k; ++i) {
        double t = g[i * k + j];
        for (int p = 0; p < j; ++p) t = fma(-l[i * k + p], l[j * k + p], t);
        l[i * k + j] = t / d;
      }
    }
    if (ok) return true;
    jitter = fmax(1e-8, 10.0 * jitter);
  }
  return false;
}

// max(0, |L^{-1} x|^2) by forward substitution (y_a = (x_a - sum_{b<a} L[a][b] y_b) / L[a][a],
// the squares summed in a order); y: k doubles of scratch.
KVB_HOST_DEVICE inline double solve_sq_norm(const double* l, const double* x, int k, double* y) {
  double sq = 0;
  for (int a = 0; a < k; ++a) {
    double s = x[a];
    for (int b = 0; b < a; ++b) s = fma(-l[a * k + b], y[b], s);
    y[a] = s / l[a * k + a];
    sq = fma(y[a], y[a], sq);
  }
  return sq > 0 ? sq : 0.0;
}

}  // namespace kvb::kernels::cpu
