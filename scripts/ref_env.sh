#!/usr/bin/env bash
# Creates the Python environments of the reference implementations (tests never need Python);
# prints the chosen environment's python path. Versions are pinned here; fixture generators record
# them in the fixtures they write.
#   bash scripts/ref_env.sh          .venv-ref: the fixtures' references (torch 2.5.1,
#                                    transformers 4.46.3, ...; their goldens stay on these pins)
#   bash scripts/ref_env.sh kvpress  .venv-kvpress: kvpress's current release on the transformers
#                                    and torch it requires (scripts/compare_kvpress.py)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
which="${1:-ref}"
case "$which" in
  ref)
    venv="${KVB_REF_VENV:-$root/.venv-ref}"
    pins=(
      "torch==2.5.1" "transformers==4.46.3" "gguf==0.10.0" "tokenizers==0.20.3" "numpy==1.26.4"
      "sentencepiece==0.2.3" "accelerate==1.1.1" "scipy==1.13.1"
    )
    probe="import torch, transformers, gguf, tokenizers, sentencepiece, accelerate"
    ;;
  kvpress)
    # kvpress 0.5.5 (2026's release on PyPI) requires transformers >= 4.56 and numpy >= 2.
    venv="${KVB_KVPRESS_VENV:-$root/.venv-kvpress}"
    pins=(
      "kvpress==0.5.5" "torch==2.9.1" "transformers==4.57.1" "gguf==0.17.1" "numpy==2.4.6"
      "tokenizers==0.22.2" "accelerate==1.16.0"
    )
    probe="import kvpress, torch, transformers, gguf"
    ;;
  *)
    echo "usage: bash scripts/ref_env.sh [ref|kvpress]" >&2
    exit 2
    ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "$probe" 2>/dev/null; then
  "$venv/bin/pip" install --quiet "${pins[@]}" >&2
fi
if [ "$which" = ref ] && ! "$venv/bin/python" -c "import kvpress" 2>/dev/null; then
  # The fixtures' environment keeps the kvpress of its transformers (0.1.1; no deps: it declares
  # numpy>=2 but runs on the pins above).
  "$venv/bin/pip" install --quiet --no-deps "kvpress==0.1.1" >&2
fi
echo "$venv/bin/python"
