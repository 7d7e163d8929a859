#!/usr/bin/env bash
# Creates .venv-llamacpp, the Python environment of the llama.cpp peer check
# (scripts/compare_llamacpp.py). llama-cpp-python builds llama.cpp from source (CPU only, OpenMP,
# -march=native): about 9-10 minutes on 2 cores. Versions are pinned here.
# Usage: bash scripts/llamacpp_env.sh  (prints the python path)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVB_LLAMACPP_VENV:-$root/.venv-llamacpp}"
pins=("llama-cpp-python==0.3.36" "numpy==2.4.6" "diskcache==5.6.3" "jinja2==3.1.6")
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_OPENMP=ON}" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$venv/bin/pip" install --quiet --no-cache-dir "${pins[@]}" >&2
fi
echo "$venv/bin/python"
