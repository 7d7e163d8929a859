#!/usr/bin/env bash
# Runs ON the GPU machine of the `device` tool (from the repository root there): unpacks the
# Debian packages of scripts/device_pack.sh into a prefix (never into /), builds kvbench with the
# CUDA backend (no MPI: the image has none), and, when both model pieces have arrived, joins the
# SmolLM2 GGUF into models/. Idempotent within one warm machine. Then, for example:
#   . /tmp/kvb-prefix/env.sh; ctest --test-dir build-gpu -L cuda --output-on-failure
#   build-gpu/bench/bench_cuda_kernels
# Usage: bash scripts/device_build.sh [extra cmake args]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
prefix=/tmp/kvb-prefix
if [ ! -f "$prefix/.done" ]; then
  mkdir -p "$prefix"
  for f in .device/debs/*.deb; do dpkg -x "$f" "$prefix"; done
  touch "$prefix/.done"
fi
lib="$prefix/usr/lib/x86_64-linux-gnu"
export PATH="$prefix/usr/bin:$PATH"
# The packages' .pc files say prefix=/usr: the sysroot maps them into the prefix.
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# For the commands that follow in the same call: `. /tmp/kvb-prefix/env.sh`.
printf 'export LD_LIBRARY_PATH=%q\nexport KVB_SHARED_DIR=%q\n' "$LD_LIBRARY_PATH" \
  "$root/.device/shared" >"$prefix/env.sh"
# Model pieces: each call may bring one; keep them outside the tree between calls.
mkdir -p /tmp/kvb-model models
for p in .device/model.part-*; do [ -f "$p" ] && cp -n "$p" /tmp/kvb-model/; done
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ] && [ -f /tmp/kvb-model/model.part-aa ] && [ -f /tmp/kvb-model/model.part-ab ]; then
  cat /tmp/kvb-model/model.part-* | gunzip >"$model"
  echo "$(cat .device/model.sha256 2>/dev/null || cat /tmp/kvb-model/sha256)  $model" | sha256sum -c -
fi
[ -f .device/model.sha256 ] && cp .device/model.sha256 /tmp/kvb-model/sha256
# The minja headers (scripts/device_pack.sh carried them in .device/minja).
if [ ! -f third_party/minja/minja.hpp ] && [ -f .device/minja/minja.hpp ]; then
  mkdir -p third_party && cp -r .device/minja third_party/
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBENCH_CUDA=ON -DKVBENCH_MPI=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$prefix/usr" \
  -DKVB_SHARED_DIR="$root/.device/shared" "$@"
cmake --build build-gpu -j "$(nproc)"
echo "device_build.sh: built build-gpu; run its programs after: . $prefix/env.sh" >&2
