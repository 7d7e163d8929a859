#!/usr/bin/env python3
"""Tiny random-weight Qwen2 model with YaRN rope scaling (Qwen2.5's long-context setting) and its
golden logits, for tests/model/test_engine_qwen2_yarn.cc.

transformers' Qwen2ForCausalLM: 2 layers, hidden 64, 4 query heads and 2 KV heads of head_dim 16,
QKV biases, SwiGLU 128, vocab 130 (one token per ASCII byte, two merges), RoPE theta 10000, RMSNorm eps 1e-6,
untied classifier, rope_scaling {type: yarn, factor: 4, original_max_position_embeddings: 64} and
max_position_embeddings 256. (transformers 4.53 replaces the factor by max_position_embeddings /
original_max_position_embeddings when the latter is given, llama.cpp reads rope.scaling.factor:
the fixture makes the two agree, 256 / 64 = 4.) Default beta_fast 32, beta_slow 1 and attention
factor 0.1 ln(4) + 1. The GGUF is written as llama.cpp's convert_hf_to_gguf.py writes a Qwen2
checkpoint with YaRN: arch "qwen2", Q/K rows not permuted (NEOX RoPE), qwen2.rope.scaling.type
"yarn", qwen2.rope.scaling.factor 4, qwen2.rope.scaling.original_context_length 64. Then records
the logits at every position of three sequences (1, 12 and 100 tokens: past the original 64), and
how far YaRN moves them (the same model without rope_scaling: yarn_effect_max_abs_diff).

Pinned versions: torch 2.5.1, transformers 4.53.3, gguf 0.17.1, numpy 1.26.4 (/work/.venv-g3).
Run:  /work/.venv-g3/bin/python scripts/make_qwen2_yarn_fixture.py
Writes tests/fixtures/engine/qwen2_yarn_tiny.gguf and tests/fixtures/engine/qwen2_yarn_tiny.json;
deterministic (the JSON records the GGUF's sha256).
"""
import math
import os

import transformers

import gguf
import tiny_fixture_common as tf

SEED = 20251127
CFG = dict(vocab_size=tf.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
           rope_theta=10000.0, rms_norm_eps=1e-6)
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def make_weights(r):
    D, H, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    hd = D // CFG["num_attention_heads"]
    QD, KVD = CFG["num_attention_heads"] * hd, CFG["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": r.emb(V, D)}
    for l in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "self_attn.q_proj.weight"] = r.lin(QD, D, 2.5)
        w[p + "self_attn.q_proj.bias"] = r.vec(QD, 0.0, 0.5)
        w[p + "self_attn.k_proj.weight"] = r.lin(KVD, D, 2.5)
        w[p + "self_attn.k_proj.bias"] = r.vec(KVD, 0.0, 0.5)
        w[p + "self_attn.v_proj.weight"] = r.lin(KVD, D)
        w[p + "self_attn.v_proj.bias"] = r.vec(KVD, 0.0, 0.2)
        w[p + "self_attn.o_proj.weight"] = r.lin(D, QD)
        w[p + "post_attention_layernorm.weight"] = r.vec(D, 1.0, 0.2)
        w[p + "mlp.gate_proj.weight"] = r.lin(H, D)
        w[p + "mlp.up_proj.weight"] = r.lin(H, D)
        w[p + "mlp.down_proj.weight"] = r.lin(D, H)
    w["model.norm.weight"] = r.vec(D, 1.0, 0.2)
    w["lm_head.weight"] = r.lin(V, D, 3.0)
    return w


def gguf_tensors(w):
    return {tf.gguf_name(hf): a for hf, a in w.items()}


def meta(wr):
    tf.add_shape(wr, CFG)
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    wr.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    wr.add_rope_scaling_factor(YARN["factor"])
    wr.add_rope_scaling_orig_ctx_len(YARN["original_max_position_embeddings"])


def build(w, rope_scaling):
    return tf.load(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **CFG, rope_scaling=rope_scaling, tie_word_embeddings=False,
        attn_implementation="eager")), w)


def main():
    tf.setup()
    assert CFG["max_position_embeddings"] / YARN["original_max_position_embeddings"] == YARN["factor"]
    w = make_weights(tf.Rand(SEED))
    path = os.path.join(tf.OUT_DIR, "qwen2_yarn_tiny.gguf")
    r, sha = tf.write_gguf(path, "qwen2", "qwen2-yarn-tiny-random", meta, gguf_tensors(w))
    assert tf.field(r, "qwen2.rope.scaling.type") == "yarn"
    model, plain = build(w, YARN), build(w, None)
    rot = model.model.rotary_emb
    want_af = 0.1 * math.log(YARN["factor"]) + 1
    assert abs(rot.attention_scaling - want_af) < 1e-12, rot.attention_scaling
    cases, effect = [], 0.0
    for name, ids in [("single", [ord("Y")]), ("repeat", tf.REPEAT), ("long", list(tf.LONG_TEXT))]:
        lg = tf.logits(model, ids)
        effect = max(effect, tf.max_diff(lg, tf.logits(plain, ids)))
        cases.append(tf.case(name, ids, lg))
    assert effect > 1e-1, f"YaRN barely matters ({effect}); pick another SEED"
    print(f"no YaRN moves the logits by up to {effect:.3f}")
    tf.write_json(os.path.join(tf.OUT_DIR, "qwen2_yarn_tiny.json"), {
        "generator": "scripts/make_qwen2_yarn_fixture.py", "versions": tf.versions(),
        "model": os.path.basename(path), "gguf_sha256": sha, "seed": SEED,
        "config": dict(CFG, rope_scaling=YARN, attention_factor=want_af,
                       inv_freq=[float(x) for x in rot.inv_freq]),
        "yarn_effect_max_abs_diff": effect, "f32_vs_f64_max_abs_diff": tf.f64_drift(model, list(tf.LONG_TEXT)),
        "logit_digits": tf.LOGIT_DIGITS, "cases": cases})


if __name__ == "__main__":
    main()
