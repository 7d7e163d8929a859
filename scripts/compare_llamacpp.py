#!/usr/bin/env python3
"""Compares kvbench with llama.cpp (through llama-cpp-python) on the same GGUF file, in one run:
tokenization, perplexity, greedy agreement and CPU speed.

Peer check, not a test: llama-cpp-python (pinned in scripts/llamacpp_env.sh, which builds
llama.cpp from source into .venv-llamacpp) loads the same GGUF file as kvbench. kvbench runs as
a subprocess (`kvbench generate --show-ids` prints the prompt's and the generated token ids to
stderr, `--timings` the prefill/decode times; `kvbench eval --task perplexity -o jsonl` the NLL
sum). llama.cpp always evaluates the ids kvbench produced, so sections 2-4 compare the engines,
not the tokenizers.

1. Tokenization: 22 texts (WikiText-2 test lines, excerpts of the NIAH Paul Graham essays, and
   texts with unicode, digits, whitespace runs, code, a URL and chat markers as plain text):
   `Llama.tokenize(text, add_bos=True, special=False)` (BOS only where the GGUF's
   tokenizer.ggml.add_bos_token says so, kvbench's rule too; SmolLM2 says false) vs kvbench's
   prompt ids (`--prompt-file`, the same bytes as `--prompt`).
2. Perplexity: the first 1,024 kvbench tokens of WikiText-2 test (the prefix `kvbench eval
   --task perplexity` itself tokenizes): kvbench feeds them token by token (`--policy full`);
   llama.cpp evaluates them in one batch with logits_all=True, NLL of each next token from
   log-softmax in float64. Per position range too.
3. Greedy agreement: 3 prompts, 32 tokens; llama.cpp picks the argmax of its logits (= greedy,
   temperature 0); a divergence is printed with llama.cpp's logit gap between the two picks.
   Free-running greedy parts for good at the first near-tie decided the other way, so kvbench
   also follows llama.cpp's continuation (`generate --follow-ids`, teacher forcing): at every
   step both engines have seen the same ids, and the table counts the steps where kvbench's own
   pick is llama.cpp's, with both engines' logit gaps where it is not.
   With --dtype native (or bf16) kvbench's f32 path, the reference held to transformers' logits,
   runs the same prompts: its agreement with the --dtype run and with llama.cpp is printed too.
4. Speed and memory: WikiText-2 prompts of --prompt-tokens tokens (default 512; the issue-35
   check runs 512 2048 8192) and 64 new tokens (63 decode steps, the last token is not fed back,
   as kvbench counts), per --threads, --repeats (5) pairs each, kvbench then llama.cpp
   alternating (A B A B), medians, the 1-minute load average before each pair printed beside the
   figure (the machine is shared). Every run is a process of its own, and its peak resident set
   (GNU time's %M, from a process of its own: see peak_rss_kb) is its memory figure. kvbench: its own `--timings` line (weights loaded
   before timing). llama.cpp: a Python child (llama-cpp-python) that loads the model with n_ctx =
   prompt + 64, evaluates 8 tokens untimed (mmap'd weights paged in, compute buffers allocated),
   then times `Llama.eval(prompt)` and 63 single-token evals with argmax, n_batch = n_ubatch =
   1024, defaults otherwise (flash attention off, f16 KV cache; kvbench's CPU cache is f32). Its
   peak includes the interpreter's, measured before the model is loaded and printed: the table's
   "net" subtracts it.
5. Batched decode over a bundle (issue 16): kvbench's `bench_engine` bm_decode_batch (B sequences
   of C context tokens each, policy full, stepped together by EngineBase::decode_batch, 32 steps;
   tok/s counts every sequence's tokens) against llama.cpp's single-sequence decode at the same
   context (C WikiText-2 ids evaluated, then 32 single-token evals with argmax; one warm-up), per
   thread count, in --repeats pairs: one bench_engine run (3 repetitions per row) then llama.cpp
   at each context, alternating; medians over all repetitions; loads as in section 4. This is the sweep's
   situation: a bundle's units share one sample and decode together in kvbench, while a
   llama.cpp user would decode them one after another.

llama.cpp multiplies the Q4_1 weights against activations quantized to 8 bits (Q8_1); kvbench
dequantizes the weights to f32 and keeps activations in f32. Small perplexity differences and
greedy divergences at near-ties are expected from that alone; nothing here is tuned.

Later runs (2026-11-26 on: the AMX-free build, loads, section 5) are in bench/README.md.

Measured (2026-11-22, SmolLM2-135M-Instruct Q4_1, llama-cpp-python 0.3.36 built with
GGML_NATIVE=ON GGML_OPENMP=ON, kvbench c72ca54, 2-core AVX-512 VM):

  Tokenization: 22/22 texts give identical ids (no BOS on either side).
  Perplexity, 1,023 predicted tokens:   kvbench 10.9644, llama.cpp 10.9956, ratio 0.9972
    (positions 0-256: 28.858 vs 29.144, 0.990; 256-512: 10.012 vs 10.020, 0.999;
     512-1024: 7.086 vs 7.089, 0.9997).
  Greedy, matching prefix of 32: 'The capital of France is' 5/32 (kvbench ' answer', llama.cpp
    ' United', llama.cpp's logit gap 0.33), WikiText-2 paragraph 19/32 (' of' vs ' .', gap
    0.04), essay 32/32.
  Speed, tok/s (medians of 3)   kvbench   llama.cpp   kvbench/llama.cpp
    prefill, 1 thread             462.8       164.6     2.81
    prefill, 2 threads            677.0       302.0     2.24
    decode, 1 thread               43.6        83.0     0.53
    decode, 2 threads              66.2        95.1     0.70
  The VM's timings are noisy (single runs spread by up to 30%; an earlier run gave 2-thread
  ratios 2.32 and 0.59). kvbench prefills faster, llama.cpp decodes faster; presumably because
  decode reads every weight per token (Q4_1's 4.5 bits vs kvbench's f32) while prefill is
  compute-bound (not investigated further).

  .venv-llamacpp/bin/python scripts/compare_llamacpp.py --kvbench build/kvbench \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --shared ../shared
"""
import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama
except ImportError:
    sys.exit("numpy or llama_cpp is not importable: run `bash scripts/llamacpp_env.sh` and use "
             ".venv-llamacpp/bin/python")

PPL_TOKENS = 1024
LLAMA_F32 = 0  # ggml_type GGML_TYPE_F32 (llama.cpp's KV cache type; its default is F16 = 1)
PPL_RANGES = [(0, 256), (256, 512), (512, 1024)]
SPEED_NEW_TOKENS = 64
GREEDY_NEW_TOKENS = 32
ESSAYS = ["avg.txt", "founders.txt", "gap.txt", "goodtaste.txt", "apple.txt", "desres.txt"]
SYNTHETIC = [
    "Café au lait, naïve façade, Zürich, Ærøskøbing; Ελληνικά, Русский текст, 日本語のテキスト, "
    "한국어, עברית, العربية. Emoji: 🙂👍🏽🚀 — “curly quotes” and ‘single’ … ellipsis.",
    "Pi is 3.14159265358979; in 2024 there were 1,234,567 users (ID 00042, 123456789012, "
    "0x1F, 1e-9, -273.15°C, 50% of $9.99, 12:30:45, 2024-11-22).",
    "word    four spaces\t\ttwo tabs\n\n\n   three newlines then indent\r\nCRLF  trailing   \n"
    "  \u00a0 no-break space \u2003 em space\u200b zero width",
    "I'm sure they'll say it's fine—isn't it? \"Yes,\" she'd said; we've, you're, THEY'LL, "
    "don'T. (Parentheses) [brackets] {braces} <angles> @user #tag",
    "def f(x):\n    return x**2  # square\n\nfor i in range(10):\n\tif i % 2 == 0 and i != 4:\n"
    "\t\tprint(f\"{i:>3d}\", end='')\n",
    "<|im_start|>user\nHello there<|im_end|>\n<|endoftext|> https://example.com/Path/to?q=1&x=ABC"
    "#frag mailto:someone@example.org",
    "   ",
    "A",
    "ÀÉÎÕÜ àéîõü ß ẞ ﬁ ﬂ Å Å (composed vs decomposed) ½ ² ⁿ ℕ ∑∫√∞ ≠ ≤ ≥ ← → ⇒",
]


def peak_rss_kb(cmd):
    """Runs cmd under GNU time; returns (its peak resident set in KB, the CompletedProcess).
    Not getrusage/wait4 from this process: Linux carries a process's peak across execve, so a
    child forked (or vforked) from this Python process, which holds models and vocabularies,
    would report this process's peak when it is the larger. GNU time forks the command from its
    own small image."""
    with tempfile.NamedTemporaryFile(mode="r", suffix=".rss") as f:
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", f.name] + cmd, capture_output=True)
        text = f.read().strip().splitlines()
    if not text or not text[-1].isdigit():
        fail(f"/usr/bin/time (Debian package `time`) gave no peak RSS for {cmd[0]}: {text}")
    return int(text[-1]), p


def fail(msg):
    sys.exit(f"compare_llamacpp.py: {msg}")


def check_inputs(args):
    if not (os.path.isfile(args.kvbench) and os.access(args.kvbench, os.X_OK)):
        fail(f"kvbench binary '{args.kvbench}' is missing or not executable (build it: cmake "
             "--build build --target kvbench)")
    if not os.path.isfile(args.model):
        fail(f"model '{args.model}' is missing (scripts/fetch_models.sh puts SmolLM2 into models/)")
    with open(args.model, "rb") as f:
        if f.read(4) != b"GGUF":
            fail(f"model '{args.model}' is not a GGUF file (llama.cpp loads only GGUF)")
    wiki = os.path.join(args.shared, "data", "wikitext-2", "test.txt")
    if not os.path.isfile(wiki):
        fail(f"WikiText-2 test text '{wiki}' is missing (--shared must name the shared/ folder)")
    essays = os.path.join(args.shared, "data", "paulgraham_essays")
    for e in ESSAYS:
        if not os.path.isfile(os.path.join(essays, e)):
            fail(f"NIAH essay '{os.path.join(essays, e)}' is missing")
    for t in args.threads:
        if t < 1:
            fail(f"--threads takes positive counts, got {t}")
    if args.repeats < 1:
        fail(f"--repeats must be >= 1, got {args.repeats}")
    return wiki, essays


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class Kvbench:
    """kvbench generate/eval as subprocesses; ids and timings parsed from its stderr."""

    IDS = re.compile(r"^\[kvb I\] (prompt|generated) ids \((\d+)\):(.*)$", re.M)
    TIMING = re.compile(r"^\[kvb I\] prompt (\d+) tokens in ([0-9.e+-]+) ms .*?; decode (\d+) steps "
                        r"in ([0-9.e+-]+) ms .*?; (stopped at end token|stopped at limit)", re.M)

    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.n = 0

    def _run(self, cmd):
        """stdout, stderr; self.peak_kb: the process's peak resident set (KB, peak_rss_kb)."""
        self.peak_kb, p = peak_rss_kb(cmd)
        o, e = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
        if p.returncode != 0:
            fail(f"{' '.join(cmd)} exited {p.returncode}:\n{e}")
        return o, e

    FOLLOW = re.compile(r"^\[kvb I\] follow step (\d+): followed (\d+) logit (\S+), own pick (\d+) "
                        r"logit (\S+)$", re.M)

    def generate(self, text, max_new, threads=None, timings=False, dtype=None, follow=None):
        self.n += 1
        path = os.path.join(self.tmp, f"prompt{self.n}.txt")
        with open(path, "wb") as f:
            f.write(text.encode("utf-8"))
        cmd = [self.args.kvbench, "generate", "--model", self.args.model, "--prompt-file", path,
               "--show-ids", "--dtype", dtype or self.args.dtype]
        # Teacher forcing: feed `follow` back step by step; each step's own pick is parsed.
        cmd += ["--follow-ids", " ".join(map(str, follow))] if follow else \
            ["--max-new-tokens", str(max_new)]
        if threads:
            cmd += ["--threads", str(threads)]
        if timings:
            cmd.append("--timings")
        _, err = self._run(cmd)
        out = {"prompt": None, "generated": []}
        for kind, count, body in self.IDS.findall(err):
            ids = [int(x) for x in body.split()]
            if len(ids) != int(count):
                fail(f"kvbench printed {len(ids)} {kind} ids but announced {count}")
            out[kind] = ids
        if out["prompt"] is None:
            fail(f"no 'prompt ids' line in kvbench's stderr:\n{err}")
        if timings:
            m = self.TIMING.search(err)
            if not m:
                fail(f"no timings line in kvbench's stderr:\n{err}")
            out["prompt_tokens"], out["prefill_ms"] = int(m.group(1)), float(m.group(2))
            out["decode_steps"], out["decode_ms"] = int(m.group(3)), float(m.group(4))
            out["hit_end"] = m.group(5) == "stopped at end token"
        if follow:
            steps = [(int(a), int(b), float(c), int(d), float(e))
                     for a, b, c, d, e in self.FOLLOW.findall(err)]
            if [st[0] for st in steps] != list(range(len(follow))) or \
                    [st[1] for st in steps] != list(follow):
                fail(f"kvbench's follow steps do not match the {len(follow)} ids given:\n{err}")
            # (own pick, its logit, the followed id's logit) per step
            out["followed"] = [(d, e, c) for _, _, c, d, e in steps]
        out["peak_kb"] = self.peak_kb
        return out

    def perplexity(self, wiki, max_tokens, threads):
        cmd = [self.args.kvbench, "eval", "--model", self.args.model, "--task", "perplexity",
               "--task-opt", f"file={wiki}", "--task-opt", f"max_tokens={max_tokens}",
               "--task-opt", "ranges=" + ",".join(f"{a}-{b}" for a, b in PPL_RANGES),
               "--policy", "full", "--threads", str(threads), "-o", "jsonl", "--dtype", self.args.dtype]
        out, _ = self._run(cmd)
        for line in out.splitlines():
            row = json.loads(line)
            if "task" in row:  # the aggregate row
                return row
        fail(f"no aggregate row in kvbench eval's output:\n{out}")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU model unknown"


def median(xs):
    return statistics.median(xs)


def last_logits(llm):
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                 shape=(llm.n_vocab(),))


def is_eog(llm, tok):
    return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), tok))


def tokenization_texts(wiki_text, essays_dir):
    texts = []
    lines = wiki_text.splitlines(keepends=True)
    texts.append(("wiki header", lines[1]))
    long_lines = [ln for ln in lines if len(ln) > 200]
    for i in (0, 7, 60, 250, 600, 1100):
        texts.append((f"wiki line {i}", long_lines[min(i, len(long_lines) - 1)]))
    for k, e in enumerate(ESSAYS):
        t = read(os.path.join(essays_dir, e))
        start = 0 if k % 2 == 0 else len(t) // 2
        texts.append((f"essay {e}@{start}", t[start:start + 900]))
    for k, t in enumerate(SYNTHETIC):
        texts.append((f"synthetic {k}", t))
    return texts


def section_tokenization(kvb, vocab, texts):
    print(f"\n## 1. Tokenization ({len(texts)} texts, add_bos=True, special=False)\n")
    print("| text | chars | kvbench ids | llama.cpp ids | identical | first difference |")
    print("|---|---:|---:|---:|:---:|---|")
    same = 0
    for name, text in texts:
        ours = kvb.generate(text, 1)["prompt"]
        theirs = vocab.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        if ours == theirs:
            same += 1
            diff = ""
        else:
            p = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                     min(len(ours), len(theirs)))
            piece = lambda ids: repr(vocab.detokenize(ids[p:p + 3]).decode("utf-8", "replace"))
            diff = (f"pos {p}: kvbench {ours[p:p + 3]} {piece(ours)} vs llama.cpp "
                    f"{theirs[p:p + 3]} {piece(theirs)}")
        print(f"| {name} | {len(text)} | {len(ours)} | {len(theirs)} | "
              f"{'yes' if ours == theirs else 'NO'} | {diff} |")
    return same, len(texts)


def ppl_ids(kvb, wiki_text):
    # The prefix `kvbench eval --task perplexity` tokenizes (tasks/perplexity.cc enough_text):
    # the shortest prefix ending at a line break, starting from max(4096, 8 * want) bytes and
    # doubling, holding max_tokens + 64 tokens. Its first max_tokens ids are the scored ones.
    want = PPL_TOKENS + 64
    nbytes = max(4096, want * 8)
    raw = wiki_text.encode("utf-8")
    while nbytes < len(raw):
        nl = raw.find(b"\n", nbytes)
        if nl < 0:
            break
        ids = kvb.generate(raw[:nl + 1].decode("utf-8"), 1)["prompt"]
        if len(ids) >= want:
            return ids[:PPL_TOKENS]
        nbytes *= 2
    fail("WikiText-2 test text is too short for the perplexity section")


def section_perplexity(kvb, args, wiki, ids):
    n_thr = max(args.threads)
    row = kvb.perplexity(wiki, PPL_TOKENS, n_thr)
    if int(row["tokens"]) != len(ids) - 1:
        fail(f"kvbench scored {row['tokens']} tokens, expected {len(ids) - 1}")
    llm = Llama(model_path=args.model, n_ctx=PPL_TOKENS, n_batch=PPL_TOKENS, n_ubatch=PPL_TOKENS,
                n_threads=n_thr, n_threads_batch=n_thr, logits_all=True, verbose=False)
    llm.eval(ids)
    logits = np.asarray(llm.scores[:len(ids)], dtype=np.float64)
    del llm
    mx = logits.max(axis=1, keepdims=True)
    lse = (mx[:, 0] + np.log(np.exp(logits - mx).sum(axis=1)))
    nll = lse[:-1] - logits[np.arange(len(ids) - 1), ids[1:]]  # nll[t] predicts position t + 1
    print(f"\n## 2. Perplexity (WikiText-2 test, first {len(ids)} kvbench tokens, "
          f"{len(ids) - 1} predicted; kvbench token by token, llama.cpp one batch)\n")
    print("| positions | kvbench ppl | llama.cpp ppl | ratio kvbench/llama.cpp |")
    print("|---|---:|---:|---:|")
    res = {}
    for label, a, b, key in [("all", 1, len(ids), "")] + [
            (f"{a}-{b}", max(a, 1), b, f"_{a}_{b}") for a, b in PPL_RANGES]:
        ours = math.exp(row["nll_sum" + key] / row["tokens" + key])
        theirs = math.exp(float(nll[a - 1:b - 1].mean()))
        print(f"| {label} | {ours:.4f} | {theirs:.4f} | {ours / theirs:.4f} |")
        res[label] = (ours, theirs)
    section_top1(kvb, args, wiki, ids, logits)
    return res


def section_top1(kvb, args, wiki, ids, logits):
    """Teacher-forced top-1 agreement over the perplexity ids: kvbench prompted with a prefix of
    them, then fed the rest (`generate --follow-ids`); at each position its own pick against
    llama.cpp's argmax from the same ids (`logits`, one batch), with llama.cpp's gap between
    the two where they differ. With --dtype native or bf16, kvbench's f32 path too."""
    raw = read(wiki)
    # A prompt text whose ids are a prefix of `ids`: cut before a space (a word starts a
    # pre-token in both tokenizers), checked.
    cut = raw.find(" ", 96)
    prompt = kvb.generate(raw[:cut], 1)["prompt"] if cut > 0 else []
    n = len(prompt)
    if n < 2 or prompt != ids[:n]:
        fail(f"WikiText-2's first {cut} bytes do not tokenize to a prefix of the perplexity ids")
    follow = ids[n:]
    top = logits.argmax(axis=1)
    print(f"\nTeacher-forced top-1 over the same ids: kvbench prompted with the first {n}, then fed "
          f"the other {len(follow)}; at each position kvbench's own pick against llama.cpp's "
          f"argmax\n")
    print("| kvbench | positions | same pick | differ | llama.cpp's gap where they differ: "
          "median, max | the 5 largest gaps |")
    print("|---|---:|---:|---:|---|---|")
    picks = {}
    for dtype in [args.dtype] + (["f32"] if args.dtype != "f32" else []):
        f = kvb.generate(raw[:cut], 0, dtype=dtype, follow=follow)["followed"]
        picks[dtype] = [pk for pk, _, _ in f]
        lg = []
        for i, (pk, _, _) in enumerate(f):
            theirs = int(top[n - 1 + i])
            if pk != theirs:
                lg.append(float(logits[n - 1 + i][theirs] - logits[n - 1 + i][pk]))
        lg.sort()
        print(f"| {dtype} | {len(f)} | {len(f) - len(lg)} | {len(lg)} | "
              f"{median(lg) if lg else 0:.3f}, {max(lg, default=0):.3f} | "
              f"{', '.join(f'{g:.3f}' for g in lg[-5:])} |")
    # llama.cpp against itself: the same ids with an f32 KV cache (type_k = type_v = GGML_TYPE_F32)
    # instead of its default f16, the size of its own roundings' effect on the argmax.
    n_thr = max(args.threads)
    llm = Llama(model_path=args.model, n_ctx=PPL_TOKENS, n_batch=PPL_TOKENS, n_ubatch=PPL_TOKENS,
                n_threads=n_thr, n_threads_batch=n_thr, logits_all=True, verbose=False,
                type_k=LLAMA_F32, type_v=LLAMA_F32)
    llm.eval(ids)
    other = np.asarray(llm.scores[:len(ids)], dtype=np.float64)
    del llm
    lg = sorted(float(logits[n - 1 + i][top[n - 1 + i]] - logits[n - 1 + i][other[n - 1 + i].argmax()])
                for i in range(len(follow)) if other[n - 1 + i].argmax() != top[n - 1 + i])
    print(f"| llama.cpp itself, f32 KV cache | {len(follow)} | {len(follow) - len(lg)} | {len(lg)} | "
          f"{median(lg) if lg else 0:.3f}, {max(lg, default=0):.3f} | "
          f"{', '.join(f'{g:.3f}' for g in lg[-5:])} |")
    if len(picks) == 2:
        a, b = picks.values()
        print(f"\nkvbench {args.dtype} and kvbench f32 pick the same token at "
              f"{sum(x == y for x, y in zip(a, b))} of {len(a)} positions")


def greedy_llamacpp(llm, prompt, n_new):
    llm.reset()
    llm.eval(prompt)
    out, gaps = [], []
    for step in range(n_new):
        lg = last_logits(llm)
        tok = int(np.argmax(lg))
        if is_eog(llm, tok):
            break
        out.append(tok)
        gaps.append(lg.copy())
        if step + 1 < n_new:
            llm.eval([tok])
    return out, gaps


def first_divergence(ours, theirs):
    """The first step where two greedy runs pick different tokens (or where one stopped)."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                min(len(ours), len(theirs)))


def section_greedy(kvb, args, prompts):
    n_thr = max(args.threads)
    llm = Llama(model_path=args.model, n_ctx=1024, n_batch=1024, n_ubatch=1024,
                n_threads=n_thr, n_threads_batch=n_thr, verbose=False)
    # With --dtype native (or bf16), kvbench's f32 path runs too: the reference held to
    # transformers' logits. Where llama.cpp parts from both at the same step and token, the
    # difference is llama.cpp's arithmetic, not the quantized path's.
    reference = args.dtype != "f32"
    print(f"\n## 3. Greedy agreement ({GREEDY_NEW_TOKENS} new tokens, policy full)\n")
    head = ("| prompt | prompt tokens | matching prefix | first divergence "
            "(kvbench vs llama.cpp; llama.cpp's logit gap) | teacher-forced: kvbench's pick is "
            "llama.cpp's |")
    rule = "|---|---:|---:|---|---|"
    if reference:
        head += (f" kvbench {args.dtype} vs kvbench f32 | kvbench f32 vs llama.cpp |"
                 f" teacher-forced, kvbench f32 |")
        rule += "---:|---|---|"
    head += " llama.cpp with an f32 KV cache vs llama.cpp |"
    rule += "---|"
    print(head)
    print(rule)
    piece = lambda t: repr(llm.detokenize([t]).decode("utf-8", "replace"))
    llm32 = Llama(model_path=args.model, n_ctx=1024, n_batch=1024, n_ubatch=1024,
                  n_threads=n_thr, n_threads_batch=n_thr, verbose=False,
                  type_k=LLAMA_F32, type_v=LLAMA_F32)
    res, forced_rows = [], []
    for name, text in prompts:
        k = kvb.generate(text, GREEDY_NEW_TOKENS)
        ours = k["generated"]
        theirs, logits = greedy_llamacpp(llm, k["prompt"], GREEDY_NEW_TOKENS)

        def against_llamacpp(mine):
            p = first_divergence(mine, theirs)
            if mine == theirs:
                return p, ""
            if p < min(len(mine), len(theirs)):
                gap = logits[p][theirs[p]] - logits[p][mine[p]]
                return p, (f"step {p}: {mine[p]} {piece(mine[p])} vs {theirs[p]} "
                           f"{piece(theirs[p])}; {gap:.3f}")
            return p, (f"one stopped at an end token after {p} (kvbench {len(mine)}, "
                       f"llama.cpp {len(theirs)})")

        def forced(dtype):
            # kvbench fed llama.cpp's continuation: at how many steps its own pick is llama.cpp's,
            # and at the others both engines' gaps between the two tokens.
            if not theirs:
                return "(llama.cpp stopped at once)"
            f = kvb.generate(text, 0, dtype=dtype, follow=theirs)["followed"]
            diffs = [(i, pick, kgap) for i, (pick, pl, fl) in enumerate(f)
                     for kgap in [pl - fl] if pick != theirs[i]]
            txt = f"{len(f) - len(diffs)}/{len(f)}"
            for i, pick, kgap in diffs:
                lgap = logits[i][theirs[i]] - logits[i][pick]
                txt += (f"; step {i}: {piece(pick)} vs {piece(theirs[i])} "
                        f"(gaps kvbench {kgap:.3f}, llama.cpp {lgap:.3f})")
            forced_rows.append((name, dtype, len(f) - len(diffs), len(f),
                                max([abs(logits[i][theirs[i]] - logits[i][pk])
                                     for i, pk, _ in diffs] + [0.0])))
            return txt

        # llama.cpp against itself: its f32 KV cache instead of f16, the same prompt ids.
        self32, _ = greedy_llamacpp(llm32, k["prompt"], GREEDY_NEW_TOKENS)
        p_self, div_self = against_llamacpp(self32)
        p, div = against_llamacpp(ours)
        row = f"| {name} | {len(k['prompt'])} | {p}/{max(len(ours), len(theirs))} | {div} |"
        row += f" {forced(args.dtype)} |"
        if reference:
            f32 = kvb.generate(text, GREEDY_NEW_TOKENS, dtype="f32")
            if f32["prompt"] != k["prompt"]:
                fail(f"kvbench's f32 and {args.dtype} runs tokenized {name} differently")
            same = first_divergence(ours, f32["generated"])
            p32, div32 = against_llamacpp(f32["generated"])
            row += (f" {same}/{max(len(ours), len(f32['generated']))} | "
                    f"{p32}/{max(len(f32['generated']), len(theirs))} {div32} |"
                    f" {forced('f32')} |")
        row += f" {p_self}/{max(len(self32), len(theirs))} {div_self} |"
        print(row)
        res.append((name, p, max(len(ours), len(theirs))))
    del llm, llm32
    for dtype in dict.fromkeys(r[1] for r in forced_rows):
        rows = [r for r in forced_rows if r[1] == dtype]
        print(f"\nteacher-forced, kvbench {dtype}: own pick = llama.cpp's at "
              f"{sum(r[2] for r in rows)} of {sum(r[3] for r in rows)} steps; where not, "
              f"llama.cpp's gap between the two tokens at most {max(r[4] for r in rows):.3f}")
    return res


def load1():
    """The 1-minute load average (the machine is shared: every speed figure carries it)."""
    return os.getloadavg()[0]


def load_range(loads):
    return f"{min(loads):.1f}-{max(loads):.1f}"


LLAMACPP_CHILD = r"""
import json, resource, sys, time
import numpy as np, llama_cpp
from llama_cpp import Llama
model, ids_path, n_new, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = json.load(open(ids_path))
llm = Llama(model_path=model, n_ctx=len(ids) + n_new, n_batch=1024, n_ubatch=1024,
            n_threads=threads, n_threads_batch=threads, verbose=False)
llm.eval(ids[:8])  # warm-up: mmap'd weights paged in, compute buffers allocated
llm.reset()
t0 = time.perf_counter()
llm.eval(ids)
prefill_s = time.perf_counter() - t0
t1 = time.perf_counter()
steps = 0
for step in range(n_new):  # as kvbench: sample, feed back, ...; the last token is not fed back
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                   shape=(llm.n_vocab(),))
    tok = int(np.argmax(logits))
    if step + 1 == n_new:
        break
    llm.eval([tok])
    steps += 1
decode_s = time.perf_counter() - t1
print(json.dumps({"prefill_s": prefill_s, "decode_s": decode_s, "steps": steps,
                  "base_kb": base, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def llamacpp_child(args, ids_path, threads):
    """One llama.cpp run in its own process (so that its peak resident set is its own): times of
    the prompt and the decode steps, the process's peak RSS and the interpreter's before the
    model was loaded (KB)."""
    peak, p = peak_rss_kb([sys.executable, "-c", LLAMACPP_CHILD, args.model, ids_path,
                           str(SPEED_NEW_TOKENS), str(threads)])
    if p.returncode != 0:
        fail(f"the llama.cpp child exited {p.returncode}:\n{p.stderr.decode(errors='replace')}")
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    r["peak_kb"] = peak
    return r


def section_speed(kvb, args, wiki_text, vocab):
    print(f"\n## 4. CPU speed and peak memory (WikiText-2 prompts of --prompt-tokens tokens, "
          f"{SPEED_NEW_TOKENS} new tokens = {SPEED_NEW_TOKENS - 1} decode steps; kvbench and "
          f"llama.cpp alternate, {args.repeats} pairs, medians; each run is its own process, "
          f"whose peak resident set (GNU time %M) is measured; llama.cpp's process is a "
          f"Python interpreter, whose own peak before the model is loaded is printed and "
          f"subtracted in 'net'; load: 1-minute load average before each pair, min-max)\n")
    print("| prompt | threads | kvbench prefill tok/s | llama.cpp prefill tok/s | ratio | "
          "kvbench decode tok/s | llama.cpp decode tok/s | ratio | kvbench peak MiB | "
          "llama.cpp peak MiB (net) | ratio (to net) | load |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    res = {}
    long_ids = vocab.tokenize(wiki_text[: 12 * max(args.prompt_tokens)].encode("utf-8"),
                              add_bos=False, special=False)
    for n_prompt in args.prompt_tokens:
        # ~n_prompt kvbench tokens of WikiText-2: the text of llama.cpp's first n_prompt ids.
        text = vocab.detokenize(long_ids[:n_prompt]).decode("utf-8", errors="replace")
        prompt = kvb.generate(text, 1)["prompt"]  # kvbench's ids: llama.cpp evaluates these
        ids_path = os.path.join(kvb.tmp, f"ids{n_prompt}.json")
        with open(ids_path, "w") as f:
            json.dump(prompt, f)
        for n in args.threads:
            kp, kd, lp, ld, krss, lrss, lbase, loads = [], [], [], [], [], [], [], []
            for rep in range(args.repeats):
                loads.append(load1())
                k = kvb.generate(text, SPEED_NEW_TOKENS, threads=n, timings=True)
                if k["hit_end"]:
                    print(f"  (kvbench stopped at an end token after {k['decode_steps']} steps)",
                          file=sys.stderr)
                kp.append(k["prompt_tokens"] * 1000.0 / k["prefill_ms"])
                kd.append(k["decode_steps"] * 1000.0 / k["decode_ms"])
                krss.append(k["peak_kb"] / 1024)
                r = llamacpp_child(args, ids_path, n)
                lp.append(len(prompt) / r["prefill_s"])
                ld.append(r["steps"] / r["decode_s"])
                lrss.append(r["peak_kb"] / 1024)
                lbase.append(r["base_kb"] / 1024)
            m = {k_: median(v) for k_, v in
                 dict(kp=kp, lp=lp, kd=kd, ld=ld, krss=krss, lrss=lrss, lbase=lbase).items()}
            res[(n_prompt, n)] = m
            net = m["lrss"] - m["lbase"]
            print(f"| {len(prompt)} | {n} | {m['kp']:.1f} | {m['lp']:.1f} | {m['kp'] / m['lp']:.2f} | "
                  f"{m['kd']:.1f} | {m['ld']:.1f} | {m['kd'] / m['ld']:.2f} | {m['krss']:.0f} | "
                  f"{m['lrss']:.0f} ({net:.0f}) | {m['krss'] / m['lrss']:.2f} "
                  f"({m['krss'] / net:.2f}) | {load_range(loads)} |", flush=True)
            print(f"  prompt {len(prompt)}, threads {n}: kvbench prefill {[round(x, 1) for x in kp]}, "
                  f"decode {[round(x, 1) for x in kd]}, peak MiB {[round(x) for x in krss]}; "
                  f"llama.cpp prefill {[round(x, 1) for x in lp]}, decode "
                  f"{[round(x, 1) for x in ld]}, peak MiB {[round(x) for x in lrss]} (interpreter "
                  f"{[round(x) for x in lbase]}); loads {[round(x, 2) for x in loads]}",
                  file=sys.stderr)
    return res


BATCH_CONTEXTS = (512, 2048)
BATCH_SIZES = (1, 4, 11)
BATCH_STEPS = 32


def kvbench_batched(args, threads):
    """One bench_engine run of bm_decode_batch: {(context, batch): [tok/s of each repetition]}."""
    out = subprocess.run(
        [args.bench, "--benchmark_filter=bm_decode_batch", "--benchmark_format=json"],
        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if out.returncode != 0:
        fail(f"{args.bench} failed: {out.stderr[-2000:]}")
    res = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        if b.get("run_type") != "iteration":  # the repetitions themselves, not their aggregates
            continue
        if "error_occurred" in b and b["error_occurred"]:
            fail(f"bench_engine: {b['run_name']}: {b.get('error_message')}")
        m = re.search(r"/(\d+)/(\d+)", b["run_name"])
        res.setdefault((int(m.group(1)), int(m.group(2))), []).append(b["tok/s"])
    return res


def llamacpp_decode(llm, ids, ctx):
    """llama.cpp's single-sequence decode at `ctx` tokens of context: tok/s of BATCH_STEPS steps."""
    # Decode speed does not depend on what the context says: the ids repeated to length.
    prompt = (ids * (ctx // len(ids) + 1))[:ctx]
    llm.reset()
    llm.eval(prompt)
    t0 = time.perf_counter()
    for _ in range(BATCH_STEPS):
        llm.eval([int(np.argmax(last_logits(llm)))])
    return BATCH_STEPS / (time.perf_counter() - t0)


def section_batched(args, ids):
    print(f"\n## 5. Batched decode over a bundle (kvbench bench_engine bm_decode_batch: B sequences "
          f"stepped together, {BATCH_STEPS} steps; llama.cpp: one sequence; {args.repeats} pairs, "
          f"kvbench (one bench_engine run, 3 repetitions per row) then llama.cpp, alternating; "
          f"medians; load: 1-minute load average before each pair, min-max)\n")
    print("| threads | context | B | kvbench tok/s (all B sequences) | llama.cpp tok/s (one sequence) "
          "| ratio | load |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.threads:
        llm = Llama(model_path=args.model, n_ctx=max(BATCH_CONTEXTS) + BATCH_STEPS + 8,
                    n_batch=1024, n_ubatch=1024, n_threads=n, n_threads_batch=n, verbose=False)
        for ctx in BATCH_CONTEXTS:  # warm-up (mmap'd weights paged in), untimed
            llamacpp_decode(llm, ids, ctx)
        kvb, lcp, loads = {}, {ctx: [] for ctx in BATCH_CONTEXTS}, []
        for _ in range(args.repeats):
            loads.append(load1())
            for key, rates in kvbench_batched(args, n).items():
                kvb.setdefault(key, []).extend(rates)
            for ctx in BATCH_CONTEXTS:
                lcp[ctx].append(llamacpp_decode(llm, ids, ctx))
            # Progress (stderr): each pair's figures, so that an interrupted run still shows them.
            print(f"  threads {n} pair {len(loads)} (load {loads[-1]:.2f}): kvbench "
                  + ", ".join(f"{c}/{b} {[round(x, 1) for x in r[-3:]]}"
                              for (c, b), r in sorted(kvb.items()))
                  + "; llama.cpp " + ", ".join(f"{c} {lcp[c][-1]:.1f}" for c in BATCH_CONTEXTS),
                  file=sys.stderr)
        del llm
        for ctx in BATCH_CONTEXTS:
            ld = median(lcp[ctx])
            for bsz in BATCH_SIZES:
                if (ctx, bsz) not in kvb:
                    fail(f"bench_engine printed no bm_decode_batch run for {ctx}/{bsz}")
                kd = median(kvb[(ctx, bsz)])
                print(f"| {n} | {ctx} | {bsz} | {kd:.1f} | {ld:.1f} | {kd / ld:.2f} | "
                      f"{load_range(loads)} |")
                print(f"  threads {n} context {ctx} B {bsz}: kvbench "
                      f"{[round(x, 1) for x in kvb[(ctx, bsz)]]}", file=sys.stderr)
            print(f"  threads {n} context {ctx}: llama.cpp {[round(x, 1) for x in lcp[ctx]]}",
                  file=sys.stderr)
        print(f"  threads {n}: loads {[round(x, 2) for x in loads]}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvbench", default="build/kvbench")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                    help="thread counts for the speed section (the largest is used elsewhere)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="kvbench/llama.cpp pairs per speed figure (sections 4, 5)")
    ap.add_argument("--only", default="12345", help="sections to run, e.g. 13")
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[512],
                    help="prompt lengths of the speed and memory section (e.g. 512 2048 8192)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "native"],
                    help="kvbench's CPU weights (generate and eval; section 5's bench_engine is f32): "
                         "native multiplies in the GGUF's own blocks as llama.cpp does")
    ap.add_argument("--bench", default="build/bench/bench_engine",
                    help="kvbench's bench_engine binary (section 5)")
    args = ap.parse_args()
    wiki, essays = check_inputs(args)
    wiki_text = read(wiki)

    kv_version = subprocess.run([args.kvbench, "--version"], capture_output=True,
                                text=True).stdout.strip()
    print(f"llama_cpp {llama_cpp.__version__} (numpy {np.__version__}, Python "
          f"{platform.python_version()}); {kv_version} --dtype {args.dtype}; model {args.model}; "
          f"{os.cpu_count()} CPUs")
    print("llama.cpp system info: " + llama_cpp.llama_print_system_info().decode().strip())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_model()}; "
          f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    vocab = Llama(model_path=args.model, vocab_only=True, verbose=False)
    print(f"GGUF tokenizer.ggml.pre={vocab.metadata.get('tokenizer.ggml.pre')}, "
          f"add_bos_token={vocab.metadata.get('tokenizer.ggml.add_bos_token', '(absent)')}, "
          f"BOS id {vocab.token_bos()}")

    with tempfile.TemporaryDirectory() as tmp:
        kvb = Kvbench(args, tmp)
        if "1" in args.only:
            same, total = section_tokenization(kvb, vocab, tokenization_texts(wiki_text, essays))
            print(f"\nidentical ids: {same}/{total} texts")
        ids = ppl_ids(kvb, wiki_text) if any(s in args.only for s in "245") else None
        if "2" in args.only:
            section_perplexity(kvb, args, wiki, ids)
        if "3" in args.only:
            lines = [ln for ln in wiki_text.splitlines() if len(ln) > 200]
            essay = read(os.path.join(essays, "founders.txt")).strip()
            section_greedy(kvb, args, [
                ("'The capital of France is'", "The capital of France is"),
                ("WikiText-2 paragraph (600 chars)", lines[3][:600]),
                ("essay founders.txt (600 chars)", essay[:600]),
            ])
        if "4" in args.only:
            section_speed(kvb, args, wiki_text, vocab)
        if "5" in args.only:
            section_batched(args, ids)
    print(f"\nload average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
