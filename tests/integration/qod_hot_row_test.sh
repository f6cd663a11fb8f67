#!/usr/bin/env bash
# qod_hot_row_test.sh — the router's query-of-death guard must not take a node crash under a hot
# row, nor the node being down afterwards, for a query of death (docs/router.md, "Queries of
# death"). 16 clients send the same ReadModifyWriteRow (+1 on one counter: identical request
# bytes, so one fingerprint); the node is killed -9 while they run. Then the same increment is
# sent 30 more times while the node is down: the router's redials of the node fail to connect,
# and calls queued on such a connection never reached the node, so they must not count as
# "dropped while it served this request". The node is restarted, and once it serves another row
# the hot counter must be served too (not refused with INTERNAL "request refused for N more s").
# Usage: qod_hot_row_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
HOLD=$HERE/hostile/hold.py
STRATA=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init qod_hot_row
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
python3 "$HOLD" create "$PORT" t >/dev/null || fail "create table failed"
NODE_CMD=$(grep -o 'strata up starts east-0: .*' "$DIR/logs/east-0.log" | tail -1 | sed 's/^strata up starts east-0: //')
python3 "$HOLD" rmw-storm "$PORT" t hot 16 "$(cat "$DIR/run/east-0.pid")" || fail "storm failed"
python3 "$HOLD" rmw-down "$PORT" t hot 30 || fail "increments while the node is down failed to run"
# Start the node again by hand with the same command line (strata up refuses a partly running instance).
# shellcheck disable=SC2086 # the logged command line is split into its words on purpose
setsid $NODE_CMD >>"$DIR/logs/east-0.log" 2>&1 </dev/null &
echo $! >"$DIR/run/east-0.pid"
python3 "$HOLD" rmw-after "$PORT" t hot cold || {
  grep -m2 "query of death" "$DIR/logs/router.log"
  fail "the hot counter is refused after the node came back"
}
echo PASS
