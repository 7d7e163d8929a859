#!/usr/bin/env python3
"""Independent re-computation of `kvbench query --db DB findings` (configs/README.md, "Findings").

Usage:
  python3 scripts/check_findings.py --db DB [--config CONFIG.yaml] [--kvbench-jsonl FILE] [--jsonl]

Reads the `findings:` of a config (--config, or else the newest `runs` row whose config_text
parses as YAML and has a `findings:` key), gives every (claim, model, instance) a verdict from the
database (opened read-only) and prints a table (--jsonl: one JSON object per row, in kvbench's
keys). With --kvbench-jsonl FILE it compares with kvbench's rows (`kvbench query --db DB findings
-o jsonl`): the same (id, model, kv_budget) rows, equal verdicts and n, contrast/lo/hi/margin
within 2e-4; exit 1 listing every disagreement, else 0 with "agree: N rows". Exit 2: usage or
input errors (missing file, bad YAML, no findings).

Written from the contract only (not from kvbench's C++), so that the two check each other.
Standard library + PyYAML + numpy.
"""
import argparse
import json
import math
import os
import re
import sqlite3
import statistics
import sys
import urllib.parse

import numpy as np
import yaml

RESAMPLES = 10000
TOLERANCE = 2e-4
VERDICTS = ("reproduced", "not reproduced", "inconclusive")
EXPECTS = ("at_least", "better", "worse")
INCLUDE_MARK = re.compile(r"^# --- include: .*$", re.M)
# The order of full's values in a non-binary `above:` baseline's bootstrap (the resamples, and so
# the interval, depend on it): "sample" = the contrast's sample order (task_options, sample_id,
# question, seed), as the contract says; "unit_key" = by unit key, for comparison only.
BASELINE_ORDER = ["sample"]


class InputError(Exception):
    """A usage or input problem: printed as `check_findings: error: ...`, exit 2."""


# ---------------------------------------------------------------------------------------------
# Statistics: splitmix64 counter-based bootstrap, percentiles, Wilson.

_M64 = (1 << 64) - 1
_U = np.uint64


def splitmix64(x):
    """splitmix64 on a numpy uint64 array (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + _U(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
        return x ^ (x >> _U(31))


def _resample_bases(resamples, seed):
    k = np.arange(resamples, dtype=np.uint64)
    return splitmix64(_U(seed & _M64) ^ (k << _U(32)))


def _draw(bases, i, n):
    """Indices of draw i (0-based) of every resample: (splitmix64(base_k + i) >> 11) mod n."""
    with np.errstate(over="ignore"):
        u = splitmix64(bases + _U(i))
    return ((u >> _U(11)) % _U(n)).astype(np.int64)


def resample_indices(n, resamples=RESAMPLES, seed=0):
    """The (resamples, n) index matrix; for small cases and tests (the bootstrap streams it)."""
    bases = _resample_bases(resamples, seed)
    out = np.empty((resamples, n), dtype=np.int64)
    for i in range(n):
        out[:, i] = _draw(bases, i, n)
    return out


def paired_bootstrap(d, resamples=RESAMPLES, seed=0):
    """(mean, lo, hi) of d: the 95% percentile-bootstrap interval of the mean of d."""
    d = [float(x) for x in d]
    n = len(d)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = sum(d) / n  # summed in sample order
    if n < 2 or all(x == d[0] for x in d):
        return (mean, mean, mean)
    arr = np.asarray(d, dtype=np.float64)
    bases = _resample_bases(resamples, seed)
    acc = np.zeros(resamples, dtype=np.float64)
    for i in range(n):  # accumulate in draw order
        acc += arr[_draw(bases, i, n)]
    means = acc / n
    lo, hi = np.percentile(means, [2.5, 97.5])  # numpy's default 'linear' method
    return (mean, float(lo), float(hi))


def wilson(values):
    """(mean, lo, hi): Wilson score interval at 95% of 0/1 values (n >= 1), clipped to [0, 1]."""
    n = len(values)
    p = sum(values) / n
    z = statistics.NormalDist().inv_cdf(0.975)
    z2 = z * z
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (p, max(0.0, center - half), min(1.0, center + half))


def score_ci(values):
    """(mean, lo, hi, method): Wilson where every value is exactly 0 or 1, else the bootstrap."""
    if values and all(v == 0.0 or v == 1.0 for v in values):
        return wilson(values) + ("Wilson",)
    return paired_bootstrap(values, RESAMPLES, 0) + ("bootstrap",)


def verdict_of(expect, lo, hi, m):
    if expect == "at_least":
        if lo >= -m:
            return "reproduced"
        if hi < -m:
            return "not reproduced"
    elif expect == "better":
        if lo > m:
            return "reproduced"
        if hi <= m:
            return "not reproduced"
    elif expect == "worse":
        if hi < -m:
            return "reproduced"
        if lo >= -m:
            return "not reproduced"
    return "inconclusive"


def combine(verdicts):
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    if any(v == "not reproduced" for v in verdicts):
        return "not reproduced"
    return "inconclusive"


# ---------------------------------------------------------------------------------------------
# Config: YAML (every scalar kept as its text: option values compare as text), includes, budgets.


def _parse_yaml(text, where):
    try:
        return yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        pos = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{where}{pos}: invalid YAML: {problem}") from None


def _merge(base, over):
    """Include merging: mappings merge key by key (recursively), anything else is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    return over


def load_config_file(path, depth=0):
    if depth > 256:
        raise InputError(f"{path}: includes nest too deeply")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        doc = _parse_yaml(f.read(), path)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InputError(f"{path}: the config is not a YAML mapping")
    inc = doc.get("include")
    if inc is None:
        return doc
    merged = {}
    for name in ([inc] if isinstance(inc, str) else inc):
        merged = _merge(merged, load_config_file(os.path.join(os.path.dirname(path), name),
                                                 depth + 1))
    return _merge(merged, doc)


def config_from_text(text):
    """A runs.config_text: the config, then each include after a `# --- include: PATH` line.
    Fragments merge in text order, the config over them all."""
    parts = INCLUDE_MARK.split(text)
    docs = []
    for i, part in enumerate(parts):
        doc = yaml.load(part, Loader=yaml.BaseLoader)  # YAMLError propagates: caller skips
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise yaml.YAMLError("not a mapping")
        docs.append(doc)
    merged = {}
    for doc in docs[1:]:
        merged = _merge(merged, doc)
    return _merge(merged, docs[0])


def findings_from_db(conn):
    rows = conn.execute("SELECT run_id, config_text FROM runs ORDER BY run_id DESC").fetchall()
    if not rows:
        raise InputError("the database has no runs (give --config)")
    skipped = 0
    for run_id, text in rows:
        try:
            doc = config_from_text(text or "")
        except yaml.YAMLError:
            skipped += 1
            continue
        if "findings" in doc:
            return doc["findings"], f"run {run_id}"
    extra = f" ({skipped} with config text that is not valid YAML)" if skipped else ""
    raise InputError(f"no run's config has `findings:` among {len(rows)} runs{extra}")


_RANGE = re.compile(r"^(\d+k?)-(\d+k?)(?:([*+])(\d+))?$")


def _int_k(s):
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)


def _budget_tokens(text, where):
    """Token budgets of one scalar: an integer, `a-b*f`, `a-b+s`, `a-b`, `k` suffixes, commas."""
    out = []
    for item in str(text).split(","):
        item = item.strip().replace(" ", "")
        try:
            m = _RANGE.match(item)
            if m:
                a, b = _int_k(m.group(1)), _int_k(m.group(2))
                op, step = m.group(3), int(m.group(4)) if m.group(4) else 1
                if a > b or (op == "*" and step < 2) or step < 1:
                    raise ValueError
                v = a
                while v <= b:
                    out.append(v)
                    v = v * step if op == "*" else v + step
            else:
                out.append(_int_k(item))
        except ValueError:
            raise InputError(f"{where}: not a budget: {text!r}") from None
    for v in out:
        if v <= 0:
            raise InputError(f"{where}: a budget must be positive: {text!r}")
    return out


def budget_specs(value, where):
    """The kv_budget_spec texts a YAML budget (or list of budgets) stands for, in order."""
    items = value if isinstance(value, list) else [value]
    specs = []
    for it in items:
        if isinstance(it, dict):
            if len(it) != 1 or next(iter(it)) not in ("ratio", "compression_ratio"):
                raise InputError(f"{where}: a budget mapping is {{ratio: r}} or "
                                 f"{{compression_ratio: c}}, got {it!r}")
            key, val = next(iter(it.items()))
            try:
                r = float(val)
            except (TypeError, ValueError):
                raise InputError(f"{where}: {key}: not a number: {val!r}") from None
            specs.append("%g %s" % (r, key))
        elif isinstance(it, str):
            specs.extend(str(v) for v in _budget_tokens(it, where))
        else:
            raise InputError(f"{where}: not a budget: {it!r}")
    seen, out = set(), []
    for s in specs:  # a budget listed twice is one instance
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def _text(v, where, required=True):
    if v is None:
        if required:
            raise InputError(f"{where}: required")
        return None
    if not isinstance(v, str):
        raise InputError(f"{where}: expected a scalar, got {v!r}")
    return v


def _number(v, where):
    try:
        x = float(_text(v, where))
    except ValueError:
        raise InputError(f"{where}: not a number: {v!r}") from None
    if not math.isfinite(x):
        raise InputError(f"{where}: not a finite number: {v!r}")
    return x


def _options(v, where):
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(f"{where}: options must be a mapping")
    out = {}
    for k, val in v.items():
        if isinstance(val, list):
            out[k] = [_text(x, f"{where}.{k}") for x in val]
        else:
            out[k] = [_text(val, f"{where}.{k}")]
    return out


class Cell:
    def __init__(self, policy, options, spec):
        self.policy, self.options, self.spec = policy, options, spec  # spec '' = no budget

    def label(self):
        opts = ",".join(f"{k}={'|'.join(v)}" for k, v in sorted(self.options.items()))
        return self.policy + (f" {{{opts}}}" if opts else "") + (
            f" at {self.spec}" if self.spec else "")


def _cell_mapping(v, where):
    if not isinstance(v, dict):
        raise InputError(f"{where}: expected a mapping")
    policy = _text(v.get("policy"), f"{where}.policy")
    return policy, _options(v.get("options"), f"{where}.options"), v.get("kv_budget")


def parse_findings(f):
    if not isinstance(f, dict):
        raise InputError("findings: expected a mapping")
    paper = _text(f.get("paper"), "findings.paper")
    baselines = []
    for i, b in enumerate(f.get("baselines") or []):
        w = f"findings.baselines[{i}]"
        if not isinstance(b, dict):
            raise InputError(f"{w}: expected a mapping")
        ent = {"task": _text(b.get("task"), f"{w}.task"),
               "metric": _text(b.get("metric"), f"{w}.metric")}
        if ("above" in b) == ("at_least" in b):
            raise InputError(f"{w}: give exactly one of above and at_least")
        key = "above" if "above" in b else "at_least"
        ent[key] = _number(b[key], f"{w}.{key}")
        baselines.append(ent)
    claims = f.get("claims")
    if not isinstance(claims, list) or not claims:
        raise InputError("findings.claims: required, a non-empty list")
    out, ids = [], set()
    for i, c in enumerate(claims):
        w = f"findings.claims[{i}]"
        if not isinstance(c, dict):
            raise InputError(f"{w}: expected a mapping")
        cid = _text(c.get("id"), f"{w}.id")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", cid):
            raise InputError(f"{w}.id: letters, digits, - and _ only: {cid!r}")
        if cid in ids:
            raise InputError(f"{w}.id: {cid!r} is not unique")
        ids.add(cid)
        cl = {"id": cid, "claim": _text(c.get("claim"), f"{w}.claim"),
              "task": _text(c.get("task"), f"{w}.task"),
              "metric": _text(c.get("metric"), f"{w}.metric"),
              "model": _text(c.get("model"), f"{w}.model", required=False),
              "question": _text(c.get("question"), f"{w}.question", required=False),
              "expect": _text(c.get("expect"), f"{w}.expect")}
        if cl["expect"] not in EXPECTS:
            raise InputError(f"{w}.expect: one of {', '.join(EXPECTS)}, got {cl['expect']!r}")
        margin = c.get("margin")
        cl["margin_pct"], cl["margin"] = None, 0.0
        if margin is not None:
            t = _text(margin, f"{w}.margin").strip()
            if t.endswith("%"):
                cl["margin_pct"] = _number(t[:-1].strip(), f"{w}.margin")
                if cl["margin_pct"] < 0:
                    raise InputError(f"{w}.margin: must be >= 0")
            else:
                cl["margin"] = _number(t, f"{w}.margin")
                if cl["margin"] < 0:
                    raise InputError(f"{w}.margin: must be >= 0")
        if ("compare" in c) == ("contrast" in c):
            raise InputError(f"{w}: give exactly one of compare and contrast")
        if "contrast" in c:
            if "against" in c:
                raise InputError(f"{w}: against goes with compare, not contrast")
            if cl["margin_pct"] is not None:
                raise InputError(f"{w}.margin: a contrast takes a number, not a percent")
            items = c["contrast"]
            if not isinstance(items, list) or not items:
                raise InputError(f"{w}.contrast: a non-empty list")
            terms = []
            for j, t in enumerate(items):
                ww = f"{w}.contrast[{j}]"
                policy, opts, kb = _cell_mapping(t, ww)
                weight = _number(t.get("weight"), f"{ww}.weight")
                specs = [""] if kb is None else budget_specs(kb, f"{ww}.kv_budget")
                if len(specs) != 1:
                    raise InputError(f"{ww}.kv_budget: one budget")
                terms.append((weight, Cell(policy, opts, specs[0])))
            cl["instances"] = [("-", terms)]
            cl["against_index"] = None
        else:
            policy, opts, kb = _cell_mapping(c["compare"], f"{w}.compare")
            ag = c.get("against", "full")
            if isinstance(ag, str):
                ag_policy, ag_opts, ag_kb = ag, {}, None
            else:
                ag_policy, ag_opts, ag_kb = _cell_mapping(ag, f"{w}.against")
            if kb is None:
                comp = [("-", "")]
            else:
                comp = [(s, s) for s in budget_specs(kb, f"{w}.compare.kv_budget")]
            instances = []
            for label, spec in comp:
                if ag_kb is not None:
                    ag_specs = budget_specs(ag_kb, f"{w}.against.kv_budget")
                    if len(ag_specs) != 1:
                        raise InputError(f"{w}.against.kv_budget: one budget")
                    ag_spec = ag_specs[0]
                else:
                    ag_spec = "" if ag_policy == "full" else spec
                instances.append((label, [(1.0, Cell(policy, opts, spec)),
                                          (-1.0, Cell(ag_policy, ag_opts, ag_spec))]))
            cl["instances"] = instances
            cl["against_index"] = 1
        out.append(cl)
    return paper, baselines, out


# ---------------------------------------------------------------------------------------------
# Database.


def open_db(path):
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such database file")
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute("SELECT count(*) FROM units").fetchone()
        conn.execute("SELECT count(*) FROM metrics").fetchone()
    except sqlite3.Error as e:
        raise InputError(f"{path}: not a kvbench results database: {e}") from None
    return conn


class Data:
    def __init__(self, conn):
        self.conn = conn
        self._rows = {}

    def models_of_task(self, task):
        rows = self.conn.execute("SELECT DISTINCT model FROM units WHERE task = ?", (task,))
        return sorted((r[0] for r in rows), key=lambda s: s.encode("utf-8", "surrogatepass"))

    def rows(self, model, task, metric):
        """The ok units of (model, task) with a non-NULL `metric`: dicts, in unit_key order."""
        key = (model, task, metric)
        if key not in self._rows:
            cur = self.conn.execute(
                "SELECT u.unit_key, u.policy, u.policy_options, u.kv_budget_spec, u.task_options,"
                " u.sample_id, u.question, u.seed, m.value, m.higher_is_better"
                " FROM units u JOIN metrics m ON m.unit_key = u.unit_key"
                " WHERE u.status = 'ok' AND u.model = ? AND u.task = ? AND m.name = ?"
                " AND m.value IS NOT NULL ORDER BY u.unit_key", (model, task, metric))
            out = []
            for (uk, policy, popts, spec, topts, sid, q, seed, value, hib) in cur:
                try:
                    opts = json.loads(popts) if popts else {}
                except ValueError:
                    opts = {}
                opts = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in opts.items()}
                out.append({"unit_key": uk, "policy": policy, "options": opts,
                            "options_text": popts, "spec": spec,
                            "sample": (topts, sid, q, int(seed)),
                            "value": float(value), "hib": int(hib)})
            self._rows[key] = out
        return self._rows[key]


def sample_order(s):
    enc = lambda t: t.encode("utf-8", "surrogatepass")  # byte order
    return (enc(s[0]), enc(s[1]), enc(s[2]), s[3])


def match_cell(rows, cell, question):
    """('ok', {sample: [(oriented, raw)]}) or ('ambiguous', [option texts])."""
    hits = []
    for r in rows:
        if r["policy"] != cell.policy or r["spec"] != cell.spec:
            continue
        if question is not None and r["sample"][2] != question:
            continue
        if all(k in r["options"] and r["options"][k] in vals for k, vals in cell.options.items()):
            hits.append(r)
    sets = sorted({r["options_text"] for r in hits})
    if len(sets) > 1:
        return "ambiguous", sets
    by = {}
    for r in hits:
        v = r["value"]
        by.setdefault(r["sample"], []).append((v if r["hib"] else -v, v))
    return "ok", by


def fmt(x):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def baseline_check(data, baselines, model, task):
    """None when every baseline of the task holds, else why (starting 'baseline')."""
    for b in baselines:
        if b["task"] != task:
            continue
        order = ((lambda r: r["unit_key"]) if BASELINE_ORDER[0] == "unit_key" else
                 (lambda r: (sample_order(r["sample"]), r["unit_key"])))
        vals = sorted((r for r in data.rows(model, task, b["metric"]) if r["policy"] == "full"),
                      key=order)
        vals = [r["value"] for r in vals]
        if not vals:
            return f"baseline: no ok units of full with {b['metric']} on {task}"
        if "at_least" in b:
            mean = sum(vals) / len(vals)
            if not mean >= b["at_least"]:
                return (f"baseline: full's mean {b['metric']} on {task} is {mean:.4f} "
                        f"(n={len(vals)}), below at_least {b['at_least']:g}")
        else:
            mean, lo, hi, how = score_ci(vals)
            if not lo > b["above"]:
                return (f"baseline: full's {b['metric']} on {task} is {mean:.4f} "
                        f"[{lo:.4f}, {hi:.4f}] ({how}, n={len(vals)}), whose low end is not "
                        f"above {b['above']:g}")
    return None


def evaluate_instance(data, claim, model, terms, baseline_why):
    """One row's fields: n, contrast, lo, hi, margin, verdict, why."""
    row = {"n": 0, "contrast": None, "lo": None, "hi": None,
           "margin": claim["margin"] if claim["margin_pct"] is None else None}
    rows = data.rows(model, claim["task"], claim["metric"])
    reasons = []
    cells = []
    for _, cell in terms:
        kind, got = match_cell(rows, cell, claim["question"])
        if kind == "ambiguous":
            reasons.append(f"ambiguous: options of {cell.label()} match {len(got)} option sets: "
                           + "; ".join(got))
        elif not got:
            reasons.append(f"no units of {cell.label()}")
        cells.append(got if kind == "ok" else {})
    duplicates = []
    for (_, cell), c in zip(terms, cells):
        for s_key, vals in sorted(c.items(), key=lambda kv: sample_order(kv[0])):
            if len(vals) > 1:
                duplicates.append((cell.label(), s_key))
    if duplicates:
        label, s_key = duplicates[0]
        reasons.append(f"{label} has two units of one sample {s_key} (the contract: inconclusive)")
    if not reasons:
        common = set(cells[0])
        for c in cells[1:]:
            common &= set(c)
        samples = sorted(common, key=sample_order)
        d, against_raw = [], []
        for s in samples:
            total = 0.0
            for j, ((w, cell), c) in enumerate(zip(terms, cells)):
                vals = c[s]
                oriented = sum(v[0] for v in vals) / len(vals)
                raw = sum(v[1] for v in vals) / len(vals)
                total += w * oriented
                if j == claim["against_index"]:
                    against_raw.append(raw)
            d.append(total)
        n = len(d)
        row["n"] = n
        if n >= 1:
            row["contrast"], row["lo"], row["hi"] = paired_bootstrap(d)
            if claim["margin_pct"] is not None:
                row["margin"] = claim["margin_pct"] / 100 * abs(sum(against_raw) / n)
        if n < 2:
            reasons.append(f"n = {n} paired samples (need 2)")
    if baseline_why is not None:
        row["verdict"], row["why"] = "inconclusive", baseline_why
    elif reasons:
        row["verdict"], row["why"] = "inconclusive", "; ".join(reasons)
    else:
        m = row["margin"]
        row["verdict"] = verdict_of(claim["expect"], row["lo"], row["hi"], m)
        row["why"] = (f"{claim['expect']}: mean {row['contrast']:.4f} "
                      f"[{row['lo']:.4f}, {row['hi']:.4f}], margin {m:.4f}, n={row['n']}")
    row["baseline_failed"] = baseline_why is not None
    return row


def evaluate(data, paper, baselines, claims):
    out = []
    for claim in claims:
        models = [claim["model"]] if claim["model"] is not None else \
            data.models_of_task(claim["task"])
        for model in models:
            bwhy = baseline_check(data, baselines, model, claim["task"])
            inst_rows = []
            for label, terms in claim["instances"]:
                r = evaluate_instance(data, claim, model, terms, bwhy)
                r.update({"kv_budget": label})
                inst_rows.append(r)
            if len(inst_rows) > 1:
                verdicts = [r["verdict"] for r in inst_rows]
                inst_rows.append({"kv_budget": "all", "n": None, "contrast": None, "lo": None,
                                  "hi": None, "margin": None, "verdict": combine(verdicts),
                                  "baseline_failed": bwhy is not None,
                                  "why": ", ".join(f"{r['kv_budget']}: {r['verdict']}"
                                                   for r in inst_rows)})
            for r in inst_rows:
                r.update({"paper": paper, "id": claim["id"], "model": model,
                          "expect": claim["expect"], "claim": claim["claim"]})
                out.append(r)
    return out


def as_json(r):
    def num(x):
        return "" if x is None or math.isnan(x) else round(x, 4)
    return {"paper": r["paper"], "id": r["id"], "model": r["model"], "kv_budget": r["kv_budget"],
            "n": "" if r["n"] is None else r["n"], "contrast": num(r["contrast"]),
            "lo": num(r["lo"]), "hi": num(r["hi"]), "margin": num(r["margin"]),
            "expect": r["expect"], "verdict": r["verdict"], "why": r["why"], "claim": r["claim"]}


def print_table(rows, out):
    cols = ["id", "model", "kv_budget", "n", "contrast", "lo", "hi", "margin", "expect",
            "verdict", "why"]
    cells = [[str(r["id"]), str(r["model"]), r["kv_budget"],
              "" if r["n"] is None else str(r["n"]), fmt(r["contrast"]), fmt(r["lo"]),
              fmt(r["hi"]), fmt(r["margin"]), r["expect"], r["verdict"], r["why"]]
             for r in rows]
    widths = [max([len(c)] + [len(x[i]) for x in cells]) for i, c in enumerate(cols)]
    for line in [cols] + cells:
        print("  ".join(x.ljust(w) for x, w in zip(line[:-1], widths)) + "  " + line[-1],
              file=out)


# ---------------------------------------------------------------------------------------------
# Comparison with kvbench's jsonl.


def _as_num(v):
    if v is None or v == "":
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(v)
    return float(v)


def compare(mine, path):
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    theirs, problems, notes = {}, [], []
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                problems.append(f"{path}:{ln}: not JSON: {e}")
                continue
            if not isinstance(obj, dict) or not all(k in obj for k in ("id", "model",
                                                                       "kv_budget")):
                problems.append(f"{path}:{ln}: a row without id, model and kv_budget")
                continue
            key = (str(obj["id"]), str(obj["model"]), str(obj["kv_budget"]))
            if key in theirs:
                problems.append(f"{path}:{ln}: row {key} appears twice")
            theirs[key] = obj
    ours = {(r["id"], r["model"], r["kv_budget"]): r for r in mine}
    for key in sorted(set(ours) - set(theirs)):
        problems.append(f"{key}: missing from kvbench's rows (ours: {ours[key]['verdict']})")
    for key in sorted(set(theirs) - set(ours)):
        problems.append(f"{key}: kvbench has a row we do not (theirs: "
                        f"{theirs[key].get('verdict')})")
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key], theirs[key]
        both_inconclusive = a["verdict"] == "inconclusive" and b.get("verdict") == "inconclusive"
        if b.get("verdict") not in VERDICTS:
            problems.append(f"{key}: kvbench's verdict {b.get('verdict')!r} is not one of "
                            f"{VERDICTS}")
        elif a["verdict"] != b["verdict"]:
            problems.append(f"{key}: verdict ours {a['verdict']!r} ({a['why']}) vs kvbench "
                            f"{b['verdict']!r} ({b.get('why')})")
        for field in ("paper", "expect", "claim"):
            if field in b and b[field] != a[field]:
                problems.append(f"{key}: {field} ours {a[field]!r} vs kvbench {b[field]!r}")
        # n: an integer; "" only on the combined row ("" and 0 both mean no pairs)
        bn = b.get("n", "")
        an = "" if a["n"] is None else a["n"]
        if isinstance(bn, bool) or not (isinstance(bn, int) or bn == ""):
            problems.append(f"{key}: n {bn!r} is not an integer")
        elif an == bn or {an, bn} <= {"", 0}:
            pass
        elif "" in (an, bn) and both_inconclusive:
            notes.append(f"{key}: n ours {an!r} vs kvbench {bn!r} (both inconclusive)")
        else:
            problems.append(f"{key}: n ours {an!r} vs kvbench {bn!r}")
        for field in ("contrast", "lo", "hi", "margin"):
            x = a[field]
            x = None if x is None or math.isnan(x) else x
            try:
                y = _as_num(b.get(field, ""))
            except (TypeError, ValueError):
                problems.append(f"{key}: {field} {b.get(field)!r} is not a number")
                continue
            if x is None and y is None:
                continue
            if x is None or y is None:
                msg = f"{key}: {field} ours {fmt(x)!r} vs kvbench {b.get(field)!r}"
                (notes if both_inconclusive else problems).append(msg)
            elif abs(x - y) > TOLERANCE:
                problems.append(f"{key}: {field} ours {x:.6f} vs kvbench {y:.4f} "
                                f"(|diff| {abs(x - y):.2e} > {TOLERANCE:g})")
        if key[2] != "all":
            their_baseline = str(b.get("why", "")).startswith("baseline")
            if a["baseline_failed"] != their_baseline:
                problems.append(f"{key}: baseline ours {'fails' if a['baseline_failed'] else 'holds'}"
                                f" ({a['why']}) but kvbench's why is {b.get('why')!r}")
    return problems, notes, len(ours)


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, help="kvbench results database (read-only)")
    ap.add_argument("--config", help="config YAML with findings: (default: the newest run's)")
    ap.add_argument("--kvbench-jsonl", help="kvbench query findings -o jsonl output to check")
    ap.add_argument("--jsonl", action="store_true", help="print our rows as jsonl")
    ap.add_argument("--baseline-order", choices=("sample", "unit_key"), default="sample",
                    help="order of full's values in a non-binary above: baseline's bootstrap "
                         "(default: the contrast's sample order, as the contract says)")
    args = ap.parse_args(argv)
    BASELINE_ORDER[0] = args.baseline_order
    try:
        conn = open_db(args.db)
        try:
            data = Data(conn)
            if args.config:
                doc = load_config_file(args.config)
                if "findings" not in doc:
                    raise InputError(f"{args.config}: no findings: in the config")
                findings, source = doc["findings"], args.config
            else:
                findings, source = findings_from_db(conn)
            paper, baselines, claims = parse_findings(findings)
            rows = evaluate(data, paper, baselines, claims)
        finally:
            conn.close()
        if args.jsonl:
            for r in rows:
                print(json.dumps(as_json(r), ensure_ascii=False))
        else:
            print(f"findings of {paper} (from {source}): {len(rows)} rows")
            print_table(rows, sys.stdout)
        if args.kvbench_jsonl:
            problems, notes, count = compare(rows, args.kvbench_jsonl)
            for n in notes:
                print(f"note: {n}")
            if problems:
                for p in problems:
                    print(f"DISAGREE: {p}")
                print(f"disagree: {len(problems)} problem(s) over {count} rows")
                return 1
            print(f"agree: {count} rows")
        return 0
    except InputError as e:
        print(f"check_findings: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
