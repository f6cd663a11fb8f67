#!/usr/bin/env bash
# log_zero_tail_test.sh — the newest commit log segment keeps its size but its last acknowledged
# records read back as zeros (a lost page: the file does not get shorter). A node gets 20
# acknowledged rows, is killed (-9, nothing flushed), the last 1 KiB of the segment's used part
# is zeroed, and the node is started again: it must refuse (exit, naming the segment and
# --accept-data-loss), since the segment's checkpoint names records it no longer holds; with
# --accept-data-loss it starts, serves the rows before the zeros, and later starts are normal.
# Usage: log_zero_tail_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
DIR=$(make_tmp) # fail() prints the logs under it
HOLD=$HERE/hostile/hold.py
command -v python3 >/dev/null && [ -f "$HOLD" ] || { echo "SKIP: python3 or hold.py absent"; exit 77; }
DATA=$DIR/data
start_node "$NODE_BIN" "$DATA" || fail "node did not start"
port=${NODE_ADDR##*:}
python3 "$HOLD" create "$port" t >/dev/null && python3 "$HOLD" write "$port" t 20 100 >/dev/null ||
  fail "setup writes"
kill -9 "$NODE_PID"; wait "$NODE_PID" 2>/dev/null
seg=$(ls "$DATA"/storage/log/*.log | tail -1)
size_before=$(stat -c %s "$seg")
python3 - "$seg" <<'PY'
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
end = len(b.rstrip(b'\0'))
b[end - 1024:end] = bytes(1024)
open(sys.argv[1], 'wb').write(b)
PY
[ "$(stat -c %s "$seg")" = "$size_before" ] || fail "the damage changed the file's size"
# The refusal is an exit; a node that starts is stopped by timeout (and fails the check).
timeout 20 "$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 >"$DATA.again.log" 2>&1
rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "the node started over zeroed acknowledged records (rc $rc)"
grep -q "${seg##*/}" "$DATA.again.log" && grep -q -- "--accept-data-loss" "$DATA.again.log" ||
  fail "the error does not name the segment and the way out: $(tail -2 "$DATA.again.log")"
echo "ok: refused: $(tail -1 "$DATA.again.log")"
"$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 --accept-data-loss >"$DATA.accept.log" 2>&1 &
NODE_PID=$!
PIDS+=("$NODE_PID")
FAIL_EXTRA_LOGS=("$DATA.accept.log")
wait_line "$DATA.accept.log" 'listening on' >/dev/null || fail "--accept-data-loss did not start"
grep -q "event=log_data_loss_accepted" "$DATA.accept.log" || fail "the accepted loss was not logged"
stop_node
start_node "$NODE_BIN" "$DATA" || fail "the node did not start again after the accepted loss"
stop_node
echo PASS
