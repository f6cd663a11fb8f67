#!/usr/bin/env bash
# router_down_log_test.sh — a node that stays down must not flood the router's log: the router
# reads the metadata every second and each read from a cluster with its node down fails. On
# `strata up` (2 clusters x 1 node + router), east-0 is stopped for 8 s: the router logs the
# failure once (the next line would come a minute later, counting those skipped; it used to log
# one warning a second), and once east-0 is back, one line saying reads work again.
# Usage: router_down_log_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
instance_init router_down_log
FAIL_TAIL_LINES=10
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
LOG=$DIR/logs/router.log
failed() { grep -c 'metadata read from cluster=east failed' "$LOG"; }

echo "== east-0 down for 8 s"
PID=$(cat "$DIR/run/east-0.pid")
kill "$PID"
for i in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
sleep 8
N=$(failed)
echo "router: $N metadata warnings about east in 8 s"
[ "$N" -ge 1 ] || fail "the router never said the metadata read from east fails"
[ "$N" -le 2 ] || fail "the router logged $N metadata warnings about east in 8 s (at most 2)"

echo "== east-0 back"
"$STRATA" up --dir "$DIR" --port "$PORT" >"$TMPD/up2.out" 2>&1 || { cat "$TMPD/up2.out"; fail "restart"; }
wait_line "$LOG" 'metadata read from cluster=east works again similar_skipped=[0-9]+' >/dev/null ||
  fail "no line that metadata reads from east work again"
grep 'metadata read from cluster=east' "$LOG"
echo "PASS"
