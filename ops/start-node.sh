#!/usr/bin/env bash
# Starts a standalone strata-node (a one-node Bigtable instance) in the foreground, building it
# first if needed. Usage: ops/start-node.sh [--data DIR] [--listen HOST:PORT] [strata-node flags]
# Defaults: data in ~/.strata/node, listening on 127.0.0.1:8086 (the emulator's customary port).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$root/build/node/strata-node" ]; then
  bash "$root/ops/setup.sh"
  echo "building strata-node (first run only)..."
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C "$root/build" -j "${STRATA_JOBS:-2}" strata-node
fi
args=("$@")
has() { for a in "${args[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
has --data || args+=(--data "${STRATA_HOME:-$HOME/.strata}/node")
has --listen || args+=(--listen 127.0.0.1:8086)
echo "try: BIGTABLE_EMULATOR_HOST=127.0.0.1:8086 cbt -project p -instance i ls"
exec "$root/build/node/strata-node" "${args[@]}"
