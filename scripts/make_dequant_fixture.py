#!/usr/bin/env python3
# Writes the golden files of the dequantization tests (tests/unit/test_dequant.cc,
# tests/unit/test_gguf.cc and tests/model/test_gguf_smollm2.cc). The reference is gguf-py's numpy
# `gguf.quants.dequantize`, pinned: gguf==0.10.0, numpy==1.26.4 (also in scripts/ref_env.sh; the
# script refuses other versions). gguf-py 0.10.0 dequantizes every type kvbench supports (F32,
# F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), so no
# type needs a hand-written reference here. Rerun with either environment:
#   $(bash scripts/ref_env.sh) scripts/make_dequant_fixture.py
#   python3 -m venv .venv-gguf && .venv-gguf/bin/pip install gguf==0.10.0 numpy==1.26.4 \
#       sentencepiece==0.2.3 && .venv-gguf/bin/python scripts/make_dequant_fixture.py
# (gguf 0.10.0 imports sentencepiece at import time; it plays no part in dequantization.)
"""Golden dequantization fixtures.

tests/fixtures/dequant/<TYPE>.bin, all little-endian:
    u32 ggml type id, u32 n (elements), u32 raw_bytes, raw_bytes bytes of blocks, n f32 expected
tests/fixtures/dequant/manifest.json: versions, seed and file list.
tests/fixtures/dequant/smollm2_samples.json (when the model is present): 64 (tensor, index,
value) samples of two SmolLM2 tensors dequantized by gguf-py, and each tensor's float64 sum.
"""
import argparse
import importlib.metadata
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "dequant")
SEED = 20240611
PINS = {"gguf": "0.10.0", "numpy": "1.26.4"}
N_BLOCKS = 4          # quantized types: blocks per fixture
N_SCALAR = 128        # F32/F16/BF16: elements per fixture

# Byte offsets of the f16 scale fields inside one block (ggml-common.h block structs).
F16_FIELDS = {
    T.Q4_0: [0],        # d
    T.Q4_1: [0, 2],     # d, m
    T.Q8_0: [0],        # d
    T.Q4_K: [0, 2],     # d, dmin
    T.Q5_K: [0, 2],     # d, dmin
    T.Q6_K: [208],      # d (after ql[128], qh[64], scales[16])
    T.Q5_0: [0],        # d (then qh[4], qs[16])
    T.Q5_1: [0, 2],     # d, m
    T.Q2_K: [80, 82],   # d, dmin (after scales[16], qs[64])
    T.Q3_K: [108],      # d (after hmask[32], qs[64], scales[12])
    T.IQ4_NL: [0],      # d
    T.IQ4_XS: [0],      # d (then scales_h u16, scales_l[4], qs[128])
}
# The first fixtures draw from one generator in this order; types added later draw from their own
# generator (seeded by SEED and the type id), so adding a type leaves existing fixtures unchanged.
FIRST_TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K]
LATER_TYPES = [T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS]


def finite_f16_bits(rng, n):
    """Random f16 bit patterns with a finite value (exponent != 31); covers subnormals."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exp = (bits >> 10) & 0x1F
    bits[exp == 0x1F] &= np.uint16(0xBFFF)  # clear the top exponent bit: exponent 15
    return bits


def make_raw(rng, qtype):
    if qtype == T.F32:
        scale = 10.0 ** rng.integers(-6, 6, N_SCALAR)
        x = (rng.standard_normal(N_SCALAR) * scale).astype(np.float32)
        x[:4] = [0.0, -0.0, 1e-40, -3.4e38]  # zero, negative zero, a subnormal, a large value
        return x.view(np.uint8)
    if qtype == T.F16:
        return finite_f16_bits(rng, N_SCALAR).view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, size=N_SCALAR, dtype=np.uint32).astype(np.uint16)
        exp = (bits >> 7) & 0xFF
        bits[exp == 0xFF] &= np.uint16(0xBFFF)  # finite: exponent 127
        return bits.view(np.uint8)
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(N_BLOCKS, block_bytes), dtype=np.uint16).astype(np.uint8)
    for b in range(N_BLOCKS):
        for off in F16_FIELDS[qtype]:
            if b < 2:  # realistic scales, as a quantizer would write them
                val = np.float16(rng.standard_normal() * 0.02).view(np.uint16)
            else:      # any finite f16, incl. subnormal and large ones
                val = finite_f16_bits(rng, 1)[0]
            raw[b, off:off + 2] = np.array([val], dtype=np.uint16).view(np.uint8)
    return raw.reshape(-1)


def write_type_fixtures(rng, types):
    """rng: one generator for all of `types`, or None for one generator per type."""
    files = []
    for qtype in types:
        raw = make_raw(rng if rng is not None else np.random.default_rng([SEED, int(qtype)]), qtype)
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n = raw.size // block_bytes * block_elems
        expected = gguf.quants.dequantize(raw.reshape(1, -1), qtype).astype(np.float32).reshape(-1)
        assert expected.size == n and np.all(np.isfinite(expected)), qtype.name
        path = os.path.join(OUT, f"{qtype.name}.bin")
        with open(path, "wb") as f:
            f.write(struct.pack("<III", int(qtype), n, raw.size))
            f.write(raw.tobytes())
            f.write(expected.astype("<f4").tobytes())
        files.append(os.path.basename(path))
    return files


def write_smollm2_samples(rng, model_path):
    reader = gguf.GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    out = {"model": os.path.basename(model_path), "tensors": {}, "samples": []}
    for name in ["token_embd.weight", "blk.0.attn_q.weight"]:
        t = tensors[name]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        assert values.size == int(t.n_elements)
        out["tensors"][name] = {
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],  # ggml order: dims[0] is the row length
            "file_offset": int(t.data_offset),  # absolute: data section start + tensor offset
            "sum": float(np.sum(values.astype(np.float64))),
            "sum_abs": float(np.sum(np.abs(values.astype(np.float64)))),
        }
        idx = [0, values.size - 1] + sorted(rng.choice(values.size, 30, replace=False).tolist())
        for i in idx:
            v = values[i]
            out["samples"].append({"tensor": name, "index": int(i), "value": float(v),
                                   "bits": int(np.array([v], dtype=np.float32).view(np.uint32)[0])})
    path = os.path.join(OUT, "smollm2_samples.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return os.path.basename(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model",
                    default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="SmolLM2 GGUF for smollm2_samples.json (skipped if absent)")
    args = ap.parse_args()
    found = {"gguf": importlib.metadata.version("gguf"), "numpy": np.__version__}
    if found != PINS:
        sys.exit(f"error: this script is pinned to {PINS}, found {found}; see its header")
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    files = write_type_fixtures(rng, FIRST_TYPES)
    if os.path.exists(args.model):
        files.append(write_smollm2_samples(rng, args.model))
    else:
        print(f"note: {args.model} absent; smollm2_samples.json not written", file=sys.stderr)
    files += write_type_fixtures(None, LATER_TYPES)
    manifest = {
        "generator": "scripts/make_dequant_fixture.py",
        "reference": "gguf.quants.dequantize",
        "versions": {"gguf": importlib.metadata.version("gguf"), "numpy": np.__version__,
                     "python": sys.version.split()[0]},
        "seed": SEED,
        "files": files,
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print("wrote " + ", ".join(files), file=sys.stderr)


if __name__ == "__main__":
    main()
