#!/usr/bin/env bash
# Packs what a GPU machine of the `device` tool lacks (see scripts/device_build.sh, which runs
# there): the Debian packages kvbench builds with (its image has nvcc, cuBLAS, NCCL, CMake and a
# C++ compiler, none of our libraries, and no network), stories260K and the WikiText-2 test text
# from ../shared (which does not travel), and SmolLM2's GGUF in two pieces (one call carries at
# most 64 MiB). Writes .device/ (git-ignored):
#   .device/debs/*.deb          ~14 MiB   carry in the first call
#   .device/shared/...          ~2 MiB    carry in the first call
#   .device/minja/              150 KB    carry in the first call (the Jinja headers)
#   .device/model.part-aa       ~36 MiB   carry in the first call (the gzip'd GGUF's first piece)
#   .device/model.part-ab       ~53 MiB   carry in the second call (device_build.sh joins them)
#   .device/kjv.gz              ~1.3 MiB  carry in a third call (device_check.sh sweep: the output
#                                         of Debian's `bible "Gen1:1-Rev22:21"`, the KJV haystack)
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
# The essay CudaEngineSmol.Bf16TeacherForcedTop1AgreesWithCpu teacher-forces (it skipped without it
# on 2026-11-26).
mkdir -p "$out/shared/data/paulgraham_essays"
cp "$shared/data/paulgraham_essays/avg.txt" "$out/shared/data/paulgraham_essays/"
# The KJV haystack's source text for the GPU quickstart (its machine has no Debian packages):
# the exact output of the command tasks/haystack.cc runs.
command -v bible >/dev/null || {
  echo "device_pack.sh: no \`bible\` (Debian's bible-kjv): run bash scripts/setup.sh" >&2
  exit 1
}
bible "Gen1:1-Rev22:21" | gzip -9 >"$out/kjv.gz"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || bash scripts/fetch_models.sh
# The tree (~10 MB) and the packages travel with the first piece; one call carries at most 64 MiB,
# so the GGUF travels gzip-compressed (98.4 -> 92.7 MB) in two pieces sized to fill both calls.
gzip -9 -c "$model" >"$out/model.gz"
# Split so that both calls carry the same: the first also carries the packages and shared files.
extra=$(du -cb "$out/debs" "$out/shared" "$out/minja" | tail -n 1 | cut -f1)
first=$((($(stat -c %s "$out/model.gz") - extra) / 2))
head -c "$first" "$out/model.gz" >"$out/model.part-aa"
tail -c +$((first + 1)) "$out/model.gz" >"$out/model.part-ab"
rm "$out/model.gz"
sha256sum "$model" | cut -d' ' -f1 >"$out/model.sha256"
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
call1=$((tree + $(du -cb "$out/debs" "$out/shared" "$out/minja" "$out/model.part-aa" "$out/model.sha256" | tail -n 1 | cut -f1)))
call2=$((tree + $(du -b "$out/model.part-ab" | cut -f1)))
echo "device_pack.sh: call 1 carries $((call1 / 1048576)) MiB, call 2 $((call2 / 1048576)) MiB (limit 64)" >&2
[ "$call1" -lt $((63 * 1048576)) ] && [ "$call2" -lt $((63 * 1048576)) ] || {
  echo "device_pack.sh: a call would carry over 63 MiB (the tree has grown): carry less" >&2
  exit 1
}
du -sh "$out"/debs "$out"/shared "$out"/model.part-* >&2
echo "device_pack.sh: call 1 carries .device/debs .device/shared .device/minja .device/model.part-aa .device/model.sha256;" \
  "call 2 carries .device/model.part-ab; call 3 (device_check.sh sweep) carries .device/kjv.gz" >&2
