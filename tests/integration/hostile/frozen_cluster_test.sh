#!/usr/bin/env bash
# frozen_cluster_test.sh — a cluster whose only node is frozen (SIGSTOP: the process keeps its
# sockets, the kernel still accepts connections, nothing answers) is marked down by the router
# ("cluster west has no reachable node ... no answer to a keepalive PING"), yet every later
# request routed to it by a single-cluster profile still waits 2.5-5 s for its own keepalive
# timeout before getting that UNAVAILABLE. A killed node gets the same answer in ~20 ms
# (docs/router.md, "Dead clusters": "the client gets UNAVAILABLE ... at once"). Expected: once
# the cluster is known down, requests fail at once. Fails when one of 4 requests made after the
# cluster was seen down takes longer than MAX_MS (default 1000).
# Usage: frozen_cluster_test.sh PATH/TO/strata [MAX_MS]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib.sh"
STRATA=$1
MAX_MS=${2:-1000}
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init frozen_cluster
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >/dev/null || fail "strata up failed"
cbtq() { BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>/dev/null; }
cbtq createtable t families=cf >/dev/null || fail "createtable failed"
cbtq createappprofile i towest d route-to=west force=true >/dev/null || fail "createappprofile failed"
python3 "$HERE/hold.py" timed "$PORT" t towest 1 60000 >/dev/null || fail "a read via west failed before the freeze"
WEST=$(cat "$DIR/run/west-0.pid")
kill -STOP "$WEST"
trap 'kill -CONT $WEST 2>/dev/null; instance_teardown' EXIT
# Wait (bounded) until the router has logged the cluster down.
for _ in $(seq 1 100); do
  grep -q "cluster=west health=down" "$DIR/logs/router.log" && break
  sleep 0.2
done
grep -q "cluster=west health=down" "$DIR/logs/router.log" || fail "the router never marked west down"
python3 "$HERE/hold.py" timed "$PORT" t towest 4 "$MAX_MS" ||
  fail "requests to a cluster known to be down are not failed at once"
echo PASS
