"""Shared pieces of scripts/make_{mistral,phi3,qwen2_yarn,qwen3,gemma3}_fixture.py: tiny
random-weight models written as GGUF with gguf's Python writer and transformers' eager logits as a
golden JSON.

By default 2-D weights are F16 and 1-D F32, as convert_hf_to_gguf.py writes an f16 model, and the
HF model gets the very values the GGUF holds (2-D weights rounded to f16 and widened back to f32),
so the two sides differ only in f32 summation order; with f16=False (Qwen3, Gemma 3) every tensor
is F32. Token id i < 128 is byte i of a GPT-2 byte-level alphabet (ASCII), ids 128 and 129 two
merges, so prompts are plain ASCII text (the Qwen3 fixture: all 256 bytes, no merges).
"""
import copy
import hashlib
import json
import os
import sys

import numpy as np
import torch
import transformers
import gguf

# Token ids 0-127: the ASCII bytes; 128 and 129: two merged tokens ("Ġt", "he"), so that the GGUF
# carries a real byte-level BPE (tokenizer.ggml.merges) and kvbench's CLI can tokenize ASCII text.
MERGES = ["Ġ t", "h e"]
VOCAB = 130
MIN_TOP1_GAP = 1e-3
LOGIT_DIGITS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "engine")

# 100 ASCII bytes: the long prompt of every family (positions far past the small windows and
# original contexts the fixtures use).
LONG_TEXT = (b"Eviction studies need the models people evaluate: Mistral slides, Phi-3 rotates "
             b"long, Qwen2 stretch.")
assert len(LONG_TEXT) == 100, len(LONG_TEXT)
REPEAT = [7, 7, 7, 7, 100, 100, 100, 100, 7, 100, 7, 100]  # only RoPE tells these apart


def versions(gguf_version="0.17.1"):
    """gguf-py has no __version__: the caller names the pinned version its docstring asks for."""
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "gguf": gguf.__version__ if hasattr(gguf, "__version__") else gguf_version,
            "numpy": np.__version__}


def f16_exact(a):
    """The f32 values an F16 GGUF tensor holds."""
    return a.astype(np.float16).astype(np.float32)


class Rand:
    """Seeded weights scaled so that activations stay O(1) and logits O(1..10); 2-D ones hold
    f16 values unless f16=False (an F32 GGUF)."""

    def __init__(self, seed, f16=True):
        self.rng = np.random.default_rng(seed)
        self.exact = f16_exact if f16 else (lambda a: a.astype(np.float32))

    def lin(self, out, inp, gain=1.0):
        return self.exact(self.rng.standard_normal((out, inp)) * gain / np.sqrt(inp))

    def vec(self, n, mean, std):
        return (mean + std * self.rng.standard_normal(n)).astype(np.float32)

    def emb(self, v, d, scale=1.0):
        return self.exact(self.rng.standard_normal((v, d)) * scale)


def byte_tokens(count=128, merges=MERGES):
    """GPT-2 byte-level alphabet (bytes_to_unicode); token id i < count is byte i, then merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    enc = dict(zip(bs, (chr(c) for c in cs)))
    return [enc[b] for b in range(count)] + [m.replace(" ", "") for m in merges]


def gpt2_tokenizer(pre="default", count=128, merges=MERGES):
    """A tokenizer(writer) for write_gguf: the byte-level BPE of byte_tokens(count, merges), as
    convert_hf_to_gguf writes one (no merges key when there are none)."""
    def add(wr):
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre(pre)
        wr.add_token_list(byte_tokens(count, merges))
        if merges:
            wr.add_token_merges(merges)
        wr.add_token_types([int(gguf.TokenType.NORMAL)] * (count + len(merges)))
    return add


# HF name -> llama.cpp GGUF name (gguf-py tensor_mapping) of the Llama-like families; a family
# whose blocks differ passes its own table built on GGUF_BLOCK (Phi-3's fused projections, Gemma
# 3's four norms).
GGUF_FIXED = {"model.embed_tokens.weight": "token_embd.weight",
              "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
GGUF_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf, block=GGUF_BLOCK):
    if hf in GGUF_FIXED:
        return GGUF_FIXED[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.<weight|bias>
    return f"blk.{parts[2]}.{block['.'.join(parts[3:-1])]}.{parts[-1]}"


def add_shape(wr, cfg):
    """The GGUF keys every family's meta(writer) starts with, from its HF config."""
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])


def write_gguf(path, arch, name, meta, tensors, f16=True, tokenizer=gpt2_tokenizer()):
    """meta(writer) adds the architecture's keys, tokenizer(writer) the vocabulary (EOS: the
    newline byte); tensors: GGUF name -> f32 array (numpy [out, in] = ggml ne [in, out]); 2-D
    arrays are written as F16 unless f16=False. Reads the file back and checks every tensor (type,
    shape, values) bit for bit; returns the reader and the file's sha256."""
    wr = gguf.GGUFWriter(path, arch)
    wr.add_name(name)
    meta(wr)
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    tokenizer(wr)
    wr.add_eos_token_id(ord("\n"))
    for n, a in tensors.items():
        a = np.ascontiguousarray(a)
        wr.add_tensor(n, a.astype(np.float16) if f16 and a.ndim == 2 else a.astype(np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    r = gguf.GGUFReader(path)  # read back: every tensor bit for bit
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(tensors), sorted(set(got) ^ set(tensors))
    for n, a in tensors.items():
        t = got[n]
        want_type = gguf.GGMLQuantizationType.F16 if f16 and a.ndim == 2 else \
            gguf.GGMLQuantizationType.F32
        assert t.tensor_type == want_type, (n, t.tensor_type, want_type)
        assert list(t.shape) == list(reversed(a.shape)), (n, list(t.shape), a.shape)
        assert np.array_equal(np.asarray(t.data).reshape(a.shape).astype(np.float32), a), n
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    print(f"wrote {path} ({os.path.getsize(path)} bytes), {len(tensors)} tensors read back equal",
          file=sys.stderr)
    return r, sha


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()


def load(model, w):
    model.load_state_dict({k: torch.from_numpy(a.copy()) for k, a in w.items()}, strict=True)
    return model.eval()


def logits(model, ids):
    with torch.no_grad():
        lg = model(torch.tensor([ids])).logits[0].numpy()
    assert lg.dtype == np.float32 and lg.shape == (len(ids), model.config.vocab_size)
    return lg


def f64_drift(model, ids):
    """How far transformers' own f32 logits sit from the same model in f64: the fixture's
    conditioning. A tolerance of 1e-4 means something only where this is well below it."""
    import copy
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(torch.tensor([ids])).logits[0].numpy()
    return float(np.abs(logits(model, ids).astype(np.float64) - ref).max())


def sig(x):
    return float(f"{x:.{LOGIT_DIGITS}g}")


def top1_gap(lg):
    """The smallest top-1/top-2 logit gap over the positions of lg."""
    srt = np.sort(lg.astype(np.float64), axis=1)
    return float((srt[:, -1] - srt[:, -2]).min())


def case(name, ids, lg):
    """A golden case; the top-1/top-2 gap must exceed MIN_TOP1_GAP at every position so that the
    C++ test can require top-1 equality everywhere."""
    gap = top1_gap(lg)
    assert gap > MIN_TOP1_GAP, f"{name}: top-1/top-2 gap {gap}; pick another SEED"
    print(f"{name}: {len(ids)} tokens, |logit| <= {np.abs(lg).max():.2f}, min top-1 gap {gap:.3f}",
          file=sys.stderr)
    return {"name": name, "ids": [int(i) for i in ids], "top1": [int(i) for i in lg.argmax(1)],
            "logits": [[sig(float(x)) for x in row] for row in lg]}


def max_diff(a, b):
    return float(np.abs(a.astype(np.float64) - b).max())


def write_json(path, out):
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


def setup():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic f32 summation order
    os.makedirs(OUT_DIR, exist_ok=True)
