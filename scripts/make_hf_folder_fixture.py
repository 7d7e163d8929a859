#!/usr/bin/env python3
"""Tiny random-weight Hugging Face checkpoint folders and transformers' logits, for
tests/model/test_hf_folder.cc (kvbench --model DIR).

Writes tests/fixtures/hf/<name>/ as transformers' save_pretrained writes them (config.json,
model.safetensors or model-0000N-of-0000M.safetensors + model.safetensors.index.json), plus a
byte-level BPE tokenizer.json trained here with `tokenizers` and a tokenizer_config.json, and
tests/fixtures/hf/<name>.json with transformers' eager f32 logits at every position of three
prompts (1, 11 and ~40 tokens). The folders:
  - llama_f32_sharded: LlamaForCausalLM, f32, split into 2 shards by max_shard_size, llama3
    rope_scaling (original_max_position_embeddings 16, so the long prompt crosses every band of
    the llama3 frequency factors), GQA 4/2, untied lm_head, add_bos_token true.
  - qwen3_bf16: Qwen3ForCausalLM saved in bf16 (head_dim 16 != hidden / heads; q/k norm),
    tied embeddings. The reference runs transformers in f32 on the bf16-rounded weights
    (from_pretrained(torch_dtype=float32) upcasts them), which is what kvbench computes.
  - qwen2_f16: Qwen2ForCausalLM, f16, q/k/v biases (seeded like the weights), tied embeddings.
  - gemma3_f16: Gemma3ForCausalLM (text), f16, sliding window 4 on layers 0-1 and global layer 2
    (layer_types), rope_local_base_freq 100 against rope_theta 1e4, query_pre_attn_scalar 24 !=
    head_dim, norm weights stored as w around 0 (Gemma's RMSNorm multiplies by 1 + w).
  - mistral_f16: MistralForCausalLM, f16, sliding_window 5 (every layer), untied.
Also tests/fixtures/hf/mistral_f16_as_llama.gguf: the mistral_f16 folder's f16 weights as a GGUF
"llama" file the way convert_hf_to_gguf.py writes one (Q/K rows permuted for llama.cpp's
adjacent-pair RoPE, norms as F32, no sliding window: the GGUF llama path has none), read back with
gguf.GGUFReader, so the C++ test can show that both loaders give the same logits (window off).
And tests/fixtures/hf/llama_f32_sharded_as_llama.gguf: the llama_f32_sharded folder (both shards)
the same way, with its llama3 rope scaling as convert_hf_to_gguf.py writes it: a
rope_freqs.weight tensor of per-frequency factors (LlamaModel.generate_extra_tensors), so the
GGUF path's llama3 scaling is checked against the folder's (and so against transformers).
Weights are seeded and scaled so that logits are O(1..10) and attention is far from uniform.
Every folder is also reloaded with AutoModelForCausalLM.from_pretrained (the reference) and its
tokenizer.json checked with `tokenizers` (the ids are recorded for the C++ test).

Pinned versions (/work/.venv-g3): torch 2.5.1 (CPU), transformers 4.53.3, tokenizers 0.21.4,
safetensors 0.8.0, numpy 1.26.4, gguf 0.17.1 (recorded in each JSON).
Run:  /work/.venv-g3/bin/python scripts/make_hf_folder_fixture.py
"""
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import sys

import gguf
import numpy as np
import safetensors
import safetensors.numpy
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

SEED = 20251125
VOCAB = 288
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Key-value caches grow with the context; eviction policies keep the tokens that matter.",
    "Hugging Face checkpoint folders hold config.json, safetensors shards and tokenizer.json.",
    "Once upon a time there was a little model that read its weights from a folder.",
    "1234567890 numbers, punctuation! and spaces   between words?",
]
PROMPTS = [
    ("single", "A"),
    ("short", "the the the cache cache"),
    ("long", "Once upon a time, the fox read config.json: "
             "eviction keeps it."),
]
TOKENIZER_TEXTS = ["Hello, world!", "  two spaces and\ttabs\n", "numbers 12345 and caf\u00e9",
                   "<|im_start|>user\nhi<|im_end|>"]

COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
FOLDERS = {
    "llama_f32_sharded": dict(
        cls="LlamaForCausalLM", dtype=torch.float32, shard="150KB", add_bos=True,
        cfg=transformers.LlamaConfig(
            **COMMON, num_hidden_layers=2, rms_norm_eps=1e-5, rope_theta=10000.0,
            rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=16),
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=2)),
    "qwen3_bf16": dict(
        cls="Qwen3ForCausalLM", dtype=torch.bfloat16, shard=None, add_bos=False,
        cfg=transformers.Qwen3Config(
            **COMMON, num_hidden_layers=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1.0e6,
            tie_word_embeddings=True, eos_token_id=2)),
    "gemma3_f16": dict(
        cls="Gemma3ForCausalLM", dtype=torch.float16, shard=None, add_bos=True,
        cfg=transformers.Gemma3TextConfig(
            **COMMON, num_hidden_layers=3, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
            rope_local_base_freq=100.0, sliding_window=4, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True,
            bos_token_id=0, eos_token_id=2, pad_token_id=0)),
    "mistral_f16": dict(
        cls="MistralForCausalLM", dtype=torch.float16, shard=None, add_bos=True,
        cfg=transformers.MistralConfig(
            **COMMON, num_hidden_layers=2, rms_norm_eps=1e-5, rope_theta=10000.0,
            sliding_window=5, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2)),
    "qwen2_f16": dict(
        cls="Qwen2ForCausalLM", dtype=torch.float16, shard=None, add_bos=False,
        cfg=transformers.Qwen2Config(
            **COMMON, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=1.0e6,
            tie_word_embeddings=True, use_sliding_window=False, eos_token_id=2)),
}


def train_tokenizer():
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def fill_weights(model, rng, gemma):
    """Overwrites every parameter with seeded values: norms around 1 (Gemma: around 0, as it
    stores w for 1 + w), linear weights N(0, 1/in) times a gain, embeddings N(0, 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                v = rng.normal(0.0, 0.5, p.shape)
            elif "norm" in name:
                v = rng.normal(0.0 if gemma else 1.0, 0.3, p.shape)
            elif "embed_tokens" in name:
                v = rng.standard_normal(p.shape) * (0.5 if gemma else 1.0)
            else:
                gain = 1.6 if ("q_proj" in name or "k_proj" in name) else 1.0
                gain = 3.0 if "lm_head" in name else gain
                v = rng.standard_normal(p.shape) * gain / np.sqrt(p.shape[-1])
            p.copy_(torch.from_numpy(v.astype(np.float32)))


def sig(x, digits=7):
    return float(f"{x:.{digits}g}")


def write_folder(root, name, spec, tok, rng, prompts=PROMPTS):
    out = os.path.join(root, name)
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(0)
    cfg = spec["cfg"]
    cfg._attn_implementation = "eager"
    model = getattr(transformers, spec["cls"])(cfg).eval()
    fill_weights(model, rng, gemma=spec["cls"].startswith("Gemma"))
    model.to(spec["dtype"])
    kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(out, safe_serialization=True, **kw)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIALS[0], "eos_token": SPECIALS[2],
                   "add_bos_token": spec["add_bos"], "chat_template": CHATML,
                   "tokenizer_class": "PreTrainedTokenizerFast",
                   "model_max_length": 256}, f, indent=2)
    for junk in ("generation_config.json",):
        if os.path.exists(os.path.join(out, junk)):
            os.remove(os.path.join(out, junk))
    files = sorted(os.listdir(out))
    if spec["shard"]:
        assert "model.safetensors.index.json" in files and \
            sum(f.endswith(".safetensors") for f in files) == 2, files
    # The reference: the folder as transformers loads it, computed in f32.
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        out, torch_dtype=torch.float32, attn_implementation="eager").eval()
    assert type(ref).__name__ == spec["cls"], type(ref).__name__
    cases = []
    for cname, text in prompts:
        ids = tok.encode(text).ids
        if spec["add_bos"]:
            ids = [tok.token_to_id(SPECIALS[0])] + ids
        with torch.no_grad():
            lg = ref(torch.tensor([ids])).logits[0].numpy()
        assert lg.dtype == np.float32 and lg.shape == (len(ids), VOCAB)
        print(f"{name} {cname}: {len(ids)} tokens, |logit| <= {np.abs(lg).max():.2f}",
              file=sys.stderr)
        cases.append({"name": cname, "text": text, "ids": ids,
                      "top1": [int(i) for i in lg.argmax(axis=1)],
                      "logits": [[sig(float(x)) for x in row] for row in lg]})
    sha = {}
    for f in files:
        with open(os.path.join(out, f), "rb") as fh:
            sha[f] = hashlib.sha256(fh.read()).hexdigest()
    return {"architecture": spec["cls"], "dtype": str(spec["dtype"]).replace("torch.", ""),
            "files": sha, "config": json.load(open(os.path.join(out, "config.json"))),
            "cases": cases}


def permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate_half rows -> adjacent pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: llama3 scaling as frequency
    divisors (rope_freqs.weight)."""
    rs = cfg["rope_scaling"]
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama_gguf(folder, out):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        w = {}
        for shard in sorted(set(json.load(open(index))["weight_map"].values())):
            w.update(safetensors.numpy.load_file(os.path.join(folder, shard)))
    else:
        w = safetensors.numpy.load_file(os.path.join(folder, "model.safetensors"))
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    mods = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
            "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    wr = gguf.GGUFWriter(out, "llama")
    wr.add_name(os.path.basename(out)[:-len(".gguf")])
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    f32 = all(a.dtype == np.float32 for a in w.values())
    wr.add_file_type(gguf.LlamaFileType.ALL_F32 if f32 else gguf.LlamaFileType.MOSTLY_F16)
    written = {}
    if (cfg.get("rope_scaling") or {}).get("rope_type") == "llama3":
        written["rope_freqs.weight"] = llama3_rope_factors(cfg)
        wr.add_tensor("rope_freqs.weight", written["rope_freqs.weight"])
    for hf in sorted(w):
        a = w[hf]
        if hf in names:
            name = names[hf]
        else:
            parts = hf.split(".")
            name = f"blk.{parts[2]}.{mods['.'.join(parts[3:-1])]}.{parts[-1]}"
        if hf.endswith("q_proj.weight"):
            a = permute(a, cfg["num_attention_heads"])
        elif hf.endswith("k_proj.weight"):
            a = permute(a, cfg["num_key_value_heads"])
        if a.ndim == 1:
            a = a.astype(np.float32)  # exact: every f16 is an f32
        written[name] = np.ascontiguousarray(a)
        wr.add_tensor(name, written[name])
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    r = gguf.GGUFReader(out)
    assert {t.name for t in r.tensors} == set(written)
    for t in r.tensors:
        assert np.array_equal(np.asarray(t.data).reshape(written[t.name].shape), written[t.name])
    print(f"wrote {out} ({os.path.getsize(out)} bytes, {len(written)} tensors read back equal)",
          file=sys.stderr)


def main():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "tests", "fixtures", "hf")
    os.makedirs(root, exist_ok=True)
    torch.set_num_threads(1)
    tok = train_tokenizer()
    rng = np.random.default_rng(SEED)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                "numpy": np.__version__, "gguf": importlib.metadata.version("gguf")}
    tok_cases = [{"text": t, "ids": tok.encode(t).ids} for t in TOKENIZER_TEXTS]
    for name, spec in FOLDERS.items():
        fx = write_folder(root, name, spec, tok, rng)
        fx.update({"generator": "scripts/make_hf_folder_fixture.py", "versions": versions,
                   "seed": SEED, "folder": name, "logit_digits": 7,
                   "tokenizer_cases": tok_cases})
        path = os.path.join(root, name + ".json")
        with open(path, "w") as f:
            json.dump(fx, f, separators=(",", ":"))
        print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)
    write_llama_gguf(os.path.join(root, "mistral_f16"), os.path.join(root, "mistral_f16_as_llama.gguf"))
    write_llama_gguf(os.path.join(root, "llama_f32_sharded"),
                     os.path.join(root, "llama_f32_sharded_as_llama.gguf"))


if __name__ == "__main__":
    main()
