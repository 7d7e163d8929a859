#!/usr/bin/env python3
"""Tiny Hugging Face folders with scaled RoPE, for tests/model/test_hf_folder_rope.cc: the
folder writer, tokenizer and weight filler of scripts/make_hf_folder_fixture.py (whose folders
this script leaves alone), with transformers' eager f32 logits at every position.
  - phi3_longrope_f16: Phi3ForCausalLM, f16, fused qkv_proj and gate_up_proj, partial_rotary_factor
    0.5 (6 of head_dim 12 rotate), rope_scaling longrope with distinct long and short factor sets,
    original_max_position_embeddings 16 < max_position_embeddings 256 (so kvbench runs the long
    set; attention factor sqrt(1 + ln 16 / ln 16)), sliding_window 20. Every prompt is longer
    than 16 tokens, so that transformers, which picks the set per call by the sequence length,
    uses the long set too.
  - qwen2_yarn_f16: Qwen2ForCausalLM, f16, q/k/v biases, rope_scaling yarn factor 4 over
    original_max_position_embeddings 64 (= 256 / 4, so transformers' factor, max / original,
    and rope_scaling.factor agree), beta_fast 16 and beta_slow 0.25 so that the correction ramp
    spans dimensions 0..3 of 6.

Pinned versions (/work/.venv-g3): as make_hf_folder_fixture.py (recorded in each JSON).
Run:  /work/.venv-g3/bin/python scripts/make_hf_rope_fixture.py
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_folder_fixture as hf  # noqa: E402

SEED = 20251126
COMMON = dict(hf.COMMON)
LONG_PROMPTS = [  # 21 and 32 tokens
    ("short", "the the the cache cache fox fox the cache the fox"),
    ("long", "Once upon a time, the fox read config.json."),
]
FOLDERS = {
    "phi3_longrope_f16": dict(
        cls="Phi3ForCausalLM", dtype=torch.float16, shard=None, add_bos=False,
        cfg=transformers.Phi3Config(
            **COMMON, num_hidden_layers=2, rms_norm_eps=1e-5, rope_theta=10000.0,
            partial_rotary_factor=0.5, original_max_position_embeddings=16,
            rope_scaling=dict(type="longrope", long_factor=[1.0, 1.7, 3.1],
                              short_factor=[1.0, 1.2, 1.5]),
            sliding_window=20, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2,
            pad_token_id=0)),
    "qwen2_yarn_f16": dict(
        cls="Qwen2ForCausalLM", dtype=torch.float16, shard=None, add_bos=False,
        cfg=transformers.Qwen2Config(
            **COMMON, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=10000.0,
            rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=64,
                              beta_fast=16.0, beta_slow=0.25),
            tie_word_embeddings=True, use_sliding_window=False, eos_token_id=2)),
}


def main():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "tests", "fixtures", "hf")
    torch.set_num_threads(1)
    tok = hf.train_tokenizer()
    rng = np.random.default_rng(SEED)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": hf.tokenizers.__version__,
                "safetensors": hf.safetensors.__version__, "numpy": np.__version__}
    tok_cases = [{"text": t, "ids": tok.encode(t).ids} for t in hf.TOKENIZER_TEXTS]
    for name, spec in FOLDERS.items():
        fx = hf.write_folder(root, name, spec, tok, rng, prompts=LONG_PROMPTS)
        if name.startswith("phi3"):
            orig = fx["config"]["original_max_position_embeddings"]
            assert all(len(c["ids"]) > orig for c in fx["cases"]), "a prompt uses the short set"
        fx.update({"generator": "scripts/make_hf_rope_fixture.py", "versions": versions,
                   "seed": SEED, "folder": name, "logit_digits": 7,
                   "tokenizer_cases": tok_cases})
        path = os.path.join(root, name + ".json")
        with open(path, "w") as f:
            json.dump(fx, f, separators=(",", ":"))
        print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
