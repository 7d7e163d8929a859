#!/usr/bin/env bash
# Creates .venv-llamacpp, the Python environment of the llama.cpp peer check
# (scripts/compare_llamacpp.py). llama-cpp-python 0.3.36 (llama.cpp 0.5.0 vendored) builds llama.cpp
# from its PyPI sdist (CPU only, OpenMP, -march=native without AMX): about 10 minutes on 2 cores.
# Every file is pinned by sha256 (pip --require-hashes); the wheels' hashes are those of CPython
# 3.11 on x86-64 Linux (another Python fails the hash check: add its wheels' hashes here).
#
# Why no AMX: with GCC 12, -march=native on a CPU with AMX (Sapphire Rapids and later) compiles
# ggml's AMX matmul (ggml-cpu/amx/mmq.cpp), and that segfaults in llama_decode (SIGSEGV, si_code
# SI_KERNEL: a #GP on `ldtilecfg`). GCC 12's _tile_loadconfig (amxtileintrin.h) declares an 8-byte
# memory operand for the 64-byte tile configuration, so the compiler drops the stores of its
# rows/colsb fields and ldtilecfg loads an invalid configuration (llama.cpp issue 20824, PR 26954).
# -mno-amx-* keeps every other -march=native feature (AVX-512, VNNI, BF16).
#
# Usage: bash scripts/llamacpp_env.sh  (prints the python path)
#   KVB_LLAMACPP_VENV=DIR  the venv (default .venv-llamacpp in the repository root; with
#                          KVB_LLAMACPP_ISA=avx2, .venv-llamacpp-avx2)
#   KVB_LLAMACPP_ISA=avx2  llama.cpp's AVX2 kernels only (GGML_NATIVE=OFF, AVX, AVX2, FMA, F16C,
#                          BMI2; no AVX-512): an AVX2-only CPU's build, to compare on one machine
#                          with kvbench built for one (cmake -DKVBENCH_NATIVE=OFF
#                          -DCMAKE_CXX_FLAGS=-march=haswell)
#   CMAKE_BUILD_PARALLEL_LEVEL=N  build jobs (default: nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
isa="${KVB_LLAMACPP_ISA:-native}"
case "$isa" in
  native)
    venv="${KVB_LLAMACPP_VENV:-$root/.venv-llamacpp}"
    cmake_args="-DGGML_NATIVE=ON -DGGML_OPENMP=ON"
    ;;
  avx2)
    venv="${KVB_LLAMACPP_VENV:-$root/.venv-llamacpp-avx2}"
    cmake_args="-DGGML_NATIVE=OFF -DGGML_OPENMP=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON"
    cmake_args+=" -DGGML_F16C=ON -DGGML_BMI2=ON"
    ;;
  *)
    echo "llamacpp_env.sh: KVB_LLAMACPP_ISA is native or avx2, not '$isa'" >&2
    exit 2
    ;;
esac
recipe="llama-cpp-python 0.3.36; CMAKE_ARGS=$cmake_args; CFLAGS/CXXFLAGS="
recipe+="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "$(uname -m)" != x86_64 ]; then
  recipe="${recipe%%; CFLAGS*}"  # the -mno-amx flags exist on x86 only
fi
stamp="$venv/kvb-llamacpp-recipe"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if "$venv/bin/python" -c "import llama_cpp, numpy" 2>/dev/null &&
  [ "$(cat "$stamp" 2>/dev/null)" = "$recipe" ]; then
  echo "$venv/bin/python"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Build back end, installed first so that the sdist builds without an unpinned isolated env.
cat >"$tmp/build.txt" <<'EOF'
scikit-build-core==1.1.2 --hash=sha256:7f4f959a467692db50bdd1ea7ce1507f2c7972e6023b753ee302d169bc4cec85
pathspec==1.1.1 --hash=sha256:a00ce642f577bf7f473932318056212bc4f8bfdf53128c78bbd5af0b9b20b189
packaging==26.4 --hash=sha256:81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2
EOF
cat >"$tmp/run.txt" <<'EOF'
llama-cpp-python==0.3.36 --hash=sha256:832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
numpy==2.4.6 --hash=sha256:89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93
diskcache==5.6.3 --hash=sha256:5e31b2d5fbad117cc363ebaf6b689474db18a1f6438bc82358b024abd4c2ca19
jinja2==3.1.6 --hash=sha256:85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67
markupsafe==3.0.4 --hash=sha256:6da83a088f8ef93b2d483a8232a4dbf4d69d3d8496b568a03c56becac43e1808
typing-extensions==4.16.0 --hash=sha256:481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8
EOF
"$venv/bin/pip" install --quiet --no-cache-dir --require-hashes -r "$tmp/build.txt" >&2
flags=""
if [ "$(uname -m)" = x86_64 ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
# --force-reinstall: a venv built by an earlier recipe (the AMX build) is rebuilt, not kept.
CMAKE_ARGS="$cmake_args" CFLAGS="$flags" CXXFLAGS="$flags" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$venv/bin/pip" install --quiet --no-cache-dir --no-build-isolation --force-reinstall \
  --require-hashes -r "$tmp/run.txt" >&2
info="$("$venv/bin/python" -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())")"
if grep -q "AMX_INT8 = 1" <<<"$info"; then
  echo "llamacpp_env.sh: the build in $venv still has AMX ($info); it would crash in llama_decode" >&2
  exit 1
fi
if [ "$isa" = avx2 ] && grep -q "AVX512 = 1" <<<"$info"; then
  echo "llamacpp_env.sh: the AVX2 build in $venv has AVX-512 kernels ($info)" >&2
  exit 1
fi
echo "$recipe" >"$stamp"
echo "$venv/bin/python"
