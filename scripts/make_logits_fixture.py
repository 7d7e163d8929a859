#!/usr/bin/env python3
"""Golden logits for the engine test (tests/model/test_engine_smollm2.cc).

Loads SmolLM2-135M-Instruct's GGUF with Hugging Face transformers (which dequantizes it with gguf-py
to f32 and un-permutes Q/K to HF's rotate_half layout) and records, for three prompts (one over
1,000 tokens), the input ids and the logits at several positions: the top-10 (id, logit), the
logits at 512 fixed ids, and the log-sum-exp of the row. The test feeds the same ids to kvbench's
engine, so tokenizer and engine are checked separately.

Pinned versions (scripts/ref_env.sh): torch 2.5.1, transformers 4.46.3, gguf 0.10.0, numpy 1.26.4, accelerate 1.1.1.
Run:  $(bash scripts/ref_env.sh) scripts/make_logits_fixture.py [--models models] [--shared ../shared]
Writes tests/fixtures/engine/smollm2_logits.json.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
import gguf

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--models", default=os.path.join(root, "models"))
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "engine", "smollm2_logits.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)

    tok = transformers.AutoTokenizer.from_pretrained(args.models, gguf_file=MODEL)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.models, gguf_file=MODEL, torch_dtype=torch.float32, attn_implementation="eager")
    # transformers 4.46 builds the config with tie_word_embeddings=False for GGUF files and leaves
    # lm_head randomly initialized when the GGUF has no output.weight; llama.cpp (and the original
    # SmolLM2 config) tie the classifier to token_embd, so tie it here.
    gr = gguf.GGUFReader(os.path.join(args.models, MODEL))
    if not any(t.name == "output.weight" for t in gr.tensors):
        model.lm_head.weight = model.model.embed_tokens.weight
    model.eval()

    with open(os.path.join(args.shared, "data", "wikitext-2", "test.txt"), encoding="utf-8") as f:
        wiki = f.read()
    # About 1,100 tokens of WikiText-2 test text starting at its first article.
    long_text = wiki[: 5200]
    prompts = [
        ("short", "The capital of France is"),
        ("chat", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                 "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
        ("long", long_text),
    ]
    rng = np.random.default_rng(1234)
    sample_ids = sorted(rng.choice(model.config.vocab_size, size=512, replace=False).tolist())
    cases = []
    for name, text in prompts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double().numpy()
        n = len(ids)
        positions = sorted(set([0, 1, n // 4, n // 2, (3 * n) // 4, n - 2, n - 1]))
        positions = [p for p in positions if 0 <= p < n]
        rows = []
        for p in positions:
            row = logits[p]
            top = np.argsort(-row, kind="stable")[:10]
            m = row.max()
            rows.append({
                "position": p,
                "top_ids": [int(i) for i in top],
                "top_logits": [float(row[i]) for i in top],
                "sample_logits": [float(row[i]) for i in sample_ids],
                "logsumexp": float(m + np.log(np.exp(row - m).sum())),
            })
        cases.append({"name": name, "ids": [int(i) for i in ids], "rows": rows})
        print(f"{name}: {n} tokens, top-1 at last = {rows[-1]['top_ids'][0]} "
              f"({tok.decode([rows[-1]['top_ids'][0]])!r})", file=sys.stderr)
    out = {
        "generator": "scripts/make_logits_fixture.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": getattr(gguf, "__version__", "0.10.0"), "numpy": np.__version__},
        "model": MODEL,
        "sample_ids": sample_ids,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
