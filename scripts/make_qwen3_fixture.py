#!/usr/bin/env python3
"""Tiny random-weight Qwen3 model and its golden logits, for tests/model/test_engine_qwen3.cc.

Like scripts/make_qwen2_fixture.py, but for the Qwen3 family: a 2-layer Qwen3 (hidden 64, 4 query
heads and 2 KV heads of head_dim 32, so q_dim = 128 != hidden: head_dim is NOT hidden / heads and
must come from qwen3.attention.key_length; SwiGLU 128, vocab 256 = one token per byte, RoPE theta
1e6, RMSNorm eps 1e-6, no Q/K/V biases, per-head q_norm / k_norm weights [head_dim] far from 1,
an untied output.weight) with seeded random weights, all F32 so neither side adds quantization
noise. It writes GGUF v3 with gguf.GGUFWriter the way llama.cpp's convert_hf_to_gguf.py writes
Qwen3 (arch "qwen3", llama.cpp's LLM_ARCH_QWEN3 tensor names incl. blk.N.attn_q_norm.weight and
blk.N.attn_k_norm.weight, Q/K rows NOT permuted: Qwen GGUFs keep HF's rotate_half layout and
llama.cpp runs them with NEOX RoPE; qwen3.attention.key_length / value_length = head_dim), then:
  1. reads the file back with gguf.GGUFReader and checks every tensor (name, shape, bytes) and the
     metadata the engine reads. (gguf 0.10.0 predates Qwen3, so transformers cannot load a qwen3
     GGUF through it; the golden comes from the same arrays loaded into Qwen3ForCausalLM.)
  2. builds Qwen3ForCausalLM(config) from those numpy arrays (strict load_state_dict) and records
     its logits at every position of three token sequences (1, 12 and 100 tokens), rounded to 8
     significant digits, and checks that top-1 and top-2 are separated by > 1e-3 everywhere (so
     the test can require top-1 equality at every position);
  3. checks that the q/k norms matter: the same model with q_norm and k_norm set to 1 moves the
     logits by more than 1e-2 (recorded as qk_norm_ones_max_abs_diff).

Pinned versions (.venv-qwen3; Qwen3 needs transformers >= 4.51, newer than .venv-ref's 4.46.3):
torch 2.5.1, transformers 4.53.3 (with tokenizers 0.21.4), gguf 0.10.0, numpy 1.26.4,
sentencepiece 0.2.0 (gguf 0.10.0 imports it).
Run:  python3 -m venv .venv-qwen3 && .venv-qwen3/bin/pip install torch==2.5.1 \
        transformers==4.53.3 tokenizers==0.21.4 gguf==0.10.0 numpy==1.26.4 sentencepiece==0.2.0
      .venv-qwen3/bin/python scripts/make_qwen3_fixture.py
Writes tests/fixtures/engine/qwen3_tiny.gguf (~530 KB) and tests/fixtures/engine/qwen3_tiny.json.
Deterministic: rerunning reproduces both files byte for byte (the JSON records the GGUF's sha256).
"""
import argparse
import os
import sys

import numpy as np
import transformers

import tiny_fixture_common as tf

SEED = 20250429
CFG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
    rope_theta=1.0e6, rms_norm_eps=1e-6,
)


def make_weights(r):
    """HF-named f32 arrays (nn.Linear weights are [out, in]). Scaled so that activations stay
    O(1), attention is far from uniform and logits are O(1..10); the q/k norm weights vary per
    channel so that dropping them (or applying them to the wrong rows) shows."""
    D, H, V, hd = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"], CFG["head_dim"]
    QD, KVD = CFG["num_attention_heads"] * hd, CFG["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": r.emb(V, D)}
    for l in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "self_attn.q_proj.weight"] = r.lin(QD, D, 1.5)
        w[p + "self_attn.k_proj.weight"] = r.lin(KVD, D, 1.5)
        w[p + "self_attn.v_proj.weight"] = r.lin(KVD, D)
        w[p + "self_attn.o_proj.weight"] = r.lin(D, QD)
        w[p + "self_attn.q_norm.weight"] = r.vec(hd, 1.5, 0.6)
        w[p + "self_attn.k_norm.weight"] = r.vec(hd, 1.5, 0.6)
        w[p + "post_attention_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "mlp.gate_proj.weight"] = r.lin(H, D)
        w[p + "mlp.up_proj.weight"] = r.lin(H, D)
        w[p + "mlp.down_proj.weight"] = r.lin(D, H)
    w["model.norm.weight"] = r.vec(D, 1.0, 0.2)
    w["lm_head.weight"] = r.lin(V, D, 3.0)
    return w


def meta(wr):
    tf.add_shape(wr, CFG)
    wr.add_key_length(CFG["head_dim"])
    wr.add_value_length(CFG["head_dim"])
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])


def check_gguf(r):
    assert tf.field(r, "general.architecture") == "qwen3"
    assert tf.field(r, "qwen3.attention.key_length") == CFG["head_dim"]
    assert tf.field(r, "qwen3.embedding_length") == CFG["hidden_size"]
    assert "qwen3.vocab_size" not in r.fields  # like llama.cpp: vocab from token_embd
    print(f"GGUF read back: key_length {tf.field(r, 'qwen3.attention.key_length')}",
          file=sys.stderr)


def build(w, ones_qk_norm=False):
    if ones_qk_norm:
        w = {k: np.ones_like(a) if k.endswith(("q_norm.weight", "k_norm.weight")) else a
             for k, a in w.items()}
    model = tf.load(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **CFG, tie_word_embeddings=False, attention_bias=False,
        attn_implementation="eager")), w)
    assert model.model.layers[0].self_attn.head_dim == CFG["head_dim"]
    assert model.model.layers[0].self_attn.q_proj.out_features == 128
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(tf.OUT_DIR, "qwen3_tiny.gguf"))
    ap.add_argument("--out", default=os.path.join(tf.OUT_DIR, "qwen3_tiny.json"))
    args = ap.parse_args()
    tf.setup()

    w = make_weights(tf.Rand(SEED, f16=False))
    os.makedirs(os.path.dirname(args.gguf), exist_ok=True)
    r, sha = tf.write_gguf(args.gguf, "qwen3", "qwen3-tiny-random", meta,
                           {tf.gguf_name(k): a for k, a in w.items()}, f16=False,
                           tokenizer=tf.gpt2_tokenizer(pre="qwen2", count=256, merges=[]))
    check_gguf(r)

    model = build(w)
    plain = build(w, ones_qk_norm=True)

    text = (b"Qwen3 drops the QKV bias and RMS-normalises every query and key head before RoPE; "
            b"head_dim: its own.")
    assert len(text) == 100, len(text)
    cases = [
        ("single", [ord("Q")]),
        # Repeats: only the positions (RoPE) tell these tokens apart.
        ("repeat", [7, 7, 7, 7, 200, 200, 200, 200, 7, 200, 7, 200]),
        ("long", list(text)),
    ]
    out_cases = []
    min_gap, qk_effect = float("inf"), 0.0
    for cname, ids in cases:
        lg = tf.logits(model, ids)
        qk_effect = max(qk_effect, tf.max_diff(lg, tf.logits(plain, ids)))
        out_cases.append(tf.case(cname, ids, lg))
        min_gap = min(min_gap, tf.top1_gap(lg))
    assert qk_effect > 1e-2, f"q/k norm weights barely matter ({qk_effect}); pick another SEED"
    print(f"q/k norm weights set to 1 move the logits by up to {qk_effect:.3f}", file=sys.stderr)

    tf.write_json(args.out, {
        "generator": "scripts/make_qwen3_fixture.py",
        "versions": tf.versions(gguf_version="0.10.0"),
        "model": os.path.basename(args.gguf),
        "gguf_sha256": sha,
        "seed": SEED,
        "config": CFG,
        "qk_norm_ones_max_abs_diff": qk_effect,
        "min_top1_gap": min_gap,
        "logit_digits": tf.LOGIT_DIGITS,
        "cases": out_cases,
    })


if __name__ == "__main__":
    main()
