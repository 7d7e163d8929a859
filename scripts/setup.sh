#!/usr/bin/env bash
# Installs the Debian packages kvbench builds and tests with. Idempotent: a second run installs nothing and
# prints one line. Needs root (or sudo) and Debian bookworm or newer. chromium renders `kvbench report`
# pages in the report test (headless).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  openmpi-bin libopenmpi-dev
  libboost-program-options-dev
  libyaml-cpp-dev
  libsqlite3-dev sqlite3
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libpcre2-dev
  nlohmann-json3-dev
  zlib1g-dev
  libomp-dev
  bible-kjv
  chromium fonts-dejavu-core
  python3 python3-venv python3-pip
  python3-dev python3-numpy python3-yaml
  time
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#packages[@]} system packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup.sh: done"
