#!/usr/bin/env bash
# missing_files_test.sh — a node whose data directory lost DATA/storage/MANIFEST, DATA/catalog or
# the segments of DATA/storage/log must refuse to start (exit, naming the missing file) instead
# of serving an empty table or no table; with --accept-data-loss it starts. Each round: a table
# and 20 acknowledged rows, kill -9 (nothing flushed), remove the file(s), start again.
# Usage: missing_files_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
DIR=$(make_tmp) # fail() prints the logs under it
HOLD=$HERE/hostile/hold.py
command -v python3 >/dev/null && [ -f "$HOLD" ] || { echo "SKIP: python3 or hold.py absent"; exit 77; }
for victim in storage/MANIFEST catalog 'storage/log/*.log'; do
  DATA=$(make_tmp)/data
  start_node "$NODE_BIN" "$DATA" || fail "node did not start"
  port=${NODE_ADDR##*:}
  python3 "$HOLD" create "$port" t >/dev/null && python3 "$HOLD" write "$port" t 20 100 >/dev/null ||
    fail "setup writes"
  kill -9 "$NODE_PID"; wait "$NODE_PID" 2>/dev/null
  # shellcheck disable=SC2086 # the log victim is a glob
  rm -f "$DATA"/$victim
  # The refusal is an exit; a node that starts is stopped by timeout (and fails the check).
  timeout 20 "$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 >"$DATA.again.log" 2>&1
  rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "$victim removed: the node started (rc $rc)"
  name=${victim##*/}
  [ "$name" = '*.log' ] && name=00000000000000000001.log # the segment the log started with
  grep -q "$name" "$DATA.again.log" && grep -q -- "--accept-data-loss" "$DATA.again.log" ||
    fail "$victim removed: the error does not name the file and the way out: $(tail -2 "$DATA.again.log")"
  echo "ok: $victim removed: refused: $(tail -1 "$DATA.again.log")"
  "$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 --accept-data-loss >"$DATA.accept.log" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
  FAIL_EXTRA_LOGS=("$DATA.accept.log")
  wait_line "$DATA.accept.log" 'listening on' >/dev/null || fail "$victim removed: --accept-data-loss did not start"
  stop_node
done
echo PASS
