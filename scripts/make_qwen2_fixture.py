#!/usr/bin/env python3
"""Tiny random-weight Qwen2 model and its golden logits, for tests/model/test_engine_qwen2.cc.

No real Qwen2 GGUF is available to the tests, so this builds one: a 2-layer Qwen2 (hidden 32,
4 query heads and 2 KV heads of dim 8 (GQA), SwiGLU 64, vocab 256 = one token per byte, RoPE theta
1e6 (not the 10000 default, so the key must be read), RMSNorm eps 1e-6, nonzero Q/K/V biases, an
untied output.weight) with seeded random weights, all F32 so neither side adds quantization noise.
It writes it as GGUF v3 with gguf.GGUFWriter the way llama.cpp's convert_hf_to_gguf.py writes
Qwen2 (arch "qwen2", tensor names blk.N.attn_q.weight/.bias etc., Q/K rows NOT permuted: Qwen2
GGUFs keep HF's rotate_half layout and llama.cpp runs them with NEOX RoPE), then:
  1. loads that file with transformers.AutoModelForCausalLM.from_pretrained(gguf_file=...) and checks
     that every parameter equals what was written (incl. q_proj.bias and an untied lm_head);
  2. builds Qwen2ForCausalLM(config) directly from the same numpy arrays (no GGUF involved) and
     checks that both give the same logits (< 1e-5);
  3. records the GGUF-loaded model's logits at every position of three token sequences (1, 12
     and 100 tokens), rounded to 8 significant digits, and checks that top-1 and top-2 are
     separated by > 1e-3 everywhere (so the test can require top-1 equality at every position).

Pinned versions (scripts/ref_env.sh): torch 2.5.1, transformers 4.46.3, gguf 0.10.0, numpy 1.26.4, accelerate 1.1.1.
Run:  $(bash scripts/ref_env.sh) scripts/make_qwen2_fixture.py
Writes tests/fixtures/engine/qwen2_tiny.gguf (~140 KB) and tests/fixtures/engine/qwen2_tiny.json.
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

SEED = 20240611
CFG = dict(
    vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    rope_theta=1.0e6, rms_norm_eps=1e-6,
)
MIN_TOP1_GAP = 1e-3


def make_weights(rng):
    """HF-named f32 arrays (nn.Linear weights are [out, in]). Scaled so that activations stay
    O(1), attention is far from uniform, logits are O(1..10) and the biases matter."""
    D, H, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    hd = D // CFG["num_attention_heads"]
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
        w[p + "self_attn.q_proj.bias"] = vec(QD, 0.0, 0.5)
        w[p + "self_attn.k_proj.weight"] = lin(KVD, D, 1.5)
        w[p + "self_attn.k_proj.bias"] = vec(KVD, 0.0, 0.5)
        w[p + "self_attn.v_proj.weight"] = lin(KVD, D)
        w[p + "self_attn.v_proj.bias"] = vec(KVD, 0.0, 0.3)
        w[p + "self_attn.o_proj.weight"] = lin(D, QD)
        w[p + "post_attention_layernorm.weight"] = vec(D, 1.0, 0.2)
        w[p + "mlp.gate_proj.weight"] = lin(H, D)
        w[p + "mlp.up_proj.weight"] = lin(H, D)
        w[p + "mlp.down_proj.weight"] = lin(D, H)
    w["model.norm.weight"] = vec(D, 1.0, 0.2)
    w["lm_head.weight"] = lin(V, D, 3.0)
    return w


# HF name -> llama.cpp GGUF name (convert_hf_to_gguf.py / gguf-py tensor_mapping for MODEL_ARCH.QWEN2).
def gguf_name(hf):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.<weight|bias>
    l, mod, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    m = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
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
    D = CFG["hidden_size"]
    wr = gguf.GGUFWriter(path, "qwen2")
    wr.add_name("qwen2-tiny-random")
    wr.add_block_count(CFG["num_hidden_layers"])
    wr.add_context_length(CFG["max_position_embeddings"])
    wr.add_embedding_length(D)
    wr.add_feed_forward_length(CFG["intermediate_size"])
    wr.add_head_count(CFG["num_attention_heads"])
    wr.add_head_count_kv(CFG["num_key_value_heads"])
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    # Minimal byte-level BPE vocabulary, as convert_hf_to_gguf writes for Qwen2 (no merges: the
    # writer drops empty arrays). No qwen2.vocab_size key either (llama.cpp does not write one);
    # transformers takes vocab_size from the token list.
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


def check_gguf_loaded(model, w):
    sd = model.state_dict()
    missing = sorted(set(w) - set(sd))
    extra = sorted(set(sd) - set(w))
    assert not missing and not extra, (missing, extra)
    for k, a in w.items():
        got = sd[k].detach().cpu().numpy()
        assert got.dtype == np.float32 and got.shape == a.shape, (k, got.dtype, got.shape, a.shape)
        assert np.array_equal(got, a), f"{k}: GGUF-loaded weight differs from what was written"
    # The classifier is our output.weight, not tied to (or a random init instead of) the embedding.
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not np.array_equal(w["lm_head.weight"], w["model.embed_tokens.weight"])
    c = model.config
    for k, v in CFG.items():  # GGUF stores float metadata as f32 (eps reads back as 9.99999997e-07)
        want = float(np.float32(v)) if isinstance(v, float) else v
        assert getattr(c, k) == want, (k, getattr(c, k), want)
    print(f"GGUF -> transformers: {len(w)} tensors equal bit for bit; e.g. layers.0.q_proj.bias[:4] = "
          f"{sd['model.layers.0.self_attn.q_proj.bias'][:4].tolist()}", file=sys.stderr)


def sig(x, digits=8):
    return float(f"{x:.{digits}g}")


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outdir = os.path.join(root, "tests", "fixtures", "engine")
    ap.add_argument("--gguf", default=os.path.join(outdir, "qwen2_tiny.gguf"))
    ap.add_argument("--out", default=os.path.join(outdir, "qwen2_tiny.json"))
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

    d, name = os.path.split(os.path.abspath(args.gguf))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    assert type(model).__name__ == "Qwen2ForCausalLM", type(model)
    check_gguf_loaded(model, w)

    # Independent path: the same arrays straight into Qwen2ForCausalLM(config), no GGUF.
    direct = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **CFG, tie_word_embeddings=False, attn_implementation="eager")).eval()
    direct.load_state_dict({k: torch.from_numpy(a.copy()) for k, a in w.items()}, strict=True)

    text = (b"Qwen2 puts a bias on q, k and v; its GGUF keeps HF's rotate_half RoPE layout, "
            b"so llama.cpp uses NEOX")
    assert len(text) == 100, len(text)
    cases = [
        ("single", [ord("Q")]),
        # Repeats: only the positions (RoPE) tell these tokens apart.
        ("repeat", [7, 7, 7, 7, 200, 200, 200, 200, 7, 200, 7, 200]),
        ("long", list(text)),
    ]
    out_cases = []
    worst_direct, min_gap = 0.0, float("inf")
    for cname, ids in cases:
        with torch.no_grad():
            lg = model(torch.tensor([ids])).logits[0].numpy()
            ld = direct(torch.tensor([ids])).logits[0].numpy()
        assert lg.dtype == np.float32 and lg.shape == (len(ids), CFG["vocab_size"])
        dd = float(np.abs(lg.astype(np.float64) - ld).max())
        assert dd < 1e-5, f"{cname}: GGUF-loaded vs direct Qwen2ForCausalLM differ by {dd}"
        worst_direct = max(worst_direct, dd)
        srt = np.sort(lg.astype(np.float64), axis=1)
        gap = float((srt[:, -1] - srt[:, -2]).min())
        assert gap > MIN_TOP1_GAP, f"{cname}: top-1/top-2 gap {gap}; pick another SEED"
        min_gap = min(min_gap, gap)
        print(f"{cname}: {len(ids)} tokens, |logit| <= {np.abs(lg).max():.2f}, GGUF vs direct "
              f"{dd:.2e}, min top-1 gap {gap:.3f}", file=sys.stderr)
        out_cases.append({
            "name": cname,
            "ids": [int(i) for i in ids],
            "top1": [int(i) for i in lg.argmax(axis=1)],
            "logits": [[sig(float(x)) for x in row] for row in lg],
        })

    out = {
        "generator": "scripts/make_qwen2_fixture.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": getattr(gguf, "__version__", "0.10.0"), "numpy": np.__version__},
        "model": os.path.basename(args.gguf),
        "gguf_sha256": sha,
        "seed": SEED,
        "config": CFG,
        "gguf_vs_direct_max_abs_diff": worst_direct,
        "min_top1_gap": min_gap,
        "logit_digits": 8,
        "cases": out_cases,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes); GGUF vs direct max {worst_direct:.2e}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
