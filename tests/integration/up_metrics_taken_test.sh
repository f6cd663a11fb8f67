#!/usr/bin/env bash
# up_metrics_taken_test.sh — a stopped node whose recorded metrics port another program took is
# started again by `strata restart NAME`, by `strata up` on the partly running instance and by
# `strata chaos restart-cluster`, on a free port that is recorded and said, as the full `strata up`
# does: they used to start the node on the taken port, where it exited ("cannot serve metrics
# ... Address already in use") and the node stayed down because of its metrics port. Their start lines show the metrics URL.
# One cluster of one node. Skips (77) without python3.
# Usage: up_metrics_taken_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
instance_init up_metrics_taken
# hold ADDR: another program listens on ADDR (until the test ends); sets HOLD_PID.
hold() {
  python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(5); print("held", flush=True); time.sleep(300)' "${1#*:}" >"$TMPD/hold.${1#*:}" &
  HOLD_PID=$!
  PIDS+=("$HOLD_PID")
  for _ in $(seq 100); do grep -q held "$TMPD/hold.${1#*:}" 2>/dev/null && return; sleep 0.05; done
  fail "could not hold $1"
}
# check CMD OUT OLD: east-0 runs, with --metrics on a recorded port other than OLD, said in OUT.
check() {
  local new pid
  new=$(cat "$DIR/run/east-0.metrics")
  [ -n "$new" ] && [ "$new" != "$3" ] || { cat "$2"; fail "$1: east-0's metrics record is '$new' (was $3)"; }
  pid=$(cat "$DIR/run/east-0.pid")
  kill -0 "$pid" 2>/dev/null || { cat "$2"; fail "$1: east-0 is not running"; }
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--metrics $new" || fail "$1: east-0 runs without --metrics $new"
  grep -q "metrics address changed: $3 is taken" "$2" || { cat "$2"; fail "$1 does not say the metrics address changed"; }
  [ "${4:-}" = nourl ] || grep -q "east-0 .*ready (pid $pid)  metrics http://$new/metrics" "$2" ||
    { cat "$2"; fail "$1: the start line lacks the metrics URL"; }
  python3 -c 'import sys, urllib.request
assert urllib.request.urlopen("http://%s/metrics" % sys.argv[1], timeout=10).read()' "$new" ||
    fail "$1: GET /metrics of east-0 at $new"
  echo "ok: $1 started east-0 with metrics on $new ($3 taken)"
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --metrics >"$TMPD/up1.out" 2>&1 ||
  { cat "$TMPD/up1.out"; fail "strata up --metrics"; }

echo "== restart east-0 with its metrics port taken"
kill -9 "$(cat "$DIR/run/east-0.pid")"
old=$(cat "$DIR/run/east-0.metrics")
hold "$old"
"$STRATA" restart east-0 --dir "$DIR" >"$TMPD/restart.out" 2>&1
rc=$?
[ "$rc" = 0 ] || { cat "$TMPD/restart.out"; fail "strata restart east-0 exited $rc"; }
check "strata restart" "$TMPD/restart.out" "$old"

echo "== partial up with its metrics port taken"
kill -9 "$(cat "$DIR/run/east-0.pid")"
old=$(cat "$DIR/run/east-0.metrics")
hold "$old"
"$STRATA" up --dir "$DIR" >"$TMPD/up2.out" 2>&1
rc=$?
[ "$rc" = 0 ] || { cat "$TMPD/up2.out"; fail "partial strata up exited $rc"; }
check "partial strata up" "$TMPD/up2.out" "$old"

echo "== chaos restart-cluster with its metrics port taken"
"$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "chaos kill-cluster east"
old=$(cat "$DIR/run/east-0.metrics")
hold "$old"
"$STRATA" chaos restart-cluster east --dir "$DIR" >"$TMPD/chaos.out" 2>&1
rc=$?
[ "$rc" = 0 ] || { cat "$TMPD/chaos.out"; fail "strata chaos restart-cluster east exited $rc"; }
check "strata chaos restart-cluster" "$TMPD/chaos.out" "$old" nourl
echo PASS
