#!/usr/bin/env python3
"""Tests of scripts/check_findings.py against hand-computed verdicts (configs/README.md, "Findings").

Run: /usr/bin/python3 tests/findings/test_check_findings.py   (stdlib unittest; the script needs
PyYAML and numpy). Each test builds a small SQLite database with results/schema.sql and states the
arithmetic behind every expectation in a comment.
"""
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCHEMA = os.path.join(ROOT, "results", "schema.sql")
SCRIPT = os.path.join(ROOT, "scripts", "check_findings.py")

_spec = importlib.util.spec_from_file_location("check_findings", SCRIPT)
cf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cf)

# ---------------------------------------------------------------------------------------------
# A pure-Python splitmix64, written here independently of the script's numpy version.
M64 = (1 << 64) - 1


def sm64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def ref_indices(n, resamples, seed=0):
    out = []
    for k in range(resamples):
        base = sm64(seed ^ (k << 32))
        out.append([(sm64((base + i) & M64) >> 11) % n for i in range(n)])
    return out


def ref_percentile(sorted_xs, q):
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    if lo + 1 >= len(sorted_xs):
        return sorted_xs[lo]
    return sorted_xs[lo] + (pos - lo) * (sorted_xs[lo + 1] - sorted_xs[lo])


def ref_bootstrap(d, resamples):
    n = len(d)
    means = []
    for idx in ref_indices(n, resamples):
        s = 0.0
        for i in idx:
            s += d[i]
        means.append(s / n)
    means.sort()
    return ref_percentile(means, 0.025), ref_percentile(means, 0.975)


# ---------------------------------------------------------------------------------------------
# Database and config builders.


class Db:
    def __init__(self, path):
        self.path = path
        self.conn = sqlite3.connect(path)
        with open(SCHEMA, encoding="utf-8") as f:
            self.conn.executescript(f.read())
        self.count = 0
        self.run_id = self.add_run("models: []\n")

    def add_run(self, config_text):
        cur = self.conn.execute(
            "INSERT INTO runs (status, config_text, config_sha256, git_rev, kvbench_version, host,"
            " ranks) VALUES ('ok', ?, ?, 'abc123', '0.0-test', 'localhost', 1)",
            (config_text, hashlib.sha256(config_text.encode()).hexdigest()))
        self.conn.commit()
        return cur.lastrowid

    def unit(self, model, task, policy, spec, sample, metrics, options=None, question="in_prompt",
             seed=0, task_options="{}", status="ok"):
        """metrics: {name: (value or None, higher_is_better)}."""
        self.count += 1
        key = hashlib.sha256(f"unit {self.count}".encode()).hexdigest()
        opts = json.dumps(options or {}, sort_keys=True, separators=(",", ":"))
        tokens = int(spec) if spec.isdigit() else None
        self.conn.execute(
            "INSERT INTO units (unit_key, run_id, model, model_sha256, task, task_version,"
            " task_options, sample_id, policy, policy_options, kv_budget_spec, kv_budget, question,"
            " max_new_tokens, seed, status) VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, 16, ?, ?)",
            (key, self.run_id, model, hashlib.sha256(model.encode()).hexdigest(), task,
             task_options, sample, policy, opts, spec, tokens, question, seed, status))
        for name, (value, hib) in metrics.items():
            self.conn.execute("INSERT INTO metrics (unit_key, name, value, higher_is_better)"
                              " VALUES (?, ?, ?, ?)", (key, name, value, hib))
        return key

    def series(self, model, task, policy, spec, metric, hib, values, **kw):
        """One unit per value, samples s0, s1, ... in order."""
        for i, v in enumerate(values):
            self.unit(model, task, policy, spec, f"s{i}", {metric: (v, hib)}, **kw)

    def close(self):
        self.conn.commit()
        self.conn.close()


def run_script(args):
    """(exit code, stdout, stderr) of main(args), in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cf.main(args)
    return rc, out.getvalue(), err.getvalue()


class Base(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        self.db_path = os.path.join(self.dir, "results.db")
        self.db = Db(self.db_path)

    def tearDown(self):
        try:
            self.db.close()
        except sqlite3.ProgrammingError:
            pass
        self._tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))
        return path

    def rows(self, config_text):
        """Our rows for a findings config, keyed (id, model, kv_budget)."""
        self.db.close()
        cfg = self.write("config.yaml", config_text)
        rc, out, err = run_script(["--db", self.db_path, "--config", cfg, "--jsonl"])
        self.assertEqual(rc, 0, err)
        rows = {}
        for line in out.splitlines():
            r = json.loads(line)
            key = (r["id"], r["model"], r["kv_budget"])
            self.assertNotIn(key, rows)
            rows[key] = r
        return rows

    def assertRow(self, row, verdict, n=None, contrast=None, lo=None, hi=None, margin=None):
        self.assertEqual(row["verdict"], verdict, row)
        if n is not None:
            self.assertEqual(row["n"], n, row)
        for name, want in (("contrast", contrast), ("lo", lo), ("hi", hi), ("margin", margin)):
            if want is not None:
                self.assertAlmostEqual(row[name], want, places=4, msg=row)


def claim(cid, expect, compare, margin=None, against=None, task="niah", metric="recall",
          extra=""):
    lines = [f"    - id: {cid}", f"      claim: \"claim {cid}\"", f"      task: {task}",
             f"      metric: {metric}", f"      compare: {compare}"]
    if against is not None:
        lines.append(f"      against: {against}")
    lines.append(f"      expect: {expect}")
    if margin is not None:
        lines.append(f"      margin: {margin}")
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def findings(*claims, baselines=""):
    return "findings:\n  paper: \"Test paper\"\n" + baselines + "  claims:\n" + "".join(claims)


# ---------------------------------------------------------------------------------------------


class EqualDifferences(Base):
    """(a) d all equal, so lo = hi = mean, at the boundaries of each expectation."""

    def test_boundaries(self):
        db = self.db
        # recall, higher is better; three samples each.
        db.series("m1", "niah", "full", "", "recall", 1, [1.0, 1.0, 1.0])
        db.series("m1", "niah", "h2o", "128", "recall", 1, [1.0, 1.0, 1.0])       # d = 0
        db.series("m1", "niah", "snapkv", "128", "recall", 1, [0.75, 0.75, 0.75])  # d = -0.25
        rows = self.rows(findings(
            claim("eq-atleast", "at_least", "{policy: h2o, kv_budget: 128}", margin=0),
            claim("eq-better", "better", "{policy: h2o, kv_budget: 128}", margin=0),
            claim("eq-worse", "worse", "{policy: h2o, kv_budget: 128}", margin=0),
            claim("edge-atleast", "at_least", "{policy: snapkv, kv_budget: 128}", margin=0.25),
            claim("edge-worse", "worse", "{policy: snapkv, kv_budget: 128}", margin=0.25),
            claim("edge-better", "better", "{policy: full}", margin=0.25,
                  against="{policy: snapkv, kv_budget: 128}"),
            claim("in-better", "better", "{policy: full}", margin=0.125,
                  against="{policy: snapkv, kv_budget: 128}"),
            claim("in-worse", "worse", "{policy: snapkv, kv_budget: 128}", margin=0.125),
            claim("out-atleast", "at_least", "{policy: snapkv, kv_budget: 128}", margin=0.125)))
        self.assertEqual(len(rows), 9)
        # d = 1 - 1 = 0 on each of 3 samples: mean 0, lo = hi = 0, m = 0.
        #   at_least: lo = 0 >= -0            -> reproduced
        self.assertRow(rows[("eq-atleast", "m1", "128")], "reproduced", 3, 0, 0, 0, 0)
        #   better:   lo = 0 > 0 is false; hi = 0 <= 0  -> not reproduced
        self.assertRow(rows[("eq-better", "m1", "128")], "not reproduced", 3, 0, 0, 0, 0)
        #   worse:    hi = 0 < -0 is false; lo = 0 >= -0 -> not reproduced
        self.assertRow(rows[("eq-worse", "m1", "128")], "not reproduced", 3, 0, 0, 0, 0)
        # d = 0.75 - 1 = -0.25 each (mean -0.75/3 = -0.25 exactly), m = 0.25:
        #   at_least: lo = -0.25 >= -0.25      -> reproduced
        self.assertRow(rows[("edge-atleast", "m1", "128")], "reproduced", 3, -0.25, -0.25,
                       -0.25, 0.25)
        #   worse: hi = -0.25 < -0.25 false; lo = -0.25 >= -0.25 -> not reproduced
        self.assertRow(rows[("edge-worse", "m1", "128")], "not reproduced", 3, -0.25)
        # full against snapkv at 128: d = 1 - 0.75 = +0.25, m = 0.25; compare has no budget: "-".
        #   better: lo = 0.25 > 0.25 false; hi = 0.25 <= 0.25 -> not reproduced
        self.assertRow(rows[("edge-better", "m1", "-")], "not reproduced", 3, 0.25, 0.25, 0.25)
        #   m = 0.125: lo = 0.25 > 0.125       -> reproduced
        self.assertRow(rows[("in-better", "m1", "-")], "reproduced", 3, 0.25)
        # snapkv vs full, d = -0.25, m = 0.125:
        #   worse: hi = -0.25 < -0.125         -> reproduced
        self.assertRow(rows[("in-worse", "m1", "128")], "reproduced", 3, -0.25)
        #   at_least: lo = -0.25 >= -0.125 false; hi = -0.25 < -0.125 -> not reproduced
        self.assertRow(rows[("out-atleast", "m1", "128")], "not reproduced", 3, -0.25)


class Orientation(Base):
    """(b) a lower-is-better metric is negated; a percent margin is P% of |against's raw mean|."""

    def test_ppl(self):
        db = self.db
        db.series("m1", "perplexity", "full", "", "ppl", 0, [10.0, 20.0, 30.0])
        db.series("m1", "perplexity", "h2o", "0.2 ratio", "ppl", 0, [11.0, 21.0, 31.0])
        h2o = "{policy: h2o, kv_budget: {ratio: 0.2}}"
        rows = self.rows(findings(
            claim("pct10", "at_least", h2o, margin='"10%"', task="perplexity", metric="ppl"),
            claim("pct2", "at_least", h2o, margin='"2.5%"', task="perplexity", metric="ppl"),
            claim("worse", "worse", h2o, margin='"2.5%"', task="perplexity", metric="ppl"),
            claim("better", "better", "{policy: full}", margin='"2.5%"', against=h2o,
                  task="perplexity", metric="ppl")))
        # Oriented values are -ppl: d = (-11) - (-10) = -1 on every sample (h2o is worse);
        # mean -1, lo = hi = -1. (Without the negation d would be +1.)
        # 10%: m = 0.10 x |(10 + 20 + 30) / 3| = 0.10 x 20 = 2; at_least: lo = -1 >= -2.
        self.assertRow(rows[("pct10", "m1", "0.2 ratio")], "reproduced", 3, -1, -1, -1, 2.0)
        # 2.5%: m = 0.025 x 20 = 0.5; at_least: lo = -1 >= -0.5 false, hi = -1 < -0.5 -> not.
        self.assertRow(rows[("pct2", "m1", "0.2 ratio")], "not reproduced", 3, -1, -1, -1, 0.5)
        # worse with m = 0.5: hi = -1 < -0.5 -> reproduced.
        self.assertRow(rows[("worse", "m1", "0.2 ratio")], "reproduced", 3, -1, margin=0.5)
        # full against h2o at 0.2 ratio: d = (-10) - (-11) = +1; against is h2o, so
        # m = 0.025 x |(11 + 21 + 31) / 3| = 0.025 x 21 = 0.525; better: lo = 1 > 0.525.
        self.assertRow(rows[("better", "m1", "-")], "reproduced", 3, 1, 1, 1, 0.525)


class Instances(Base):
    """(c) several budgets combine; (g) a missing cell, a missing model and n < 2."""

    def test_two_budgets(self):
        db = self.db
        db.series("m1", "niah", "full", "", "recall", 1, [1.0, 1.0, 1.0])
        db.series("m1", "niah", "h2o", "128", "recall", 1, [1.0, 1.0, 1.0])    # d = 0
        db.series("m1", "niah", "h2o", "256", "recall", 1, [0.5, 0.5, 0.5])    # d = -0.5
        db.series("m1", "niah", "h2o", "0.2 ratio", "recall", 1, [1.0, 1.0, 1.0])
        db.series("m1", "niah", "h2o", "64", "recall", 1, [1.0])               # only s0
        # Left out of every cell: a failed unit and a NaN (NULL) metric of h2o at 256, and a
        # full unit with no pair. Were they counted, n at 256 would be 5, not 3.
        db.unit("m1", "niah", "h2o", "256", "s3", {"recall": (1.0, 1)}, status="error")
        db.unit("m1", "niah", "h2o", "256", "s4", {"recall": (None, 1)})
        db.unit("m1", "niah", "full", "", "s4", {"recall": (1.0, 1)})
        db.unit("m1", "niah", "full", "", "s3", {"recall": (1.0, 1)})
        rows = self.rows(findings(
            claim("two", "at_least", "{policy: h2o, kv_budget: [128, 256]}", margin=0),
            claim("missing", "at_least", "{policy: h2o, kv_budget: [128, 512]}", margin=0),
            claim("ratio", "at_least", "{policy: h2o, kv_budget: [{ratio: 0.2}, 128]}",
                  margin=0),
            claim("ghost", "at_least", "{policy: h2o, kv_budget: 128}", margin=0,
                  extra="      model: ghost"),
            claim("single", "at_least", "{policy: h2o, kv_budget: 64}", margin=0)))
        # two: 128: d = 0 -> lo = 0 >= 0 reproduced; 256: d = 0.5 - 1 = -0.5, hi = -0.5 < 0 ->
        # not reproduced; all: one instance not reproduced -> not reproduced.
        self.assertRow(rows[("two", "m1", "128")], "reproduced", 3, 0)
        self.assertRow(rows[("two", "m1", "256")], "not reproduced", 3, -0.5, -0.5, -0.5)
        self.assertEqual(rows[("two", "m1", "all")]["verdict"], "not reproduced")
        for f in ("n", "contrast", "lo", "hi", "margin"):
            self.assertEqual(rows[("two", "m1", "all")][f], "")
        # missing: 512 has no units -> inconclusive (n = 0); all: reproduced + inconclusive ->
        # inconclusive.
        self.assertRow(rows[("missing", "m1", "128")], "reproduced", 3)
        self.assertRow(rows[("missing", "m1", "512")], "inconclusive", 0)
        self.assertIn("no units", rows[("missing", "m1", "512")]["why"])
        self.assertEqual(rows[("missing", "m1", "all")]["verdict"], "inconclusive")
        # ratio: {ratio: 0.2} is the spec '0.2 ratio'; both d = 0 -> both and all reproduced.
        self.assertRow(rows[("ratio", "m1", "0.2 ratio")], "reproduced", 3, 0)
        self.assertRow(rows[("ratio", "m1", "all")], "reproduced")
        # ghost: a model with no units at all -> inconclusive, n = 0.
        self.assertRow(rows[("ghost", "ghost", "128")], "inconclusive", 0)
        # single: only s0 is in both cells -> n = 1 < 2 -> inconclusive (contrast 1 - 1 = 0).
        self.assertRow(rows[("single", "m1", "64")], "inconclusive", 1, 0)
        # two, missing, ratio: 2 budgets + "all" = 3 rows each; ghost, single: one budget, so
        # no "all" row: 3 + 3 + 3 + 1 + 1 = 11 rows, no others.
        self.assertEqual(len(rows), 11)


class Baselines(Base):
    """(d) a failing at_least baseline; (e) Wilson and bootstrap `above:` baselines."""

    def test_at_least(self):
        db = self.db
        for model, full in (("m1", [1.0, 0.0, 1.0, 0.0]), ("m2", [1.0, 1.0, 1.0, 1.0])):
            db.series(model, "niah", "full", "", "recall", 1, full)
            db.series(model, "niah", "h2o", "128", "recall", 1, full)           # d = 0
        body = claim("c", "at_least", "{policy: h2o, kv_budget: 128}", margin=0)
        rows = self.rows(findings(body, baselines=(
            "  baselines:\n    - {task: niah, metric: recall, at_least: 0.9}\n"
            "    - {task: perplexity, metric: ppl, at_least: 1000}\n")))
        # Models: every model with niah units, sorted: m1, m2.
        self.assertEqual(sorted(rows), [("c", "m1", "128"), ("c", "m2", "128")])
        # m1: full's mean recall (1 + 0 + 1 + 0) / 4 = 0.5 < 0.9 -> inconclusive: baseline,
        # although d = 0 would reproduce. (The perplexity baseline is on another task.)
        r = rows[("c", "m1", "128")]
        self.assertEqual(r["verdict"], "inconclusive")
        self.assertTrue(r["why"].startswith("baseline"), r["why"])
        # m2: mean 4 / 4 = 1 >= 0.9 -> the baseline holds; d = 0 -> reproduced.
        self.assertRow(rows[("c", "m2", "128")], "reproduced", 4, 0)

    def test_at_least_boundary(self):
        db = self.db
        db.series("m1", "niah", "full", "", "recall", 1, [1.0, 0.0, 1.0, 0.0])
        db.series("m1", "niah", "h2o", "128", "recall", 1, [1.0, 0.0, 1.0, 0.0])
        rows = self.rows(findings(
            claim("c", "at_least", "{policy: h2o, kv_budget: 128}", margin=0),
            baselines="  baselines:\n    - {task: niah, metric: recall, at_least: 0.5}\n"))
        # mean 0.5 >= 0.5 -> holds; d = 0 -> reproduced.
        self.assertRow(rows[("c", "m1", "128")], "reproduced", 4, 0)

    def test_wilson_by_hand(self):
        # 8 ones of 10: p = 0.8, z = 1.9599639845400536, z^2 = 3.8414588206941236,
        # denom = 1 + z^2/10 = 1.3841458820694124,
        # center = (0.8 + z^2/20) / denom = 0.9920729410347062 / 1.3841458820694124 = 0.71674016,
        # half = z/denom x sqrt(0.8 x 0.2/10 + z^2/400) = 1.41600969 x sqrt(0.02560365)
        #      = 1.41600969 x 0.16001140 = 0.22657769,
        # lo = 0.71674016 - 0.22657769 = 0.49016247; hi = 0.71674016 + 0.22657769 = 0.94331785.
        mean, lo, hi, how = cf.score_ci([1.0] * 8 + [0.0] * 2)
        self.assertEqual(how, "Wilson")
        self.assertAlmostEqual(mean, 0.8, places=12)
        self.assertAlmostEqual(lo, 0.49016247, places=7)
        self.assertAlmostEqual(hi, 0.94331785, places=7)
        # Not binary, all equal: the bootstrap collapses, lo = hi = mean = 0.5.
        self.assertEqual(cf.score_ci([0.5, 0.5, 0.5])[:3], (0.5, 0.5, 0.5))

    def test_above(self):
        db = self.db
        acc = [1.0] * 8 + [0.0] * 2
        db.series("m1", "mc", "full", "", "acc", 1, acc)
        db.series("m1", "mc", "h2o", "128", "acc", 1, acc)                       # d = 0
        db.series("m1", "qa", "full", "", "f1", 1, [0.5, 0.5, 0.5])
        db.series("m1", "qa", "h2o", "128", "f1", 1, [0.5, 0.5, 0.5])            # d = 0
        c_mc = claim("mc", "at_least", "{policy: h2o, kv_budget: 128}", margin=0, task="mc",
                     metric="acc")
        c_qa = claim("qa", "at_least", "{policy: h2o, kv_budget: 128}", margin=0, task="qa",
                     metric="f1")
        # Wilson low end 0.49016 (above) > 0.49 -> holds; 0.5 x 3 non-binary: lo = 0.5 > 0.49.
        rows = self.rows(findings(c_mc, c_qa, baselines=(
            "  baselines:\n    - {task: mc, metric: acc, above: 0.49}\n"
            "    - {task: qa, metric: f1, above: 0.49}\n")))
        self.assertRow(rows[("mc", "m1", "128")], "reproduced", 10, 0)
        self.assertRow(rows[("qa", "m1", "128")], "reproduced", 3, 0)
        # 0.49016 > 0.491 is false -> baseline fails (the mean 0.8 alone would clear it);
        # 0.5 > 0.5 is false -> fails.
        self.db = Db(os.path.join(self.dir, "unused.db"))  # self.rows closes the first one
        rows = self.rows(findings(c_mc, c_qa, baselines=(
            "  baselines:\n    - {task: mc, metric: acc, above: 0.491}\n"
            "    - {task: qa, metric: f1, above: 0.5}\n")))
        for cid in ("mc", "qa"):
            r = rows[(cid, "m1", "128")]
            self.assertEqual(r["verdict"], "inconclusive", r)
            self.assertTrue(r["why"].startswith("baseline"), r["why"])


    def test_baseline_order(self):
        # The order in which full's values enter a non-binary `above:` bootstrap matters (the
        # resamples depend on it); the contract says sample order. --baseline-order picks it: the
        # contrast's sample order (default) or unit_key order. Both intervals must be the bootstrap of the
        # values in that order (the baseline fails at above 0.99, so its why prints them).
        values = [round(0.05 + 0.9 * ((i * 7) % 13) / 13 + 0.001 * i, 4) for i in range(13)]
        keys = {}
        for i, v in enumerate(values):
            keys[f"s{i}"] = self.db.unit("m1", "qa", "full", "", f"s{i}", {"f1": (v, 1)})
            self.db.unit("m1", "qa", "h2o", "128", f"s{i}", {"f1": (v, 1)})
        by_key = [values[int(s[1:])] for s, _ in sorted(keys.items(), key=lambda kv: kv[1])]
        # Sample order compares sample_id as text: s0, s1, s10, s11, s12, s2, ..., s9.
        by_sample = [values[int(s[1:])] for s in sorted(keys)]
        want = {"sample": cf.paired_bootstrap(by_sample),
                "unit_key": cf.paired_bootstrap(by_key)}
        self.assertNotEqual(want["sample"][1:], want["unit_key"][1:])  # the order matters here
        self.db.close()
        cfg = self.write("config.yaml", findings(
            claim("qa", "at_least", "{policy: h2o, kv_budget: 128}", margin=0, task="qa",
                  metric="f1"),
            baselines="  baselines:\n    - {task: qa, metric: f1, above: 0.99}\n"))
        for order, (mean, lo, hi) in want.items():
            rc, out, err = run_script(["--db", self.db_path, "--config", cfg, "--jsonl",
                                       "--baseline-order", order])
            self.assertEqual(rc, 0, err)
            why = json.loads(out.splitlines()[0])["why"]
            self.assertTrue(why.startswith("baseline"), why)
            self.assertIn(f"[{lo:.4f}, {hi:.4f}]", why)


class Options(Base):
    """(f) options match as a subset (values as text); two matching option sets are ambiguous."""

    def test_subset_and_ambiguous(self):
        db = self.db
        db.series("m1", "niah", "full", "", "recall", 1, [1.0, 1.0, 1.0])
        db.series("m1", "niah", "h2o", "128", "recall", 1, [1.0, 1.0, 1.0],
                  options={"heavy_fraction": "0.5", "window": "8"})              # d = 0
        db.series("m1", "niah", "h2o", "128", "recall", 1, [0.5, 0.5, 0.5],
                  options={"heavy_fraction": "0.25", "window": "8"})             # d = -0.5
        rows = self.rows(findings(
            claim("half", "at_least", "{policy: h2o, options: {heavy_fraction: 0.5}, "
                  "kv_budget: 128}", margin=0),
            claim("quarter", "at_least", "{policy: h2o, options: {heavy_fraction: 0.25}, "
                  "kv_budget: 128}", margin=0),
            claim("both", "at_least", "{policy: h2o, options: {window: 8}, kv_budget: 128}",
                  margin=0),
            claim("none", "at_least", "{policy: h2o, kv_budget: 128}", margin=0),
            claim("exact", "at_least", "{policy: h2o, options: {heavy_fraction: 0.5, window: 8},"
                  " kv_budget: 128}", margin=0),
            claim("nomatch", "at_least", "{policy: h2o, options: {window: 16}, kv_budget: 128}",
                  margin=0)))
        # heavy_fraction 0.5 matches only the first set: d = 0 -> reproduced.
        self.assertRow(rows[("half", "m1", "128")], "reproduced", 3, 0)
        self.assertRow(rows[("exact", "m1", "128")], "reproduced", 3, 0)
        # 0.25: the second set, d = -0.5, hi = -0.5 < 0 -> not reproduced.
        self.assertRow(rows[("quarter", "m1", "128")], "not reproduced", 3, -0.5)
        # window 8 (or no options) matches both sets -> ambiguous -> inconclusive.
        for cid in ("both", "none"):
            r = rows[(cid, "m1", "128")]
            self.assertEqual(r["verdict"], "inconclusive", r)
            self.assertIn("ambiguous", r["why"])
        # window 16 matches nothing -> no units -> inconclusive.
        self.assertRow(rows[("nomatch", "m1", "128")], "inconclusive", 0)


class Contrast(Base):
    def test_weighted_cells(self):
        db = self.db
        db.series("m1", "niah", "ada_snapkv", "128", "recall", 1, [0.75, 0.75])
        db.series("m1", "niah", "snapkv", "128", "recall", 1, [0.5, 0.5])
        db.series("m1", "niah", "ada_snapkv", "1024", "recall", 1, [1.0, 1.0])
        db.series("m1", "niah", "snapkv", "1024", "recall", 1, [1.0, 1.0])
        text = findings(
            "    - id: gain\n      claim: gain shrinks\n      task: niah\n      metric: recall\n"
            "      contrast:\n"
            "        - {weight: 1, policy: ada_snapkv, kv_budget: 128}\n"
            "        - {weight: -1, policy: snapkv, kv_budget: 128}\n"
            "        - {weight: -1, policy: ada_snapkv, kv_budget: 1024}\n"
            "        - {weight: 1, policy: snapkv, kv_budget: 1024}\n"
            "      expect: better\n      margin: 0.2\n")
        rows = self.rows(text)
        # d = 0.75 - 0.5 - 1 + 1 = 0.25 on both samples; better: lo = 0.25 > 0.2 -> reproduced.
        self.assertEqual(list(rows), [("gain", "m1", "-")])
        self.assertRow(rows[("gain", "m1", "-")], "reproduced", 2, 0.25, 0.25, 0.25, 0.2)


class Bootstrap(unittest.TestCase):
    """(h) the splitmix64 resampling against the pure-Python reference above."""

    def test_indices_n3(self):
        # seed 0, n = 3: base_k = splitmix64(0 ^ (k << 32)); draw i: (splitmix64(base_k + i)
        # >> 11) mod 3. Computed by the pure-Python sm64 above (and pinned here):
        want = [[0, 1, 1], [0, 2, 1], [1, 1, 2], [0, 2, 0]]
        self.assertEqual(ref_indices(3, 4), want)
        self.assertEqual(cf.resample_indices(3, 4, 0).tolist(), want)

    def test_percentiles_four_resamples(self):
        # d = [1, 2, 4] with those index triples: resample means
        #   k0: (1 + 2 + 2)/3 = 5/3, k1: (1 + 4 + 2)/3 = 7/3, k2: (2 + 2 + 4)/3 = 8/3,
        #   k3: (1 + 4 + 1)/3 = 2; sorted 5/3, 2, 7/3, 8/3.
        # lo at pos 0.025 x 3 = 0.075: 5/3 + 0.075 x (2 - 5/3) = 1.6916667
        # hi at pos 0.975 x 3 = 2.925: 7/3 + 0.925 x (8/3 - 7/3) = 2.6416667; mean 7/3.
        mean, lo, hi = cf.paired_bootstrap([1.0, 2.0, 4.0], resamples=4, seed=0)
        self.assertAlmostEqual(mean, 7 / 3, places=12)
        self.assertAlmostEqual(lo, 1.6916667, places=6)
        self.assertAlmostEqual(hi, 2.6416667, places=6)

    def test_full_bootstrap_matches_reference(self):
        # 10,000 resamples of a 20-value d: the pure-Python reference must match to rounding.
        d = [((i * 37) % 11) / 4.0 - 1.0 for i in range(20)]
        mean, lo, hi = cf.paired_bootstrap(d)
        rlo, rhi = ref_bootstrap(d, 10000)
        self.assertAlmostEqual(mean, sum(d) / 20, places=12)
        self.assertAlmostEqual(lo, rlo, places=10)
        self.assertAlmostEqual(hi, rhi, places=10)
        self.assertLess(lo, mean)
        self.assertLess(mean, hi)

    def test_degenerate(self):
        self.assertEqual(cf.paired_bootstrap([0.3]), (0.3, 0.3, 0.3))          # n < 2
        self.assertEqual(cf.paired_bootstrap([0.5, 0.5]), (0.5, 0.5, 0.5))     # all equal


class Cli(Base):
    """(i) --kvbench-jsonl exit codes, and where the findings come from."""

    CONFIG = findings(claim("one", "at_least", "{policy: h2o, kv_budget: [128, 256]}",
                            margin=0.125))

    def setUp(self):
        super().setUp()
        self.db.series("m1", "niah", "full", "", "recall", 1, [1.0, 1.0, 1.0])
        self.db.series("m1", "niah", "h2o", "128", "recall", 1, [1.0, 1.0, 1.0])   # d = 0
        self.db.series("m1", "niah", "h2o", "256", "recall", 1, [0.5, 0.5, 0.5])   # d = -0.5
        self.db.close()
        self.cfg = self.write("config.yaml", self.CONFIG)

    def kvbench_rows(self, **change):
        # m = 0.125. 128: d = 0, lo = 0 >= -0.125 -> reproduced. 256: d = -0.5,
        # hi = -0.5 < -0.125 -> not reproduced. all: not reproduced.
        common = {"paper": "Test paper", "model": "m1", "expect": "at_least",
                  "claim": "claim one", "id": "one"}
        rows = [dict(common, kv_budget="128", n=3, contrast=0.0, lo=0.0, hi=0.0, margin=0.125,
                     verdict="reproduced", why="lo >= -m"),
                dict(common, kv_budget="256", n=3, contrast=-0.5, lo=-0.5, hi=-0.5,
                     margin=0.125, verdict="not reproduced", why="hi < -m"),
                dict(common, kv_budget="all", n="", contrast="", lo="", hi="", margin="",
                     verdict="not reproduced", why="256 not reproduced")]
        for budget, fields in change.items():
            for r in rows:
                if r["kv_budget"] == budget:
                    r.update(fields)
        return rows

    def jsonl(self, name, rows):
        return self.write(name, "".join(json.dumps(r) + "\n" for r in rows))

    def cli(self, *args):
        p = subprocess.run([sys.executable, SCRIPT, "--db", self.db_path, *args],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def test_agree_and_disagree(self):
        good = self.jsonl("good.jsonl", self.kvbench_rows())
        rc, out, err = self.cli("--config", self.cfg, "--kvbench-jsonl", good)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("agree: 3 rows", out)
        # Printing to 4 decimals: 0.00004 off is within 2e-4.
        near = self.jsonl("near.jsonl", self.kvbench_rows(**{"256": {"lo": -0.50004}}))
        self.assertEqual(self.cli("--config", self.cfg, "--kvbench-jsonl", near)[0], 0)
        # A different verdict on the 256 row.
        bad = self.jsonl("bad.jsonl", self.kvbench_rows(**{"256": {"verdict": "inconclusive"}}))
        rc, out, err = self.cli("--config", self.cfg, "--kvbench-jsonl", bad)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("DISAGREE", out)
        self.assertIn("verdict", out)

    def test_other_disagreements(self):
        cases = {
            "hi off by 1e-3": self.kvbench_rows(**{"128": {"hi": 0.001}}),
            "n differs": self.kvbench_rows(**{"128": {"n": 4}}),
            "row missing": self.kvbench_rows()[:2],
            "extra row": self.kvbench_rows() + [dict(self.kvbench_rows()[0], kv_budget="512")],
            "baseline why without a baseline": self.kvbench_rows(
                **{"128": {"why": "baseline: full fails"}}),
        }
        for name, rows in cases.items():
            path = self.jsonl("case.jsonl", rows)
            rc, out, _ = run_script(["--db", self.db_path, "--config", self.cfg,
                                     "--kvbench-jsonl", path])
            self.assertEqual(rc, 1, f"{name}: {out}")

    def test_findings_from_runs(self):
        conn = sqlite3.connect(self.db_path)
        db = Db.__new__(Db)
        db.conn = conn
        # Oldest to newest: the findings (with an include appended as the provenance text
        # does), a config without findings, text that is not YAML. The newest with findings wins.
        db.add_run("models: [a.gguf]\n" + self.CONFIG +
                   "# --- include: common/models.yaml\nmodels: [b.gguf]\n")
        db.add_run("models: [a.gguf]\n")
        db.add_run("models: [a.gguf\nfindings: {\n")
        conn.close()
        good = self.jsonl("good.jsonl", self.kvbench_rows())
        rc, out, err = run_script(["--db", self.db_path, "--kvbench-jsonl", good])
        self.assertEqual(rc, 0, out + err)
        self.assertIn("agree: 3 rows", out)

    def test_errors(self):
        rc, _, err = run_script(["--db", os.path.join(self.dir, "nope.db")])
        self.assertEqual(rc, 2)
        self.assertIn("no such database file", err)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "nope.db")))
        rc, _, err = run_script(["--db", self.db_path, "--config", os.path.join(self.dir, "x")])
        self.assertEqual((rc, "no such file" in err), (2, True), err)
        bad = self.write("bad.yaml", "findings:\n  paper: [x\n")
        rc, _, err = run_script(["--db", self.db_path, "--config", bad])
        self.assertEqual(rc, 2)
        self.assertIn("invalid YAML", err)
        self.assertRegex(err, r"bad\.yaml:\d+:\d+")
        none = self.write("none.yaml", "models: []\n")
        rc, _, err = run_script(["--db", self.db_path, "--config", none])
        self.assertEqual((rc, "no findings" in err), (2, True), err)
        # The database's only run has no findings.
        rc, _, err = run_script(["--db", self.db_path])
        self.assertEqual(rc, 2)
        self.assertIn("findings", err)
        rc, _, err = run_script(["--db", self.db_path, "--config", self.cfg, "--kvbench-jsonl",
                                 os.path.join(self.dir, "missing.jsonl")])
        self.assertEqual(rc, 2)

    def test_read_only(self):
        # The script never writes: the file's bytes are unchanged after a run.
        with open(self.db_path, "rb") as f:
            before = f.read()
        self.assertEqual(run_script(["--db", self.db_path, "--config", self.cfg])[0], 0)
        with open(self.db_path, "rb") as f:
            self.assertEqual(f.read(), before)


if __name__ == "__main__":
    unittest.main()
