#!/usr/bin/env bash
# qod_rolling_restart_test.sh — graceful restarts of a cluster's nodes (`strata restart`, SIGTERM)
# under a scan in flight must not make the router refuse that scan as a query of death
# (docs/router.md, "Queries of death"; docs/operations.md, restart). A client opens a scan of the
# whole table and reads nothing; its router (--max-queued-response-bytes 1m) pauses the node's
# part of it, so the node call stays in flight while both nodes are restarted in turn, twice.
# A stopping node ends its calls with UNAVAILABLE "the node is shutting down" (a retryable
# answer) before it closes its connections. Before, it closed them under the calls, which the
# router took for a crash under the request: after the second rolling restart it ended the scan
# with INTERNAL "possibly a query of death" and refused the same scan for 600 s.
# Usage: qod_rolling_restart_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
HOLD=$HERE/hostile/hold.py
STRATA=$1
ROUTER_BIN=$(dirname "$STRATA")/../router/strata-router
ROWS=200
BYTES=32768
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init qod_rolling_restart
"$STRATA" up --dir "$DIR" --clusters 1 --nodes 2 --no-router >/dev/null || fail "strata up failed"
start_router "$DIR/topology" "$TMPD/router.log" --max-queued-response-bytes 1m
FAIL_EXTRA_LOGS=("$TMPD/router.log")
PORT=${ROUTER_ADDR##*:}
python3 "$HOLD" create "$PORT" t >/dev/null || fail "create table failed"
python3 "$HOLD" write "$PORT" t "$ROWS" "$BYTES" >/dev/null || fail "writing the rows failed"

# The whole table, read only once $TMPD/go exists; then the same scan on a new connection.
# Exit 0 when the second ends with every row. The first may end early: while a node restarts
# slower than the router's retries of it last (about 1 s; a loaded machine, a sanitizer build),
# the router answers UNAVAILABLE and a client library retries from its last row. A query of death
# verdict, the fault this test is about, shows in the router's log (checked below) and refuses the
# second scan.
HOSTILE=$HERE/hostile python3 - "$PORT" "$TMPD/go" $((ROWS * BYTES)) >"$TMPD/scan.out" 2>&1 <<'PY' &
import os, sys, time
sys.path.insert(0, os.environ['HOSTILE'])
from h2raw import Conn, fld, grpc_msg, status_of
port, go, want = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def scan(wait_for=None):
    c = Conn(port, timeout=120)
    sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
    c.data(sid, grpc_msg(fld(1, 'projects/p/instances/i/tables/t')))
    while wait_for and not os.path.exists(wait_for):
        time.sleep(0.1)
    data, hdrs, why = c.wait_end(sid, 120)
    print('scan: %d of %d bytes, %s %s' % (len(data), want, why, status_of(hdrs)))
    return why == 'end' and len(data) >= want
if not scan(go):
    print('the first scan ended early (its node was away longer than the retries last)')
sys.exit(0 if scan() else 1)
PY
scan=$!
sleep 1
for round in 1 2; do
  for node in east-0 east-1; do
    "$STRATA" restart "$node" --dir "$DIR" >/dev/null 2>&1 || fail "restarting $node (round $round) failed"
    sleep 1
  done
done
touch "$TMPD/go"
wait "$scan"
rc=$?
cat "$TMPD/scan.out"
if [ "$rc" -ne 0 ] || grep -q "query of death" "$TMPD/router.log"; then
  grep -m2 "query of death" "$TMPD/router.log"
  fail "the scan failed or was refused across graceful restarts of its nodes"
fi
echo "qod_rolling_restart_test: passed"
