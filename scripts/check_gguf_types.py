#!/usr/bin/env python3
"""Peer check of kvbench's GGUF types on files written by llama.cpp itself (not a test).

llama.cpp (llama-cpp-python 0.3.36, scripts/llamacpp_env.sh) quantizes two models into the
llama.cpp file types that use the block types kvbench reads; every tensor of every file is then
dequantized by kvbench's reader (build/tests/kvb_gguf_tensor_sha) and by gguf-py
(gguf==0.10.0, numpy==1.26.4: .venv-ref from scripts/ref_env.sh, or any environment with those
pins), and the sha256 of the f32 values must be equal, tensor by tensor.

- SmolLM2-135M-Instruct Q4_1 (models/, requantized): rows of 576 are not a multiple of 256, so
  llama.cpp falls back from the K-quants to Q5_0, Q5_1, Q4_0 and IQ4_NL there (as in
  Gemma-3-270M, whose Q4_K_M holds Q5_0 tensors); ffn_down (rows of 1536) keeps the K type.
- kvb_make_tp_model's random Llama widened to 256/512 (F32): its rows take Q2_K, Q3_K and IQ4_XS.

Run: python=$(bash scripts/llamacpp_env.sh); $python scripts/check_gguf_types.py
     [--gguf-python .venv-ref/bin/python] [--build build] [--out build/gguf_types]
Prints one line per file (tensors per type, mismatches); exit 1 on any mismatch.
"""
import argparse
import collections
import ctypes
import os
import subprocess
import sys

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
FTYPES = {  # llama.cpp file type -> the block types it writes into these models
    "smollm2": ["Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "IQ4_NL", "IQ4_XS", "Q4_K_M"],
    "random256": ["Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_XS", "Q5_1", "Q4_K_M"],
}
REFERENCE = """
import hashlib, importlib.metadata, sys
import numpy as np, gguf
assert importlib.metadata.version("gguf") == "0.10.0" and np.__version__ == "1.26.4"
for t in gguf.GGUFReader(sys.argv[1]).tensors:
    v = gguf.quants.dequantize(t.data, t.tensor_type).astype("<f4").reshape(-1)
    print(t.name, t.tensor_type.name, v.size, hashlib.sha256(v.tobytes()).hexdigest())
"""


def quantize(src, dst, ftype, allow_requantize):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
    p.allow_requantize = allow_requantize
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize({src} -> {ftype}) failed: {rc}")


def lines(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=None, help="where the quantized files go (build/gguf_types)")
    ap.add_argument("--gguf-python", default=os.path.join(ROOT, ".venv-ref", "bin", "python"))
    args = ap.parse_args()
    out = args.out or os.path.join(args.build, "gguf_types")
    os.makedirs(out, exist_ok=True)
    sha_tool = os.path.join(args.build, "tests", "kvb_gguf_tensor_sha")
    random256 = os.path.join(out, "random256.F32.gguf")
    subprocess.run([os.path.join(args.build, "tests", "kvb_make_tp_model"), random256, "256",
                    "512"], check=True)
    sources = {"smollm2": (SMOLLM2, True), "random256": (random256, False)}
    failed = 0
    for model, ftypes in FTYPES.items():
        src, requantize = sources[model]
        for ftype in ftypes:
            path = os.path.join(out, f"{model}.{ftype}.gguf")
            quantize(src, path, ftype, requantize)
            ours = lines([sha_tool, path])
            ref = lines([args.gguf_python, "-c", REFERENCE, path])
            bad = [a[0] for a, b in zip(ours, ref) if a != b]
            if len(ours) != len(ref):
                bad.append(f"<{len(ours)} vs {len(ref)} tensors>")
            types = collections.Counter(t[1] for t in ours)
            print(f"{model:9} {ftype:7} {len(ours):4} tensors "
                  f"({', '.join(f'{n} {t}' for t, n in sorted(types.items()))}): "
                  f"{'identical' if not bad else 'MISMATCH ' + ' '.join(bad[:5])}", flush=True)
            failed += bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
