#!/usr/bin/env bash
# Installs the Debian packages Strata needs to build and test, when any is missing.
# Idempotent: on a machine that has everything it only checks and returns.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config clang clang-format
  libevent-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler
  libzstd-dev libssl-dev libcmocka-dev libre2-dev
  # bench-only peers for storage-bench (built when present)
  libleveldb-dev librocksdb-dev
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} build packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
