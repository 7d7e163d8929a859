#!/usr/bin/env python3
"""Compares kvbench with Hugging Face transformers on the same GGUF file (real weights): greedy
agreement and WikiText-2 perplexity. Peer check, not a test; for architectures that
scripts/compare_llamacpp.py cannot run (llama-cpp-python 0.3.36 segfaults in Llama.eval on
Gemma 3 GGUFs, every n_ctx/n_batch/flash_attn tried).

transformers dequantizes the GGUF with gguf-py to f32 (as kvbench does at load) and runs the
model in f32 with eager attention; kvbench runs as a subprocess (`generate --show-ids`, `eval
--task perplexity -o jsonl`). Both sides evaluate kvbench's token ids.
  1. Greedy agreement: 3 prompts, 32 new tokens each.
  2. Perplexity: the first 1,024 kvbench tokens of WikiText-2 test (the prefix `kvbench eval
     --task perplexity` tokenizes), kvbench token by token (--policy full), transformers in one
     forward pass; NLL from log-softmax in float64.

Pinned versions (.venv-gemma3 plus the GGUF loader's needs): torch 2.5.1, transformers 4.53.3,
tokenizers 0.21.4, numpy 1.26.4, accelerate 1.1.1, gguf 0.17.1 (gguf 0.10.0 has no gemma3 map).
  .venv-gemma3/bin/pip install accelerate==1.1.1 gguf==0.17.1
  .venv-gemma3/bin/python scripts/compare_transformers_gguf.py --kvbench build/kvbench \
      --model models/gemma-3-270m-q4_k_m.gguf --shared ../shared

Measured (2026-11-25, Gemma-3-270M Q4_K_M, kvbench at the gemma3 merge, 2-core AVX-512 VM):
  Greedy: 32/32 tokens identical on all three prompts.
  Perplexity over 1,023 predicted tokens: kvbench 7.8798 (NLL sum 2111.7832), transformers 7.8798.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

PPL_TOKENS = 1024
GREEDY_NEW_TOKENS = 32
PROMPTS = ["The capital of France is",
           "In 1905, Albert Einstein published four papers that",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]
IDS = re.compile(r"(prompt|generated) ids \((\d+)\):([0-9 ]*)")


def fail(msg):
    print(f"compare_transformers_gguf.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr.decode(errors='replace')}")
    return p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def kvb_generate(args, tmp, text, max_new):
    path = os.path.join(tmp, "prompt.txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    _, err = run([args.kvbench, "generate", "--model", args.model, "--prompt-file", path,
                  "--max-new-tokens", str(max_new), "--show-ids"])
    out = {"prompt": None, "generated": []}
    for kind, count, body in IDS.findall(err):
        out[kind] = [int(x) for x in body.split()]
        if len(out[kind]) != int(count):
            fail(f"kvbench printed {len(out[kind])} {kind} ids but announced {count}")
    if out["prompt"] is None:
        fail(f"no prompt ids in kvbench's stderr:\n{err}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvbench", default="build/kvbench")
    ap.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--shared", default="../shared")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    d, f = os.path.split(os.path.abspath(args.model))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, torch_dtype=torch.float32, attn_implementation="eager").eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{type(model).__name__}; model {args.model}\n")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"## 1. Greedy agreement ({GREEDY_NEW_TOKENS} new tokens)\n")
        print("| prompt | prompt tokens | matching prefix |\n|---|---:|---:|")
        for text in PROMPTS:
            k = kvb_generate(args, tmp, text, GREEDY_NEW_TOKENS)
            ids = k["prompt"]
            with torch.no_grad():
                hf = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_NEW_TOKENS,
                                    do_sample=False)[0].tolist()[len(ids):]
            same = 0
            while same < min(len(hf), len(k["generated"])) and hf[same] == k["generated"][same]:
                same += 1
            print(f"| {json.dumps(text)[:40]} | {len(ids)} | {same}/{len(hf)} |")

        print(f"\n## 2. Perplexity (first {PPL_TOKENS} kvbench tokens of WikiText-2 test)\n")
        wiki = os.path.join(args.shared, "data", "wikitext-2", "test.txt")
        raw = open(wiki, encoding="utf-8").read()
        nl = raw.find("\n", PPL_TOKENS * 8)
        ids = kvb_generate(args, tmp, raw[:nl + 1], 1)["prompt"][:PPL_TOKENS]
        if len(ids) < PPL_TOKENS:
            fail("WikiText-2 prefix too short")
        out, _ = run([args.kvbench, "eval", "--model", args.model, "--task", "perplexity",
                      "--task-opt", f"file={wiki}", "--task-opt", f"max_tokens={PPL_TOKENS}",
                      "--policy", "full", "-o", "jsonl"])
        agg = [json.loads(l) for l in out.splitlines() if '"task"' in l]
        if not agg:
            fail(f"no aggregate row in kvbench eval's output:\n{out}")
        kvb_ppl = float(agg[-1]["ppl"])
        with torch.no_grad():
            lg = model(torch.tensor([ids])).logits[0].double().numpy()
        mx = lg.max(axis=1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(lg - mx).sum(axis=1))
        nll = lse[:-1] - lg[np.arange(len(ids) - 1), ids[1:]]
        hf_ppl = math.exp(nll.mean())
        print("| | perplexity |\n|---|---:|")
        print(f"| kvbench | {kvb_ppl:.4f} |\n| transformers | {hf_ppl:.4f} |")
        print(f"| ratio | {kvb_ppl / hf_ppl:.5f} |")
        print(f"\nkvbench aggregate row: {json.dumps(agg[-1])[:300]}")


if __name__ == "__main__":
    main()
