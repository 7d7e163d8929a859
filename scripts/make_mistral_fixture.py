#!/usr/bin/env python3
"""Tiny random-weight Mistral model and its golden logits, for tests/model/test_engine_mistral.cc.

Mistral v0.1 is Llama with a sliding window on every layer: transformers' MistralForCausalLM with
sliding_window 8 (eager attention: a query sees itself and the 7 positions before), 2 layers,
hidden 64, 4 query heads and 2 KV heads of head_dim 16, SwiGLU 128, vocab 130 (one token per
ASCII byte, two merges), RoPE theta 10000, RMSNorm eps 1e-5, untied classifier. The GGUF is
written the way llama.cpp's convert_hf_to_gguf.py writes a Mistral checkpoint: arch "llama", Q/K rows permuted
for llama.cpp's interleaved (NORM) RoPE (LlamaModel.permute), llama.attention.sliding_window = 8.
Then records MistralForCausalLM's logits at every position of three sequences (1, 12 and 100
tokens; 100 tokens span 12 windows), and how far the window moves them (the same model without a
window: window_effect_max_abs_diff), so the C++ test can show that dropping the window fails.

Pinned versions: torch 2.5.1, transformers 4.53.3, gguf 0.17.1, numpy 1.26.4 (/work/.venv-g3).
Run:  /work/.venv-g3/bin/python scripts/make_mistral_fixture.py
Writes tests/fixtures/engine/mistral_tiny.gguf and tests/fixtures/engine/mistral_tiny.json;
deterministic (the JSON records the GGUF's sha256).
"""
import os

import numpy as np
import transformers

import tiny_fixture_common as tf

SEED = 20251125
CFG = dict(vocab_size=tf.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
           max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=8)


def make_weights(r):
    D, H, V, hd = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"], CFG["head_dim"]
    QD, KVD = CFG["num_attention_heads"] * hd, CFG["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": r.emb(V, D)}
    for l in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "self_attn.q_proj.weight"] = r.lin(QD, D, 2.0)
        w[p + "self_attn.k_proj.weight"] = r.lin(KVD, D, 2.0)
        w[p + "self_attn.v_proj.weight"] = r.lin(KVD, D)
        w[p + "self_attn.o_proj.weight"] = r.lin(D, QD)
        w[p + "post_attention_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "mlp.gate_proj.weight"] = r.lin(H, D)
        w[p + "mlp.up_proj.weight"] = r.lin(H, D)
        w[p + "mlp.down_proj.weight"] = r.lin(D, H)
    w["model.norm.weight"] = r.vec(D, 1.0, 0.2)
    w["lm_head.weight"] = r.lin(V, D, 3.0)
    return w


def permute(a, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate_half rows -> llama.cpp pairs."""
    return a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:]).swapaxes(1, 2) \
        .reshape(a.shape)


def gguf_tensors(w):
    """GGUF names; Q/K rows permuted as convert_hf_to_gguf.py does for arch "llama"."""
    heads = {"self_attn.q_proj": CFG["num_attention_heads"],
             "self_attn.k_proj": CFG["num_key_value_heads"]}
    out = {}
    for hf, a in w.items():
        n_head = heads.get(".".join(hf.split(".")[3:-1]))
        out[tf.gguf_name(hf)] = permute(a, n_head) if n_head else a
    return out


def meta(wr):
    tf.add_shape(wr, CFG)
    wr.add_rope_dimension_count(CFG["head_dim"])
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    wr.add_sliding_window(CFG["sliding_window"])


def build(w, window):
    cfg = dict(CFG, sliding_window=window)
    return tf.load(transformers.MistralForCausalLM(transformers.MistralConfig(
        **cfg, tie_word_embeddings=False, attn_implementation="eager")), w)


def main():
    tf.setup()
    w = make_weights(tf.Rand(SEED))
    path = os.path.join(tf.OUT_DIR, "mistral_tiny.gguf")
    r, sha = tf.write_gguf(path, "llama", "mistral-tiny-random", meta, gguf_tensors(w))
    assert tf.field(r, "llama.attention.sliding_window") == CFG["sliding_window"]
    model, unwindowed = build(w, CFG["sliding_window"]), build(w, None)
    cases, effect = [], 0.0
    for name, ids in [("single", [ord("M")]), ("repeat", tf.REPEAT), ("long", list(tf.LONG_TEXT))]:
        lg = tf.logits(model, ids)
        effect = max(effect, tf.max_diff(lg, tf.logits(unwindowed, ids)))
        cases.append(tf.case(name, ids, lg))
    assert effect > 1e-1, f"the window barely matters ({effect}); pick another SEED"
    print(f"no window moves the logits by up to {effect:.3f}")
    tf.write_json(os.path.join(tf.OUT_DIR, "mistral_tiny.json"), {
        "generator": "scripts/make_mistral_fixture.py", "versions": tf.versions(),
        "model": os.path.basename(path), "gguf_sha256": sha, "seed": SEED, "config": CFG,
        "window_effect_max_abs_diff": effect, "f32_vs_f64_max_abs_diff": tf.f64_drift(model, list(tf.LONG_TEXT)),
        "logit_digits": tf.LOGIT_DIGITS, "cases": cases})


if __name__ == "__main__":
    main()
