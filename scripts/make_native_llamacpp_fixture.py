#!/usr/bin/env python3
"""llama.cpp's logits of SmolLM2-135M-Instruct Q4_1 for the native-weights engine test
(tests/model/test_engine_native.cc, issue 35).

kvbench's `--dtype native` multiplies in the GGUF's own blocks with 8-bit activations, the
arithmetic family of llama.cpp's CPU backend, so llama.cpp's logits are its oracle. This runs the
prompts of tests/fixtures/engine/smollm2_logits.json (their token ids: the tokenizer is checked
elsewhere) through llama.cpp (one thread, an f32 KV cache as kvbench's instead of llama.cpp's
default f16, no flash attention, every position's logits) and records, per position,
the top-10 (id, logit), the logits at the first 64 of the fixture's fixed ids, and the row's
log-sum-exp.

Pinned versions: llama-cpp-python 0.3.36 (scripts/llamacpp_env.sh builds it), numpy from that venv.
Run:  $(bash scripts/llamacpp_env.sh) scripts/make_native_llamacpp_fixture.py [--models models]
Writes tests/fixtures/engine/smollm2_native_llamacpp.json.
"""
import argparse
import json
import os

import numpy as np
import llama_cpp

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_TOKENS = 128  # per prompt: the first 128 ids of each case


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=os.path.join(root, "models"))
    ap.add_argument("--golden", default=os.path.join(root, "tests", "fixtures", "engine",
                                                     "smollm2_logits.json"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "engine",
                                                  "smollm2_native_llamacpp.json"))
    args = ap.parse_args()
    with open(args.golden, encoding="utf-8") as f:
        golden = json.load(f)
    sample_ids = golden["sample_ids"][:64]
    llm = llama_cpp.Llama(model_path=os.path.join(args.models, MODEL), n_ctx=512, n_batch=512,
                          n_threads=1, n_threads_batch=1, logits_all=True, verbose=False,
                          type_k=0, type_v=0, flash_attn=False)  # an f32 KV cache, as kvbench's
    cases = []
    for case in golden["cases"]:
        ids = case["ids"][:MAX_TOKENS]
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[:len(ids)], dtype=np.float64)
        rows = []
        for p in range(len(ids)):
            row = logits[p]
            top = np.argsort(-row, kind="stable")[:10]
            mx = row.max()
            rows.append({
                "pos": p,
                "top": [[int(t), float(row[t])] for t in top],
                "sample": [float(row[t]) for t in sample_ids],
                "lse": float(mx + np.log(np.exp(row - mx).sum())),
            })
        cases.append({"name": case["name"], "ids": ids, "rows": rows})
    out = {
        "generator": "scripts/make_native_llamacpp_fixture.py",
        "versions": {"llama_cpp_python": llama_cpp.__version__, "numpy": np.__version__,
                     "n_threads": 1, "type_k": "f32", "type_v": "f32", "flash_attn": False},
        "model": MODEL,
        "sample_ids": sample_ids,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {sum(len(c['rows']) for c in cases)} positions")


if __name__ == "__main__":
    main()
