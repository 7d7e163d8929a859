#!/usr/bin/env bash
# Packs what a GPU machine of the `device` tool lacks (see scripts/device_build.sh, which runs
# there): the Debian packages kvbench builds with (its image has nvcc, cuBLAS, NCCL, CMake and a
# C++ compiler, none of our libraries, and no network), stories260K and the WikiText-2 test text
# from ../shared (which does not travel), and SmolLM2's GGUF in two pieces (one call carries at
# most 64 MiB). Writes .device/ (git-ignored):
#   .device/debs/*.deb          ~14 MiB   carry in the first call
#   .device/shared/...          ~2 MiB    carry in the first call
#   .device/minja/              150 KB    carry in the first call (the Jinja headers)
#   .device/model.part-aa       38 MiB    carry in the first call
#   .device/model.part-ab       ~56 MiB   carry in the second call (device_build.sh joins them)
# Usage: bash scripts/device_pack.sh   (Debian bookworm; apt-get download needs no root)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
shared="${KVB_SHARED_DIR:-$root/../shared}"
out=.device
rm -rf "$out"
mkdir -p "$out/debs" "$out/shared/models" "$out/shared/data/wikitext-2"
packages=(
  libboost-program-options1.74-dev libboost-program-options1.74.0 libboost1.74-dev
  libyaml-cpp-dev libyaml-cpp0.7 libsqlite3-dev libsqlite3-0 libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  nlohmann-json3-dev pkgconf pkgconf-bin libpkgconf3
)
(cd "$out/debs" && apt-get download "${packages[@]}" >/dev/null 2>&1) || {
  echo "device_pack.sh: apt-get download failed (Debian's mirrors reachable?)" >&2
  exit 1
}
cp -r "$shared/models/stories260K" "$out/shared/models/"
# The minja headers the build needs (scripts/fetch_models.sh fetched them; the GPU machine has no
# network): ~150 KB, carried with .device/ in the first call.
[ -f third_party/minja/minja.hpp ] || {
  echo "device_pack.sh: third_party/minja/minja.hpp missing: run bash scripts/fetch_models.sh first" >&2
  exit 1
}
cp -r third_party/minja "$out/minja"
cp "$shared/data/wikitext-2/test.txt" "$out/shared/data/wikitext-2/"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || bash scripts/fetch_models.sh
# Uneven pieces so that each call stays under 64 MiB with the tree (~3 MiB): the first call also
# carries the packages and shared files.
head -c 38M "$model" >"$out/model.part-aa"
tail -c +$((38 * 1048576 + 1)) "$model" >"$out/model.part-ab"
sha256sum "$model" | cut -d' ' -f1 >"$out/model.sha256"
du -sh "$out"/debs "$out"/shared "$out"/model.part-* >&2
echo "device_pack.sh: call 1 carries .device/debs .device/shared .device/model.part-aa .device/model.sha256;" \
  "call 2 carries .device/model.part-ab" >&2
