#!/usr/bin/env bash
# metadata_memory_test.sh — request metadata counts in --max-buffered-request-bytes.
# A strata-node started with --max-buffered-request-bytes 16m receives 40 connections x 256
# streams whose HEADERS (+CONTINUATION) carry ~60 KiB of metadata each and no message; the
# slow-client check would free them only after --slow-client-timeout-ms (30 s by default).
# Outside the budget the node held ~600 MiB until then; the streams past the budget are now
# refused and the node's memory stays near the bound. Fails when RSS passes LIMIT_MB (default
# 256); not checked under AddressSanitizer.
# Usage: metadata_memory_test.sh PATH/TO/strata-node [LIMIT_MB]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
LIMIT=${2:-256}
if grep -aq __asan_init "$NODE_BIN"; then # its shadow memory and quarantine count in RSS
  echo "AddressSanitizer build: RSS is not checked"
  LIMIT=100000
fi
DATA=$(make_tmp)/data
"$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 --max-buffered-request-bytes 16m >"$DATA.log" 2>&1 &
NODE_PID=$!
PIDS+=("$NODE_PID")
NODE_ADDR=$(wait_line "$DATA.log" '127\.0\.0\.1:[0-9]+') || { echo "FAIL: node did not start"; exit 1; }
python3 "$HERE/hostile/hold.py" metadata "${NODE_ADDR##*:}" 40 256 "$NODE_PID" "$LIMIT" ||
  { echo "FAIL: node memory grows with request metadata past --max-buffered-request-bytes"; exit 1; }
echo PASS
