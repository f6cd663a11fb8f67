#!/usr/bin/env bash
# repl_log_cut_test.sh — a replicated node whose newest commit log segment was cut short, started
# once with --accept-data-loss (docs/operations.md, "A commit log cut short"). Two clusters of
# one node: west takes rows of its own (replicated to east), then east's rows reach west; west is
# killed (-9) and its segment cut inside east's rows, so west loses rows it had received and its
# position file for east names records past the kept end. Checked:
#  - `strata chaos restart-cluster` refuses, saying that no node of west is ready and where the
#    failed node's log is (it said "1 node(s) of west started");
#  - with --accept-data-loss the node serves (it exited on its own position file, "damaged or
#    edited"), logs where shipping resumes, ships its new writes, and says no false "peer lacks";
#  - a later start without the flag works;
#  - the documented way to get back the rows received from east (its position file for west
#    removed) brings west every row again.
# Usage: repl_log_cut_test.sh PATH/TO/strata PATH/TO/strata-node
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
NODE_BIN=$2
HOSTILE=$(cd "$(dirname "$0")" && pwd)/hostile
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init repl_log_cut
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
node_field() { awk -v c="[cluster $1]" -v f="$2" '$0 == c {s=1; next} /^\[/{s=0} s && /^node =/{print $f; exit}' "$DIR/topology"; }
EAST=$(node_field east 3); WEST=$(node_field west 3); WDATA=$(node_field west 4)
EDATA=$(node_field east 4); R=127.0.0.1:$PORT
[ -n "$EAST" ] && [ -n "$WEST" ] && [ -d "$WDATA" ] && [ -d "$EDATA" ] || fail "no nodes in $DIR/topology"
write() { timeout 120 python3 "$HOSTILE/repl_tablet_gone.py" "${1##*:}" write t "$2" "$3"; }
count() { cbtr "$1" count t | grep -Eo '^[0-9]+$'; }
# until_count ADDR N: waits (bounded) until t at ADDR holds N rows; 1 if it never does.
until_count() {
  local i c
  for i in $(seq 1 100); do
    c=$(count "$1"); [ "$c" = "$2" ] && return 0; sleep 0.2
  done
  echo "$1 holds ${c:-?} rows of t, expected $2" >&2; return 1
}

cbtr "$R" createtable t >/dev/null && cbtr "$R" createfamily t cf >/dev/null || fail "create t"
write "$WEST" w 100 || fail "writes to west"
until_count "$EAST" 100 || fail "west's rows did not reach east"
write "$EAST" e 200 || fail "writes to east"
until_count "$WEST" 300 || fail "east's rows did not reach west"
sleep 2 # west records its position for east (every 500 ms) past east's rows in its log

echo "== west killed, its newest segment cut inside the rows it received from east"
"$STRATA" chaos kill-cluster west --dir "$DIR" >/dev/null || fail "kill west"
seg=$(ls "$WDATA"/storage/log/*.log | tail -1)
python3 - "$seg" <<'PY' || fail "cutting $seg"
import os, sys
at = open(sys.argv[1], 'rb').read().find(b'e0100')
assert at > 0, 'row e0100 not in the segment'
os.truncate(sys.argv[1], at)
PY
"$STRATA" chaos restart-cluster west --dir "$DIR" >"$TMPD/restart.out" 2>&1 &&
  fail "west started on a cut log: $(cat "$TMPD/restart.out")"
grep -q "0 of 1 node(s) of west ready; west-0 did not come up (its log: $DIR/logs/west-0.log)" \
  "$TMPD/restart.out" || fail "restart summary: $(tail -1 "$TMPD/restart.out")"

echo "== west started with --accept-data-loss"
ALOG=$TMPD/west-accept.log
FAIL_EXTRA_LOGS=("$ALOG")
"$NODE_BIN" --data "$WDATA" --listen "$WEST" --node-num 2 --cluster-num 2 \
  --config "$DIR/topology" --accept-data-loss >"$ALOG" 2>&1 &
APID=$!
PIDS+=("$APID")
wait_line "$ALOG" 'listening on' >/dev/null || fail "--accept-data-loss did not start west"
grep -q "event=repl_position_clamped peer=east" "$ALOG" || fail "no line says where shipping resumes"
grep -q "damaged or edited" "$ALOG" && fail "the accepted cut was blamed on the position file"
[ "$(count "$WEST")" = 200 ] || fail "west holds $(count "$WEST") rows, expected the 200 kept"
write "$WEST" n 10 || fail "writes to west after the cut"
until_count "$EAST" 310 || fail "west's writes after the cut did not reach east"
grep -q "cannot be shipped" "$ALOG" && fail "false 'the peer lacks them'"
kill "$APID"; wait "$APID" 2>/dev/null

echo "== a later start without the flag"
"$STRATA" chaos restart-cluster west --dir "$DIR" >"$TMPD/restart2.out" 2>&1 ||
  fail "west did not start again without the flag: $(cat "$TMPD/restart2.out")"
[ "$(count "$WEST")" = 210 ] || fail "west holds $(count "$WEST") rows, expected 210"

echo "== east ships its retained log again: west gets the rows it lost"
"$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "kill east"
rm "$EDATA/replication/peer-west.pos" || fail "no position file for west on east"
"$STRATA" chaos restart-cluster east --dir "$DIR" >/dev/null || fail "restart east"
until_count "$WEST" 310 || fail "the rows west received from east and lost did not come back"
grep -q "cannot be shipped" "$DIR/logs/west-0.log" && fail "false 'the peer lacks them' on west"
echo PASS
