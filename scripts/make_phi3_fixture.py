#!/usr/bin/env python3
"""Tiny random-weight Phi-3 model (LongRoPE) and its golden logits, for
tests/model/test_engine_phi3.cc.

transformers' Phi3ForCausalLM: 2 layers, hidden 64, 2 query heads and 1 KV head of head_dim 32,
partial_rotary_factor 0.5 (16 rotated dims: 8 LongRoPE factors per set), fused qkv_proj and
gate_up_proj (SwiGLU 96), vocab 130 (one token per ASCII byte, two merges), RMSNorm eps 1e-5, untied
classifier, max_position_embeddings 256 over original_max_position_embeddings 32 with
rope_scaling longrope (short and long factor sets far from 1), sliding_window 512 (covers the
context: no effect). The GGUF is written as llama.cpp's convert_hf_to_gguf.py writes Phi-3
(Phi3MiniModel): arch "phi3", blk.N.attn_qkv.weight (Q rows, K rows, V rows) and blk.N.ffn_up.weight
(gate rows, then up), no Q/K permutation (NEOX RoPE), phi3.rope.dimension_count 16,
rope_factors_long.weight / rope_factors_short.weight, phi3.rope.scaling.original_context_length
and phi3.rope.scaling.attn_factor = sqrt(1 + ln(256/32) / ln(32)), phi3.attention.sliding_window.

Which factor set: llama.cpp and kvbench use the long set for the whole run when the context in
use (kvbench: context_length, 256) exceeds the original 32; transformers picks per call by the
current length (short up to 32 tokens). So:
  - "cases": the logits kvbench must reproduce, with the long set at every length: the 100-token
    case is transformers as it runs (100 > 32: long); for the 1- and 12-token cases transformers'
    short set is replaced by the long one (rotary_emb.original_inv_freq = the long inv_freq);
  - "short_cases": transformers as it runs on the 1- and 12-token cases (short set), for the test
    that loads rope_factors_short.weight into the engine.
Also records how far the long set, the attention factor and the gate/up order move the logits.

Pinned versions: torch 2.5.1, transformers 4.53.3, gguf 0.17.1, numpy 1.26.4 (/work/.venv-g3).
Run:  /work/.venv-g3/bin/python scripts/make_phi3_fixture.py
Writes tests/fixtures/engine/phi3_tiny.gguf and tests/fixtures/engine/phi3_tiny.json;
deterministic (the JSON records the GGUF's sha256).
"""
import math
import os

import numpy as np
import torch
import transformers

import tiny_fixture_common as tf

SEED = 20251126
ROT = 16
CFG = dict(vocab_size=tf.VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
           original_max_position_embeddings=32, rope_theta=10000.0, rms_norm_eps=1e-5,
           partial_rotary_factor=0.5, sliding_window=512)
SHORT = [1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7]
LONG = [1.0, 1.3, 1.9, 2.8, 4.2, 6.0, 8.5, 12.0]


def make_weights(r):
    D, H, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    hd = D // CFG["num_attention_heads"]
    QD, KVD = CFG["num_attention_heads"] * hd, CFG["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": r.emb(V, D)}
    for l in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "self_attn.qkv_proj.weight"] = np.concatenate(
            [r.lin(QD, D, 1.5), r.lin(KVD, D, 1.5), r.lin(KVD, D)])
        w[p + "self_attn.o_proj.weight"] = r.lin(D, QD)
        w[p + "post_attention_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "mlp.gate_up_proj.weight"] = np.concatenate([r.lin(H, D), r.lin(H, D)])
        w[p + "mlp.down_proj.weight"] = r.lin(D, H)
    w["model.norm.weight"] = r.vec(D, 1.0, 0.2)
    w["lm_head.weight"] = r.lin(V, D, 3.0)
    return w


def gguf_tensors(w):
    block = dict(tf.GGUF_BLOCK, **{"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"})
    out = {"rope_factors_long.weight": np.array(LONG, np.float32),
           "rope_factors_short.weight": np.array(SHORT, np.float32)}
    out.update({tf.gguf_name(hf, block): a for hf, a in w.items()})
    return out


def attn_factor():
    scale = CFG["max_position_embeddings"] / CFG["original_max_position_embeddings"]
    return math.sqrt(1 + math.log(scale) / math.log(CFG["original_max_position_embeddings"]))


def meta(wr):
    tf.add_shape(wr, CFG)
    wr.add_rope_dimension_count(ROT)
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    wr.add_rope_scaling_orig_ctx_len(CFG["original_max_position_embeddings"])
    wr.add_rope_scaling_attn_factors(attn_factor())
    wr.add_sliding_window(CFG["sliding_window"])


def build(w, long_factor=LONG, force_long=False, swap_gate_up=False):
    cfg = transformers.Phi3Config(
        **CFG, rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": long_factor},
        tie_word_embeddings=False, attn_implementation="eager", pad_token_id=0, bos_token_id=1,
        eos_token_id=10)
    if swap_gate_up:
        H = CFG["intermediate_size"]
        w = {k: (np.concatenate([a[H:], a[:H]]) if k.endswith("gate_up_proj.weight") else a)
             for k, a in w.items()}
    model = tf.load(transformers.Phi3ForCausalLM(cfg), w)
    rot = model.model.rotary_emb
    assert abs(rot.attention_scaling - attn_factor()) < 1e-12, rot.attention_scaling
    assert rot.inv_freq.numel() == ROT // 2
    if force_long:  # the set kvbench fixes for the run, also below the original context
        long_inv, _ = rot.rope_init_fn(cfg, None, seq_len=CFG["original_max_position_embeddings"] + 1)
        rot.original_inv_freq = long_inv
    return model


def main():
    tf.setup()
    w = make_weights(tf.Rand(SEED))
    path = os.path.join(tf.OUT_DIR, "phi3_tiny.gguf")
    r, sha = tf.write_gguf(path, "phi3", "phi3-tiny-random", meta, gguf_tensors(w))
    assert tf.field(r, "phi3.rope.dimension_count") == ROT
    natural, forced = build(w), build(w, force_long=True)
    no_long, swapped = build(w, long_factor=SHORT), build(w, swap_gate_up=True)
    long_ids = list(tf.LONG_TEXT)
    prompts = [("single", [ord("P")]), ("repeat", tf.REPEAT), ("long", long_ids)]
    cases, short_cases = [], []
    for name, ids in prompts:
        lg = tf.logits(forced, ids)
        if len(ids) > CFG["original_max_position_embeddings"]:
            assert np.array_equal(lg, tf.logits(natural, ids)), "forcing must not change > 32"
        else:
            short_cases.append(tf.case(name + "_short", ids, tf.logits(natural, ids)))
        cases.append(tf.case(name, ids, lg))
    lg = tf.logits(natural, long_ids)
    effects = {
        "short_factors_at_100_tokens": tf.max_diff(lg, tf.logits(no_long, long_ids)),
        "gate_up_swapped": tf.max_diff(lg, tf.logits(swapped, long_ids)),
        "long_vs_short_at_12_tokens": tf.max_diff(tf.logits(forced, tf.REPEAT),
                                                  tf.logits(natural, tf.REPEAT)),
    }
    for k, v in effects.items():
        print(f"{k}: logits move by up to {v:.3f}")
        assert v > 1e-2, f"{k} barely matters ({v}); pick another SEED or factors"
    tf.write_json(os.path.join(tf.OUT_DIR, "phi3_tiny.json"), {
        "generator": "scripts/make_phi3_fixture.py", "versions": tf.versions(),
        "model": os.path.basename(path), "gguf_sha256": sha, "seed": SEED,
        "config": dict(CFG, rope_dimension_count=ROT, short_factor=SHORT, long_factor=LONG,
                       attention_factor=attn_factor()),
        "effects_max_abs_diff": effects, "f32_vs_f64_max_abs_diff": tf.f64_drift(natural, list(tf.LONG_TEXT)),
        "logit_digits": tf.LOGIT_DIGITS, "cases": cases,
        "short_cases": short_cases})


if __name__ == "__main__":
    main()
