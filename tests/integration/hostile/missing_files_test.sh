#!/usr/bin/env bash
# missing_files_test.sh — a node whose data directory lost one of its files must not start as if
# nothing happened. For each of DATA/storage/MANIFEST, DATA/catalog and the segments of
# DATA/storage/log: a node gets a table and 20 acknowledged rows, is killed (-9, nothing
# flushed), the file is removed, and the node is started again. Expected: it refuses to start
# (as for a commit log cut short) or serves every row. Observed on main: it starts and serves
# an empty table (MANIFEST or log gone) or no table (catalog gone), logging nothing above info.
# Usage: missing_files_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib.sh"
NODE_BIN=$1
fail=0
for victim in storage/MANIFEST catalog 'storage/log/*'; do
  DATA=$(make_tmp)/data
  start_node "$NODE_BIN" "$DATA" || { echo "FAIL: node did not start"; exit 1; }
  port=${NODE_ADDR##*:}
  python3 "$HERE/hold.py" create "$port" t >/dev/null && python3 "$HERE/hold.py" write "$port" t 20 100 >/dev/null ||
    { echo "FAIL: setup writes"; exit 1; }
  kill -9 "$NODE_PID"; wait "$NODE_PID" 2>/dev/null
  # shellcheck disable=SC2086 # the log victim is a glob
  rm -f "$DATA"/$victim
  timeout 60 "$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 >"$DATA.again.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 100); do
    grep -q "listening on" "$DATA.again.log" || ! kill -0 "$pid" 2>/dev/null && break
    sleep 0.1
  done
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "ok: $victim removed: the node refuses to start: $(tail -1 "$DATA.again.log")"
    continue
  fi
  addr=$(grep -Eo 'listening on 127\.0\.0\.1:[0-9]+' "$DATA.again.log" | head -1)
  if python3 "$HERE/hold.py" check "${addr##*:}" t 20 100 >/dev/null; then
    echo "ok: $victim removed: every row is still served"
  else
    echo "FAIL: $victim removed: the node started and lost the 20 acknowledged rows without a word"
    fail=1
  fi
  kill "$pid"; wait "$pid" 2>/dev/null
done
[ "$fail" = 0 ] && echo PASS
exit "$fail"
