#!/usr/bin/env python3
"""Runs the quickstart's study (configs/quickstart.yaml: NIAH on the KJV haystack, 1K/2K/4K tokens
x depths 0/25/50/75/100, SmolLM2-135M-Instruct) through NVIDIA kvpress on the CPU and through
`kvbench sweep`, with the same prompts token for token, and compares predictions, scores and wall
time.

Peer check, not a test (kvpress 0.5.5 on transformers 4.57.1 and torch 2.9.1 in .venv-kvpress;
`bash scripts/ref_env.sh kvpress`). Policies: full, and snapkv, streaming_llm, knorm at the
quickstart's budgets 128 and 256, with kvbench's options set to kvpress's defaults
(scripts/kvpress_common.py PAIRS: snapkv window=64 pool_kernel=5 pooling=avg, streaming_llm
sinks=4, knorm as it is). The script writes that matrix as a sweep config (a copy of the
quickstart's with these policies) and:
- kvbench: `kvbench sweep CONFIG --db FRESH.db --threads T` (the quickstart's defaults: shared
  prefill, prefix reuse, decode_batch auto); predictions, scores and each unit's prompt_sha256
  (SHA-256 of the prompt's token ids as int32 little-endian, workers/model_session.cc) from the
  database; each sample's prompt text from `kvbench show`, split into kvbench's parts (chat
  prefix, context, question, chat suffix + answer prefix, each tokenized alone as
  workers/unit_run.cc build_prompt does).
- kvpress: one Python process for the whole matrix (model load included, as a user runs it;
  also reported without it): the GGUF dequantized to float32 by transformers, T torch threads;
  per sample the parts tokenized by the Hugging Face tokenizer, whose ids must hash to the
  unit's prompt_sha256 (the proof of "token for token"); per policy the whole prompt prefilled
  under the press (kvbench's `question: in_prompt`, oneshot), with a compression ratio r chosen
  so that kvpress keeps exactly the budget (compute_n_kept(n, r) == kv_budget, checked), then
  greedy decoding as kvpress's pipeline does (explicit positions) for the task's 32 new tokens,
  stopping on kvbench's end ids (eos plus the end-of-turn control tokens); the end token is not
  part of the prediction.
- Scores: NIAH recall, ported from tasks/metrics.cc niah_recall (checked against kvbench's
  stored score of every kvbench prediction).
- Timing: kvbench (A) and kvpress (B) alternate, A B A B ..., --pairs times on the same threads;
  medians and their ratio.
Every differing sample is listed with both predictions and where kvpress's greedy choice was
near a tie (its logit margin at the first differing token).

Measured table: bench/README.md "kvbench against kvpress on the quickstart's study (CPU)".

  $(bash scripts/ref_env.sh kvpress) scripts/compare_kvpress_sweep.py --kvbench build/kvbench \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --pairs 5 --out out/kvpress_sweep
  (--quick: 1K tokens at depth 50 only, for a smoke run)
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

POLICIES = ["full", "snapkv", "streaming_llm", "knorm"]
BUDGETS = [128, 256]
# The quickstart's matrix (configs/quickstart.yaml) with kvpress's policies; MODEL and TASK_OPTIONS
# are filled in.
CONFIG = """# Written by scripts/compare_kvpress_sweep.py: the quickstart's study, kvpress's policies.
models:
  - name: smollm2-135m
    path: {model}
tasks:
  - name: niah
    options: {{context_lengths: {lengths}, depths: {depths}, haystack: kjv}}
policies:
{policies}
kv_budget: {budgets}
question: [in_prompt]
seed: [0]
decode_batch: auto
"""
# kvbench's end-of-generation texts (workers/tokenizer/tokenizer.cc is_end_of_generation_text).
END_TEXTS = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
             "<|endoftext|>", "<EOT>", "_<EOT>"}
TOP = 5  # logits kept per decode step, to tell a near-tie from a real difference


# ---- shared by both processes ------------------------------------------------------------------

def ids_sha256(ids):
    """workers/model_session.cc token_ids_sha256: SHA-256 of the ids as int32 little-endian."""
    h = hashlib.sha256()
    for i in ids:
        h.update(int(i).to_bytes(4, "little", signed=True))
    return h.hexdigest()


def prompt_ids(tok, parts):
    """kvbench's build_prompt: each part tokenized alone (special tokens parsed in the chat frame,
    no BOS added: SmolLM2's template has none), then concatenated."""
    ids = []
    for p in parts:
        ids += tok(p, add_special_tokens=False)["input_ids"]
    return ids


def end_ids(tok):
    """kvbench's end ids: eos, then the special tokens whose text ends a turn."""
    ids = set()
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    for i, t in tok.added_tokens_decoder.items():
        if t.special and t.content in END_TEXTS:
            ids.add(i)
    return sorted(ids)


# ---- the kvpress process ------------------------------------------------------------------------

def kvpress_worker(args):
    """Runs the matrix in args.plan through kvpress; writes predictions and times to args.result.
    Timed from before `import torch` (the process's start is in the parent's wall time)."""
    t_start = time.perf_counter()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    from transformers import DynamicCache

    from kvpress.utils import compute_n_kept
    from kvpress_common import kvpress_version, load_model, load_tokenizer, pair_of

    torch.set_num_threads(args.threads)
    with open(args.plan) as f:
        plan = json.load(f)
    model = load_model(args.model, attn=args.attn)
    tok = load_tokenizer(args.model)
    stops = set(end_ids(tok))
    t_loaded = time.perf_counter()
    rows = []
    for sample in plan["samples"]:
        ids = prompt_ids(tok, sample["parts"])
        n = len(ids)
        input_ids = torch.tensor([ids])
        for policy, budget in plan["units"]:
            t0 = time.perf_counter()
            ratio = None
            if policy == "full":
                press = None
            else:
                # r with int(n * (1 - r)) == budget: the middle of the interval, so float rounding
                # cannot move it (checked, with kvpress's own count).
                ratio = 1.0 - (budget + 0.5) / n
                kept = compute_n_kept(n, ratio)
                assert kept == budget and int(n * (1 - ratio)) == budget, (n, budget, ratio, kept)
                press = pair_of(policy)[1](ratio)
            steps, gen = [], []
            with torch.inference_mode():
                cache = DynamicCache()
                if press is None:
                    out = model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                else:
                    with press(model):
                        out = model(input_ids, past_key_values=cache, use_cache=True,
                                    logits_to_keep=1)
                    held = cache.get_seq_length()
                    assert held == budget, f"kvpress kept {held} tokens, not {budget}"
                pos = n
                for _ in range(plan["max_new_tokens"]):
                    logits = out.logits[0, -1].float()
                    top = torch.topk(logits, TOP)
                    steps.append([top.indices.tolist(), [float(v) for v in top.values]])
                    nxt = int(top.indices[0])
                    if nxt in stops:
                        break
                    gen.append(nxt)
                    if len(gen) == plan["max_new_tokens"]:
                        break  # the last token is not fed back (kvbench's rule)
                    out = model(torch.tensor([[nxt]]), past_key_values=cache,
                                position_ids=torch.tensor([[pos]]), use_cache=True)
                    pos += 1
            rows.append({
                "sample_id": sample["sample_id"], "policy": policy, "kv_budget": budget,
                "prompt_tokens": n, "prompt_sha256": ids_sha256(ids), "compression_ratio": ratio,
                "generated_ids": gen, "generated_tokens": len(gen),
                "prediction": tok.decode(gen, skip_special_tokens=True,
                                         clean_up_tokenization_spaces=False),
                "steps": steps, "ms": (time.perf_counter() - t0) * 1e3,
            })
    t_end = time.perf_counter()
    with open(args.result, "w") as f:
        json.dump({"rows": rows, "load_s": t_loaded - t_start, "matrix_s": t_end - t_loaded,
                   "in_process_s": t_end - t_start, "torch_threads": torch.get_num_threads(),
                   "versions": {"kvpress": kvpress_version(), "torch": torch.__version__,
                                "transformers": __import__("transformers").__version__}}, f)


# ---- the scorer ---------------------------------------------------------------------------------

STOP_WORDS = {"a", "an", "the", "and", "or", "of", "to", "in", "on", "at", "for", "from", "by",
              "with", "as", "is", "are", "was", "were", "be", "it", "its", "this", "that"}


def rouge_tokens(text):
    """tasks/metrics.cc rouge_score_tokens: Python's lower(), then runs of [a-z0-9]."""
    out, cur = [], []
    for c in text.lower():
        if "a" <= c <= "z" or "0" <= c <= "9":
            cur.append(c)
        elif cur:
            out.append("".join(cur))
            cur = []
    if cur:
        out.append("".join(cur))
    return out


def niah_recall(prediction, answer):
    """tasks/metrics.cc niah_recall: the share of the answer's content words in the prediction."""
    expected = rouge_tokens(answer)
    content = {w for w in expected if w not in STOP_WORDS} or set(expected)
    if not content:
        return 0.0
    present = set(rouge_tokens(prediction))
    return sum(w in present for w in content) / len(content)


# ---- the kvbench side ---------------------------------------------------------------------------

def kvbench_query(kvbench, db, sql):
    out = subprocess.run([kvbench, "query", "--db", db, "-o", "jsonl", sql], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def kvbench_units(kvbench, db):
    rows = kvbench_query(kvbench, db, (
        "SELECT u.unit_key, u.sample_id, u.policy, u.policy_options, u.kv_budget, u.status, "
        "u.max_new_tokens, m.prompt_sha256, m.prompt_tokens, m.generated_tokens, p.prediction, "
        "p.references_json, (SELECT value FROM metrics x WHERE x.unit_key = u.unit_key AND "
        "x.name = 'recall') AS recall FROM units u JOIN measurements m USING (unit_key) "
        "JOIN predictions p USING (unit_key) ORDER BY u.sample_id, u.policy, u.kv_budget"))
    for r in rows:
        if r["status"] != "ok":
            sys.exit(f"kvbench unit {r['unit_key']} ended {r['status']}")
        r["kv_budget"] = None if r["kv_budget"] in ("", None) else int(r["kv_budget"])
    return rows


def shown_prompt(kvbench, config, db, unit_key):
    """The prompt text `kvbench show` prints (it checked the ids' hash against the database)."""
    out = subprocess.run([kvbench, "show", "--config", config, "--db", db, unit_key], check=True,
                         capture_output=True, text=True).stdout
    assert "# equals the stored prompt_sha256" in out, out[:2000]
    head, sep, text = out.partition("\n\n")  # the header's '#' lines, a blank line, the prompt
    assert sep and all(line.startswith("#") for line in head.splitlines()), out[:2000]
    assert text.endswith("\n")
    return text[:-1]


def prompt_parts(tok, text, question, answer_prefix):
    """Splits a shown NIAH prompt into build_prompt's parts: the chat frame's prefix (the
    template rendered around an empty user message, as workers' chat_frame), the context, the
    question, the frame's suffix and the answer prefix."""
    mark = "\x00"
    frame = tok.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                    add_generation_prompt=True)
    prefix, suffix = frame.split(mark)
    tail = question + suffix + answer_prefix
    assert text.startswith(prefix) and text.endswith(tail), "not the chat frame kvbench used"
    context = text[len(prefix):len(text) - len(tail)]
    return [prefix, context, question, suffix, answer_prefix]


# ---- comparison ---------------------------------------------------------------------------------

def first_difference(tok, ours_text, theirs):
    """Where kvpress's greedy tokens leave kvbench's prediction (re-tokenized: kvbench stores the
    text): the step, kvpress's choice and margin, and kvbench's token's logit when in kvpress's
    top 5."""
    ours = tok(ours_text, add_special_tokens=False)["input_ids"]
    gen = theirs["generated_ids"]
    k = 0
    while k < len(ours) and k < len(gen) and ours[k] == gen[k]:
        k += 1
    if k >= len(theirs["steps"]):
        return f"kvbench's text re-tokenizes differently from kvpress's ids at token {k}"
    top_ids, top_logits = theirs["steps"][k]
    what = (f"first differing token {k}: kvpress {tok.decode([top_ids[0]])!r} "
            f"(logit {top_logits[0]:.4f}, margin to its 2nd {top_logits[0] - top_logits[1]:.4f})")
    if k < len(ours):
        theirs_tok = ours[k]
        if theirs_tok in top_ids:
            j = top_ids.index(theirs_tok)
            what += (f", kvbench {tok.decode([theirs_tok])!r} is kvpress's #{j + 1} "
                     f"({top_logits[0] - top_logits[j]:.4f} below)")
        else:
            what += f", kvbench {tok.decode([theirs_tok])!r} not in kvpress's top {TOP}"
    else:
        what += ", kvbench's prediction ends there"
        ends = [j for j, i in enumerate(top_ids) if i in set(end_ids(tok))]
        if ends:
            j = ends[0]
            what += (f" (its end token {tok.decode([top_ids[j]])!r} is kvpress's #{j + 1}, "
                     f"{top_logits[0] - top_logits[j]:.4f} below)")
    return what


def compare(tok, units, kv_rows, answer):
    """Per (policy, budget): agreement rows; the differing samples."""
    theirs = {(r["sample_id"], r["policy"], r["kv_budget"]): r for r in kv_rows}
    groups, diffs = {}, []
    for u in units:
        key = (u["sample_id"], u["policy"], u["kv_budget"])
        t = theirs[key]
        assert t["prompt_sha256"] == u["prompt_sha256"], f"{key}: the prompts differ"
        ours_score = niah_recall(u["prediction"], answer)
        assert abs(ours_score - u["recall"]) < 1e-12, (
            f"{key}: the Python recall {ours_score} is not kvbench's {u['recall']}")
        their_score = niah_recall(t["prediction"], answer)
        g = groups.setdefault((u["policy"], u["kv_budget"]), {
            "samples": 0, "equal_predictions": 0, "equal_scores": 0, "kvbench": [], "kvpress": []})
        g["samples"] += 1
        same_text = u["prediction"] == t["prediction"]
        g["equal_predictions"] += same_text
        g["equal_scores"] += ours_score == their_score
        g["kvbench"].append(ours_score)
        g["kvpress"].append(their_score)
        if not same_text:
            diffs.append({"sample_id": u["sample_id"], "policy": u["policy"],
                          "kv_budget": u["kv_budget"], "kvbench": u["prediction"],
                          "kvpress": t["prediction"], "kvbench_recall": ours_score,
                          "kvpress_recall": their_score,
                          "why": first_difference(tok, u["prediction"], t)})
    return groups, diffs


# ---- the driver ---------------------------------------------------------------------------------

def machine():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    model_name = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    isa = [x for x in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                       "amx_tile") if x in flags]
    return {"cpu": model_name, "cores": os.cpu_count(), "isa": isa, "host": platform.node()}


def write_config(path, args):
    lengths, depths = ([1024], [50]) if args.quick else ([1024, 2048, 4096], [0, 25, 50, 75, 100])
    from kvpress_common import pair_of
    lines = []
    for p in POLICIES:
        if p == "full":
            lines.append("  - full")
            continue
        opts = dict(o.split("=", 1) for o in pair_of(p)[3])
        lines.append("  - " + (json.dumps({"name": p, "options": opts}) if opts else p))
    with open(path, "w") as f:
        f.write(CONFIG.format(model=json.dumps(os.path.abspath(args.model)),
                              lengths=json.dumps(lengths), depths=json.dumps(depths),
                              policies="\n".join(lines), budgets=json.dumps(BUDGETS)))


def run_kvbench(args, config, db):
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    r = subprocess.run([args.kvbench, "sweep", config, "--db", db, "--threads",
                        str(args.threads)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"kvbench sweep failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return {"wall_s": wall, "load1": load}


def run_kvpress(args, plan_path, result_path):
    load = os.getloadavg()[0]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--plan", plan_path,
                    "--result", result_path, "--model", args.model, "--threads",
                    str(args.threads), "--attn", args.attn], check=True, env=env)
    wall = time.perf_counter() - t0
    with open(result_path) as f:
        res = json.load(f)
    return {"wall_s": wall, "load1": load, "load_s": res["load_s"], "matrix_s": res["matrix_s"]}, res


def fmt_table(groups):
    lines = ["| policy | kv_budget | samples | equal predictions | equal scores | mean recall "
             "kvbench | mean recall kvpress |", "|---|---:|---:|---:|---:|---:|---:|"]
    for p in POLICIES:
        for b in ([None] if p == "full" else BUDGETS):
            g = groups.get((p, b))
            if not g:
                continue
            lines.append(f"| {p} | {b if b else '-'} | {g['samples']} | "
                         f"{g['equal_predictions']} | {g['equal_scores']} | "
                         f"{statistics.mean(g['kvbench']):.4f} | "
                         f"{statistics.mean(g['kvpress']):.4f} |")
    tot = {k: sum(g[k] for g in groups.values())
           for k in ("samples", "equal_predictions", "equal_scores")}
    allk = [x for g in groups.values() for x in g["kvbench"]]
    allp = [x for g in groups.values() for x in g["kvpress"]]
    lines.append(f"| all | | {tot['samples']} | {tot['equal_predictions']} | "
                 f"{tot['equal_scores']} | {statistics.mean(allk):.4f} | "
                 f"{statistics.mean(allp):.4f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvbench", default="build/kvbench")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="kvbench --threads and torch.set_num_threads (default: the cores)")
    ap.add_argument("--pairs", type=int, default=5, help="timed A B pairs (kvbench, kvpress)")
    ap.add_argument("--quick", action="store_true", help="1K tokens at depth 50 only (smoke run)")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers' attention for kvpress (sdpa: its fastest on the CPU; "
                         "none of these presses reads the attention weights)")
    ap.add_argument("--out", default="", help="write OUT.json and OUT.md (results, table)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kvpress_worker(args)
        return
    if args.pairs < 1:
        sys.exit("--pairs must be at least 1")

    from kvpress_common import kvpress_version, load_tokenizer
    import torch
    import transformers

    tok = load_tokenizer(args.model)
    started = datetime.datetime.now(datetime.timezone.utc)
    info = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "threads": args.threads,
            "machine": machine(), "attn": args.attn, "quick": args.quick, "pairs": args.pairs,
            "versions": {"kvpress": kvpress_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__,
                         "kvbench": subprocess.run([args.kvbench, "--help"], capture_output=True,
                                                   text=True).stdout.strip().splitlines()[-1]}}
    with tempfile.TemporaryDirectory(prefix="kvpress_sweep_") as tmp:
        config = os.path.join(tmp, "study.yaml")
        write_config(config, args)
        plan_path = os.path.join(tmp, "plan.json")
        a_runs, b_runs, units, first_b = [], [], None, None
        for i in range(args.pairs):
            db = os.path.join(tmp, f"kvbench{i}.db")
            a = run_kvbench(args, config, db)
            a_runs.append(a)
            print(f"pair {i + 1}/{args.pairs}: kvbench {a['wall_s']:.1f} s (load {a['load1']:.2f})",
                  file=sys.stderr, flush=True)
            got = kvbench_units(args.kvbench, db)
            if units is None:
                units = got
                plan = build_plan(args, tok, config, db, units)
                with open(plan_path, "w") as f:
                    json.dump(plan, f)
            else:  # every run gives the same predictions (kvbench is deterministic)
                assert [(u["unit_key"], u["prediction"]) for u in got] == [
                    (u["unit_key"], u["prediction"]) for u in units], "kvbench's runs differ"
            b, res = run_kvpress(args, plan_path, os.path.join(tmp, f"kvpress{i}.json"))
            b_runs.append(b)
            print(f"pair {i + 1}/{args.pairs}: kvpress {b['wall_s']:.1f} s (model load "
                  f"{b['load_s']:.1f} s; load {b['load1']:.2f})", file=sys.stderr, flush=True)
            if first_b is None:
                first_b = res
            else:
                assert [r["prediction"] for r in res["rows"]] == [
                    r["prediction"] for r in first_b["rows"]], "kvpress's runs differ"
        if args.out:  # the raw results first, in case the comparison below fails
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out + ".raw.json", "w") as f:
                json.dump({"info": info, "a_runs": a_runs, "b_runs": b_runs, "units": units,
                           "kvpress": first_b}, f)
        answer = json.loads(units[0]["references_json"])[0]
        groups, diffs = compare(tok, units, first_b["rows"], answer)

    med = {k: statistics.median(r[k] for r in b_runs) for k in ("wall_s", "load_s", "matrix_s")}
    med_a = statistics.median(r["wall_s"] for r in a_runs)
    timing = {"kvbench_wall_s": [r["wall_s"] for r in a_runs],
              "kvpress_wall_s": [r["wall_s"] for r in b_runs],
              "kvpress_load_s": [r["load_s"] for r in b_runs],
              "kvpress_matrix_s": [r["matrix_s"] for r in b_runs],
              "load1_before": [x for ab in zip(a_runs, b_runs) for x in (ab[0]["load1"],
                                                                         ab[1]["load1"])],
              "median_kvbench_s": med_a, "median_kvpress_s": med["wall_s"],
              "median_kvpress_no_load_s": med["matrix_s"],
              "ratio": med["wall_s"] / med_a, "ratio_no_load": med["matrix_s"] / med_a}
    n_units = len(units)
    n_samples = len({u["sample_id"] for u in units})
    table = fmt_table(groups)
    lines = [f"{info['date']}; {info['machine']['cpu']}, {info['machine']['cores']} cores, ISA "
             f"{' '.join(info['machine']['isa'])}; {args.threads} threads; kvpress "
             f"{info['versions']['kvpress']}, torch {info['versions']['torch']}, transformers "
             f"{info['versions']['transformers']} (attention {args.attn}); "
             f"{info['versions']['kvbench']}",
             f"matrix: {n_samples} samples x {len(POLICIES) * 2 - 1} policy/budget = {n_units} "
             f"units; every prompt's token ids hash to its unit's prompt_sha256", "", table, "",
             f"Wall time, {args.pairs} pair(s) A B alternating (load average before each: "
             f"{', '.join(f'{x:.2f}' for x in timing['load1_before'])}):",
             "", "| | runs (s) | median (s) |", "|---|---|---:|",
             f"| kvbench sweep (fresh database, model load included) | "
             f"{', '.join(f'{x:.1f}' for x in timing['kvbench_wall_s'])} | {med_a:.1f} |",
             f"| kvpress, one process (model load included) | "
             f"{', '.join(f'{x:.1f}' for x in timing['kvpress_wall_s'])} | {med['wall_s']:.1f} |",
             f"| kvpress, model load excluded | "
             f"{', '.join(f'{x:.1f}' for x in timing['kvpress_matrix_s'])} | "
             f"{med['matrix_s']:.1f} |", "",
             f"kvpress / kvbench: **{timing['ratio']:.1f}x** (model load excluded from kvpress: "
             f"{timing['ratio_no_load']:.1f}x)", ""]
    if diffs:
        lines.append("Differing predictions:")
        lines.append("")
        for d in diffs:
            lines.append(f"- {d['sample_id']} {d['policy']} {d['kv_budget'] or '-'}: kvbench "
                         f"{d['kvbench']!r} (recall {d['kvbench_recall']:.4f}); kvpress "
                         f"{d['kvpress']!r} (recall {d['kvpress_recall']:.4f}); {d['why']}")
    md = "\n".join(lines)
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".md", "w") as f:
            f.write(md + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump({"info": info, "timing": timing, "differing": diffs,
                       "groups": {f"{p} {b or '-'}": g for (p, b), g in groups.items()},
                       "kvbench_units": units,
                       "kvpress_rows": [{k: v for k, v in r.items() if k != "steps"}
                                        for r in first_b["rows"]]}, f, indent=1)


def build_plan(args, tok, config, db, units):
    """Each sample's prompt parts (from `kvbench show` of one of its units), checked: every unit
    of the sample ran the same prompt, and the Hugging Face ids hash to it."""
    by_sample = {}
    for u in units:
        by_sample.setdefault(u["sample_id"], []).append(u)
    samples = []
    # NIAH's default needle (tasks/niah.cc): the question brings its own paragraph break.
    question = "\n\nWhat is the best thing to do in San Francisco?"
    answer_prefix = "The best thing to do in San Francisco is"
    for sid, us in sorted(by_sample.items()):
        shas = {u["prompt_sha256"] for u in us}
        assert len(shas) == 1, f"{sid}: its units ran different prompts"
        text = shown_prompt(args.kvbench, config, db, us[0]["unit_key"])
        parts = prompt_parts(tok, text, question, answer_prefix)
        ids = prompt_ids(tok, parts)
        assert ids_sha256(ids) == us[0]["prompt_sha256"] and len(ids) == us[0]["prompt_tokens"], (
            f"{sid}: the Hugging Face tokenizer's ids ({len(ids)}) do not hash to kvbench's prompt")
        samples.append({"sample_id": sid, "parts": parts, "prompt_tokens": len(ids)})
    max_new = {u["max_new_tokens"] for u in units}
    assert len(max_new) == 1
    plan_units = [(p, None) if p == "full" else (p, b) for p in POLICIES
                  for b in ([None] if p == "full" else BUDGETS)]
    return {"samples": samples, "units": plan_units, "max_new_tokens": max_new.pop()}


if __name__ == "__main__":
    main()
