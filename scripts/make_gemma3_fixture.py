#!/usr/bin/env python3
"""Tiny random-weight Gemma 3 model and its golden logits, for tests/model/test_engine_gemma3.cc.

Like scripts/make_qwen3_fixture.py, but for Gemma 3 (transformers' Gemma3ForCausalLM, llama.cpp's
LLM_ARCH_GEMMA3): a 6-layer model (hidden 64, 4 query heads and 2 KV heads of head_dim 32, GeGLU
128 with gelu_pytorch_tanh, vocab 256 = one token per byte, RMSNorm eps 1e-6) whose layers 0-4 are
sliding-window layers (window 16, RoPE base 10000) and layer 5 global (RoPE base 1e6), the
pattern every Gemma 3 has (sliding_window_pattern 6). Also: q_norm / k_norm per head, the four
norms per layer (input, post-attention, pre-feedforward, post-feedforward), embeddings times
sqrt(hidden) and the classifier tied to the (unscaled) embeddings; query_pre_attn_scalar =
head_dim, no softcapping. Weights are seeded random f32 (norm weights far from 0 so that dropping
any norm shows). The GGUF is written with gguf.GGUFWriter the way llama.cpp's
convert_hf_to_gguf.py writes Gemma 3: arch "gemma3", norm weights stored as (1 + w) (Gemma's
RMSNorm multiplies by 1 + w), Q/K rows not permuted (NEOX RoPE), gemma3.attention.sliding_window,
gemma3.attention.key_length; no output.weight. Then:
  1. reads the file back with gguf.GGUFReader and checks every tensor and the metadata;
  2. builds Gemma3ForCausalLM (eager attention) from the HF arrays, records its logits at every
     position of three token sequences (1, 12 and 100 tokens; 100 > 6 windows), rounded to 8
     significant digits, and checks top-1/top-2 gaps > 1e-3 everywhere;
  3. checks that the window matters: the same model with sliding_window 4096 (every layer sees
     everything) moves the 100-token logits by more than 1e-2 (window_effect_max_abs_diff).

Pinned versions (.venv-gemma3; Gemma3ForCausalLM needs transformers >= 4.50): torch 2.5.1,
transformers 4.53.3 (with tokenizers 0.21.4), gguf 0.10.0, numpy 1.26.4, sentencepiece 0.2.0.
Run:  python3 -m venv .venv-gemma3 && .venv-gemma3/bin/pip install torch==2.5.1 \
        transformers==4.53.3 tokenizers==0.21.4 gguf==0.10.0 numpy==1.26.4 sentencepiece==0.2.0
      .venv-gemma3/bin/python scripts/make_gemma3_fixture.py
Writes tests/fixtures/engine/gemma3_tiny.gguf and tests/fixtures/engine/gemma3_tiny.json.
Deterministic: rerunning reproduces both files byte for byte (the JSON records the GGUF's sha256).
"""
import argparse
import os
import sys

import numpy as np
import transformers
import gguf

import tiny_fixture_common as tf

SEED = 20251125
CFG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
    rope_theta=1.0e6, rope_local_base_freq=10000.0, sliding_window=16, query_pre_attn_scalar=32,
    rms_norm_eps=1e-6,
)
NORMS = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
         "post_feedforward_layernorm"]
# llama.cpp LLM_ARCH_GEMMA3: the norm after attention is its own tensor, the one before the MLP
# takes ffn_norm.
GGUF_BLOCK = dict(tf.GGUF_BLOCK, post_attention_layernorm="post_attention_norm",
                  pre_feedforward_layernorm="ffn_norm", post_feedforward_layernorm="post_ffw_norm")


def make_weights(r):
    """HF-named f32 arrays (nn.Linear weights are [out, in]); HF norm weights w (applied as 1 + w)."""
    D, H, V, hd = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"], CFG["head_dim"]
    QD, KVD = CFG["num_attention_heads"] * hd, CFG["num_key_value_heads"] * hd
    # Embeddings are scaled by sqrt(64) = 8 on the way in: keep them small so activations stay O(1).
    w = {"model.embed_tokens.weight": r.emb(V, D, 0.25)}
    for l in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{l}."
        for norm in NORMS:
            w[p + norm + ".weight"] = r.vec(D, 0.0, 0.3)
        w[p + "self_attn.q_proj.weight"] = r.lin(QD, D, 1.5)
        w[p + "self_attn.k_proj.weight"] = r.lin(KVD, D, 1.5)
        w[p + "self_attn.v_proj.weight"] = r.lin(KVD, D)
        w[p + "self_attn.o_proj.weight"] = r.lin(D, QD)
        w[p + "self_attn.q_norm.weight"] = r.vec(hd, 0.5, 0.6)
        w[p + "self_attn.k_norm.weight"] = r.vec(hd, 0.5, 0.6)
        w[p + "mlp.gate_proj.weight"] = r.lin(H, D)
        w[p + "mlp.up_proj.weight"] = r.lin(H, D)
        w[p + "mlp.down_proj.weight"] = r.lin(D, H)
    w["model.norm.weight"] = r.vec(D, 0.0, 0.3)
    return w


def gguf_array(hf, a):
    """convert_hf_to_gguf.py's Gemma 3 rule: every *norm.weight is stored as w + 1 (f32)."""
    return (a + np.float32(1.0)).astype(np.float32) if hf.endswith("norm.weight") else a


def meta(wr):
    tf.add_shape(wr, CFG)
    wr.add_key_length(CFG["head_dim"])
    wr.add_value_length(CFG["head_dim"])
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    wr.add_sliding_window(CFG["sliding_window"])


def byte_vocab(wr):
    """A byte vocabulary in SentencePiece form (the tests feed ids, not text)."""
    wr.add_tokenizer_model("llama")
    wr.add_token_list([f"<0x{i:02X}>" for i in range(256)])
    wr.add_token_scores([0.0] * 256)
    wr.add_token_types([int(gguf.TokenType.BYTE)] * 256)


def check_gguf(r):
    assert tf.field(r, "general.architecture") == "gemma3"
    assert tf.field(r, "gemma3.attention.sliding_window") == CFG["sliding_window"]
    assert tf.field(r, "gemma3.attention.key_length") == CFG["head_dim"]
    assert "output.weight" not in {t.name for t in r.tensors}


def build(w, window=None):
    cfg = dict(CFG)
    if window is not None:
        cfg["sliding_window"] = window
    config = transformers.Gemma3TextConfig(
        **cfg, hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
        attn_logit_softcapping=None, tie_word_embeddings=True, attention_bias=False,
        rope_scaling=None, attn_implementation="eager")
    model = tf.load(transformers.Gemma3ForCausalLM(config),
                    dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"]}))
    types = list(model.config.layer_types)
    assert types == ["sliding_attention"] * 5 + ["full_attention"], types
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(tf.OUT_DIR, "gemma3_tiny.gguf"))
    ap.add_argument("--out", default=os.path.join(tf.OUT_DIR, "gemma3_tiny.json"))
    args = ap.parse_args()
    tf.setup()

    w = make_weights(tf.Rand(SEED, f16=False))
    os.makedirs(os.path.dirname(args.gguf), exist_ok=True)
    r, sha = tf.write_gguf(args.gguf, "gemma3", "gemma3-tiny-random", meta,
                           {tf.gguf_name(k, GGUF_BLOCK): gguf_array(k, a) for k, a in w.items()},
                           f16=False, tokenizer=byte_vocab)
    check_gguf(r)

    model = build(w)
    wide = build(w, window=4096)

    text = (b"Gemma 3 interleaves five sliding-window layers with one global layer; its norms "
            b"sit on both sides...")
    assert len(text) == 100, len(text)
    cases = [
        ("single", [ord("G")]),
        # Repeats: only the positions (RoPE) tell these tokens apart.
        ("repeat", [7, 7, 7, 7, 200, 200, 200, 200, 7, 200, 7, 200]),
        ("long", list(text)),
    ]
    out_cases = []
    min_gap, window_effect = float("inf"), 0.0
    for cname, ids in cases:
        lg, lw = tf.logits(model, ids), tf.logits(wide, ids)
        if len(ids) > CFG["sliding_window"]:
            window_effect = max(window_effect, tf.max_diff(lg, lw))
        else:
            assert np.array_equal(lg, lw), f"{cname}: a window longer than the text changed logits"
        out_cases.append(tf.case(cname, ids, lg))
        min_gap = min(min_gap, tf.top1_gap(lg))
    assert window_effect > 1e-2, f"the window barely matters ({window_effect}); pick another SEED"
    print(f"a 4096 window instead of 16 moves the logits by up to {window_effect:.3f}",
          file=sys.stderr)

    tf.write_json(args.out, {
        "generator": "scripts/make_gemma3_fixture.py",
        "versions": tf.versions(gguf_version="0.10.0"),
        "model": os.path.basename(args.gguf),
        "gguf_sha256": sha,
        "seed": SEED,
        "config": CFG,
        "window_effect_max_abs_diff": window_effect,
        "min_top1_gap": min_gap,
        "logit_digits": tf.LOGIT_DIGITS,
        "cases": out_cases,
    })


if __name__ == "__main__":
    main()
