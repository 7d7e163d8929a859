#!/usr/bin/env bash
# Creates .venv-ref, the Python environment of the reference implementations that produce the
# committed test fixtures (tests never need Python). Versions are pinned here; fixture generators
# record them in the fixtures they write. Usage: bash scripts/ref_env.sh  (prints the python path)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVB_REF_VENV:-$root/.venv-ref}"
pins=(
  "torch==2.5.1" "transformers==4.46.3" "gguf==0.10.0" "tokenizers==0.20.3" "numpy==1.26.4"
  "sentencepiece==0.2.3" "accelerate==1.1.1" "scipy==1.13.1"
)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import torch, transformers, gguf, tokenizers, sentencepiece, accelerate" 2>/dev/null; then
  "$venv/bin/pip" install --quiet "${pins[@]}" >&2
fi
# kvpress (scripts/compare_kvpress.py) declares numpy>=2 but runs on the pins above: no deps.
if ! "$venv/bin/python" -c "import kvpress" 2>/dev/null; then
  "$venv/bin/pip" install --quiet --no-deps "kvpress==0.1.1" >&2
fi
echo "$venv/bin/python"
