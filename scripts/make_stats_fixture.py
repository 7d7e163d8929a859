#!/usr/bin/env python3
"""Reference values for results/stats (tests/unit/test_stats.cc), computed with numpy and scipy.

- mean_ci: Student-t interval, scipy.stats.t.ppf(0.975, n - 1) * sd / sqrt(n).
- paired_bootstrap: the percentile bootstrap of the mean paired difference with 400,000 numpy
  resamples (numpy's default percentile interpolation), and the two-sided p-value
  2 * min(P(mean* <= 0), P(mean* >= 0)). kvbench draws its own resamples, so the test compares
  within a Monte-Carlo tolerance that the fixture records (bootstrap standard error / 8).
Pinned: numpy 1.26.4, scipy 1.13.1. Run: $(bash scripts/ref_env.sh) scripts/make_stats_fixture.py
(after `.venv-ref/bin/pip install scipy==1.13.1`). Writes tests/fixtures/stats/stats.json.
"""
import json
import os

import numpy as np
import scipy
import scipy.stats

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rng = np.random.default_rng(20261122)


def mean_ci(x):
    x = np.asarray(x, dtype=float)
    n = len(x)
    m = float(x.mean())
    if n < 2 or x.std() == 0:
        return {"x": x.tolist(), "mean": m, "lo": m, "hi": m}
    se = x.std(ddof=1) / np.sqrt(n)
    t = scipy.stats.t.ppf(0.975, n - 1)
    return {"x": x.tolist(), "mean": m, "lo": m - t * se, "hi": m + t * se}


def paired(a, b, resamples=400_000):
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    idx = rng.integers(0, n, size=(resamples, n))
    means = d[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    p = min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean()))
    se = means.std()
    return {"a": list(map(float, a)), "b": list(map(float, b)), "mean_diff": float(d.mean()),
            "lo": float(lo), "hi": float(hi), "p_value": float(p), "tolerance": float(se / 8)}


cases_ci = [
    mean_ci(rng.normal(0.6, 0.2, 20)),
    mean_ci([0.0, 1.0, 1.0, 0.0, 1.0]),
    mean_ci([3.0, 5.0]),
]
a_null = rng.uniform(0, 1, 40)
b_null = a_null + rng.normal(0, 0.05, 40)
a_diff = rng.uniform(0.5, 1, 30)
b_diff = a_diff - rng.uniform(0.05, 0.25, 30)
binary_a = (rng.uniform(size=50) < 0.8).astype(float)
binary_b = (rng.uniform(size=50) < 0.6).astype(float)
cases_paired = [paired(a_null, b_null), paired(a_diff, b_diff), paired(binary_a, binary_b)]
out = {
    "generator": "scripts/make_stats_fixture.py",
    "versions": {"numpy": np.__version__, "scipy": scipy.__version__},
    "mean_ci": cases_ci,
    "paired": cases_paired,
    "t_quantiles": [{"p": p, "dof": k, "t": float(scipy.stats.t.ppf(p, k))}
                    for p, k in [(0.975, 1), (0.975, 4), (0.975, 29), (0.995, 10), (0.9, 100)]],
}
path = os.path.join(root, "tests", "fixtures", "stats", "stats.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", path)
