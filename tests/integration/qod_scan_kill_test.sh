#!/usr/bin/env bash
# qod_scan_kill_test.sh — a node frozen and then killed -9 twice under the same scan must not
# make the router refuse that scan as a query of death (docs/router.md, "Queries of death"). A
# scan goes to its node over the scan connection, where it is often the only call when the node
# dies; the router counts the calls lost with the node's regular connection too (its health
# probes were out to the frozen node), so the drop is a crash under a crowd, which costs the
# request a retry only. Before, the second kill made the router refuse the scan with INTERNAL
# "possibly a query of death" for 600 s on a healthy node.
# Usage: qod_scan_kill_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
HOLD=$HERE/hostile/hold.py
STRATA=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init qod_scan_kill
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
python3 "$HOLD" create "$PORT" t >/dev/null || fail "create table failed"
python3 "$HOLD" write "$PORT" t 20 100 >/dev/null || fail "writing the rows failed"
for round in 1 2; do
  pid=$(cat "$DIR/run/east-0.pid")
  kill -STOP "$pid"
  python3 "$HOLD" scan-range "$PORT" t r000001 r000003 10 &
  scan=$!
  sleep 0.5
  kill -9 "$pid"
  wait "$scan" # fails: the node died under it
  "$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "restarting the node (round $round) failed"
  sleep 1
done
python3 "$HOLD" scan-range "$PORT" t r000001 r000003 10 || {
  grep -m2 "query of death" "$DIR/logs/router.log"
  fail "the scan is refused after the node came back"
}
echo "qod_scan_kill_test: passed"
