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
import hashlib
import json
import os
import sys

import numpy as np
import torch
import transformers
import gguf

SEED = 20250429
CFG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
    rope_theta=1.0e6, rms_norm_eps=1e-6,
)
MIN_TOP1_GAP = 1e-3


def make_weights(rng):
    """HF-named f32 arrays (nn.Linear weights are [out, in]). Scaled so that activations stay
    O(1), attention is far from uniform and logits are O(1..10); the q/k norm weights vary per
    channel so that dropping them (or applying them to the wrong rows) shows."""
    D, H, V, hd = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"], CFG["head_dim"]
    QD, KVD = CFG["num_attention_heads"] * hd, CFG["num_key_value_heads"] * hd

    def lin(out, inp, gain=1.0):
        return (rng.standard_normal((out, inp)) * gain / np.sqrt(inp)).astype(np.float32)

    def vec(n, mean, std):
        return (mean + std * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, D)).astype(np.float32)}
    for l in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = vec(D, 1.0, 0.2)
        w[p + "self_attn.q_proj.weight"] = lin(QD, D, 1.5)
        w[p + "self_attn.k_proj.weight"] = lin(KVD, D, 1.5)
        w[p + "self_attn.v_proj.weight"] = lin(KVD, D)
        w[p + "self_attn.o_proj.weight"] = lin(D, QD)
        w[p + "self_attn.q_norm.weight"] = vec(hd, 1.5, 0.6)
        w[p + "self_attn.k_norm.weight"] = vec(hd, 1.5, 0.6)
        w[p + "post_attention_layernorm.weight"] = vec(D, 1.0, 0.2)
        w[p + "mlp.gate_proj.weight"] = lin(H, D)
        w[p + "mlp.up_proj.weight"] = lin(H, D)
        w[p + "mlp.down_proj.weight"] = lin(D, H)
    w["model.norm.weight"] = vec(D, 1.0, 0.2)
    w["lm_head.weight"] = lin(V, D, 3.0)
    return w


# HF name -> llama.cpp GGUF name (gguf-py tensor_mapping / llama.cpp LLM_ARCH_QWEN3).
def gguf_name(hf):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.weight
    l, mod, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    m = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}[mod]
    return f"blk.{l}.{m}.{kind}"


def byte_tokens():
    """GPT-2 byte-level alphabet (bytes_to_unicode); token id i is byte i."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    enc = dict(zip(bs, (chr(c) for c in cs)))
    return [enc[b] for b in range(256)]


def write_gguf(path, w):
    wr = gguf.GGUFWriter(path, "qwen3")
    wr.add_name("qwen3-tiny-random")
    wr.add_block_count(CFG["num_hidden_layers"])
    wr.add_context_length(CFG["max_position_embeddings"])
    wr.add_embedding_length(CFG["hidden_size"])
    wr.add_feed_forward_length(CFG["intermediate_size"])
    wr.add_head_count(CFG["num_attention_heads"])
    wr.add_head_count_kv(CFG["num_key_value_heads"])
    wr.add_key_length(CFG["head_dim"])
    wr.add_value_length(CFG["head_dim"])
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("qwen2")
    wr.add_token_list(byte_tokens())
    wr.add_token_types([int(gguf.TokenType.NORMAL)] * 256)
    wr.add_eos_token_id(ord("\n"))
    for hf, a in w.items():
        wr.add_tensor(gguf_name(hf), np.ascontiguousarray(a))  # numpy [out, in] = ggml ne [in, out]
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def check_gguf(path, w):
    r = gguf.GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    want = {gguf_name(k): a for k, a in w.items()}
    assert set(tensors) == set(want), sorted(set(tensors) ^ set(want))
    for name, a in want.items():
        t = tensors[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, (name, t.tensor_type)
        assert list(t.shape) == list(reversed(a.shape)), (name, list(t.shape), a.shape)  # ggml ne
        assert np.array_equal(np.asarray(t.data).reshape(a.shape), a), name
    def field(key):
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()
    assert field("general.architecture") == "qwen3"
    assert field("qwen3.attention.key_length") == CFG["head_dim"]
    assert field("qwen3.embedding_length") == CFG["hidden_size"]
    assert "qwen3.vocab_size" not in r.fields  # like llama.cpp: vocab from token_embd
    print(f"GGUF read back: {len(want)} tensors equal bit for bit, key_length "
          f"{field('qwen3.attention.key_length')}", file=sys.stderr)


def sig(x, digits=8):
    return float(f"{x:.{digits}g}")


def build(w, ones_qk_norm=False):
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **CFG, tie_word_embeddings=False, attention_bias=False,
        attn_implementation="eager")).eval()
    sd = {k: torch.from_numpy(a.copy()) for k, a in w.items()}
    if ones_qk_norm:
        for k in sd:
            if k.endswith("q_norm.weight") or k.endswith("k_norm.weight"):
                sd[k] = torch.ones_like(sd[k])
    model.load_state_dict(sd, strict=True)
    assert model.model.layers[0].self_attn.head_dim == CFG["head_dim"]
    assert model.model.layers[0].self_attn.q_proj.out_features == 128
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outdir = os.path.join(root, "tests", "fixtures", "engine")
    ap.add_argument("--gguf", default=os.path.join(outdir, "qwen3_tiny.gguf"))
    ap.add_argument("--out", default=os.path.join(outdir, "qwen3_tiny.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic f32 summation order

    rng = np.random.default_rng(SEED)
    w = make_weights(rng)
    os.makedirs(os.path.dirname(args.gguf), exist_ok=True)
    write_gguf(args.gguf, w)
    with open(args.gguf, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    print(f"wrote {args.gguf} ({os.path.getsize(args.gguf)} bytes, sha256 {sha[:16]}...)", file=sys.stderr)
    check_gguf(args.gguf, w)

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
        with torch.no_grad():
            lg = model(torch.tensor([ids])).logits[0].numpy()
            lp = plain(torch.tensor([ids])).logits[0].numpy()
        assert lg.dtype == np.float32 and lg.shape == (len(ids), CFG["vocab_size"])
        qk_effect = max(qk_effect, float(np.abs(lg.astype(np.float64) - lp).max()))
        srt = np.sort(lg.astype(np.float64), axis=1)
        gap = float((srt[:, -1] - srt[:, -2]).min())
        assert gap > MIN_TOP1_GAP, f"{cname}: top-1/top-2 gap {gap}; pick another SEED"
        min_gap = min(min_gap, gap)
        print(f"{cname}: {len(ids)} tokens, |logit| <= {np.abs(lg).max():.2f}, "
              f"min top-1 gap {gap:.3f}", file=sys.stderr)
        out_cases.append({
            "name": cname,
            "ids": [int(i) for i in ids],
            "top1": [int(i) for i in lg.argmax(axis=1)],
            "logits": [[sig(float(x)) for x in row] for row in lg],
        })
    assert qk_effect > 1e-2, f"q/k norm weights barely matter ({qk_effect}); pick another SEED"
    print(f"q/k norm weights set to 1 move the logits by up to {qk_effect:.3f}", file=sys.stderr)

    out = {
        "generator": "scripts/make_qwen3_fixture.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": getattr(gguf, "__version__", "0.10.0"), "numpy": np.__version__},
        "model": os.path.basename(args.gguf),
        "gguf_sha256": sha,
        "seed": SEED,
        "config": CFG,
        "qk_norm_ones_max_abs_diff": qk_effect,
        "min_top1_gap": min_gap,
        "logit_digits": 8,
        "cases": out_cases,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
