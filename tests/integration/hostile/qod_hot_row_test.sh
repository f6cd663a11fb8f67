#!/usr/bin/env bash
# qod_hot_row_test.sh — the router's query-of-death guard takes a node crash under a hot row for
# a query of death. 16 clients send the same ReadModifyWriteRow (+1 on one counter: identical
# request bytes, so one fingerprint); the node is killed -9 while they run, then restarted.
# Each of the 16 identical calls dropped by that one crash counts as a drop of "the request"
# ("dropped while it served this request (16 times)"), so the router refuses that request with
# INTERNAL "request refused for 600 more s" for 10 minutes, to every client, although the node
# is back and serves other rows. Expected: one connection loss counts once; the restarted node
# serves the counter again. Fails when the hot row is refused after the node is back.
# Usage: qod_hot_row_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib.sh"
STRATA=$1
instance_init qod_hot_row
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
python3 "$HERE/hold.py" create "$PORT" t >/dev/null || fail "create table failed"
NODE_CMD=$(grep -o 'strata up starts east-0: .*' "$DIR/logs/east-0.log" | tail -1 | sed 's/^strata up starts east-0: //')
python3 "$HERE/hold.py" rmw-storm "$PORT" t hot 16 "$(cat "$DIR/run/east-0.pid")" || fail "storm failed"
# Start the node again by hand with the same command line (strata up refuses a partly running instance).
# shellcheck disable=SC2086 # the logged command line is split into its words on purpose
setsid $NODE_CMD >>"$DIR/logs/east-0.log" 2>&1 </dev/null &
echo $! >"$DIR/run/east-0.pid"
python3 "$HERE/hold.py" rmw-after "$PORT" t hot cold || {
  grep -m2 "query of death" "$DIR/logs/router.log"
  fail "the hot counter is refused after the node came back"
}
echo PASS
