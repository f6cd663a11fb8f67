#!/usr/bin/env bash
# handstart_test.sh — proves that a replicated instance started by hand cannot claim a
# consistency it does not have. A topology of clusters east and west (one node each) comes from
# `strata up`, which is then stopped. Started by hand with `--node-num N --cluster-num C` and no
# `--config`, a node refuses to start and names the missing flag. Started as single-cluster
# nodes (`--node-num N` only) behind a router that knows both clusters, nothing replicates:
# `cbt waitforreplication` must fail (FAILED_PRECONDITION naming the node and the peer), not
# return at once, and `strata status` must say "not replicating to". With only east
# replicating, east's CheckConsistency fails naming west (its Apply is UNIMPLEMENTED) instead
# of answering "not yet" for ever. Restarted with
# `--config TOPOLOGY --cluster-num C`, waitforreplication returns and the west node has the row.
# A data directory started with another cluster or node number than it was written under is
# refused, naming both.
# With west killed, `strata status` shows east's link as down, not "open".
# Usage: handstart_test.sh PATH/TO/strata PATH/TO/strata-node PATH/TO/strata-router
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1 NODE_BIN=$2 ROUTER_BIN=$3
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

TMPD=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/handstart.XXXXXX")
DIR=$TMPD/inst
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
trap 'stop_all; "$STRATA" down --dir "$DIR" >/dev/null 2>&1; rm -rf "$TMPD"; cleanup' EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMPD"/*.log; do
    [ -e "$f" ] || continue
    echo "--- $f (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}

HAND=() # pids of the processes this test starts by hand
stop_all() {
  for p in "${HAND[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${HAND[@]}"; do wait "$p" 2>/dev/null; done
  HAND=()
}

echo "== a topology of two clusters from strata up, then stopped"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 --no-unix >/dev/null ||
  fail "strata up failed"
"$STRATA" down --dir "$DIR" >/dev/null || fail "strata down failed"
TOPO=$DIR/topology
read -r EAST EAST_DATA < <(awk '/^\[cluster east\]/{c=1} /^\[cluster west\]/{c=0} c && /^node =/{print $3, $4; exit}' "$TOPO")
read -r WEST WEST_DATA < <(awk '/^\[cluster west\]/{c=1} c && /^node =/{print $3, $4; exit}' "$TOPO")
[ -n "$EAST" ] && [ -n "$WEST" ] || fail "no node addresses in $TOPO"

# start NAME ARGS...: a process in the background, logged to $TMPD/NAME.log
start() {
  local name=$1; shift
  "$@" >"$TMPD/$name.log" 2>&1 &
  HAND+=($!)
}
wait_listen() { wait_line "$TMPD/$1.log" 'listening on' >/dev/null || fail "$1 did not start"; }

echo "== --cluster-num without --config is refused"
# (bounded: a node that does start would serve until killed)
timeout 20 "$NODE_BIN" --data "$EAST_DATA" --listen "$EAST" --node-num 1 --cluster-num 1 \
  >"$TMPD/refused.log" 2>&1
[ $? = 2 ] || fail "strata-node started as a cluster member without the topology"
grep -q -- "--config" "$TMPD/refused.log" || fail "the refusal does not name --config"
grep -q "cluster-num 2" <(timeout 20 "$NODE_BIN" --data "$EAST_DATA" --cluster-num 2 2>&1) ||
  fail "the refusal does not name the cluster"
timeout 20 "$NODE_BIN" --data "$EAST_DATA" --listen "$EAST" --cluster-num east >/dev/null 2>&1
[ $? = 2 ] || fail "a non-numeric --cluster-num was accepted"

echo "== a cluster's data directory started with other numbers is refused, naming them"
# (it would ship its own cluster's log to itself and never to the cluster it left out)
timeout 20 "$NODE_BIN" --data "$EAST_DATA" --listen "$EAST" --node-num 1 --cluster-num 2 \
  --config "$TOPO" >"$TMPD/renumbered.log" 2>&1
rc=$?
[ $rc = 1 ] || fail "east's data directory started as cluster 2 (exit $rc)"
grep -q "written as cluster 1 node 1 but this node was started as cluster 2 node 1" \
  "$TMPD/renumbered.log" || fail "the refusal does not name both numbers: $(cat "$TMPD/renumbered.log")"
timeout 20 "$NODE_BIN" --data "$EAST_DATA" --listen "$EAST" --node-num 3 >"$TMPD/renumbered.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "started as cluster 0 node 3" "$TMPD/renumbered.log" ||
  fail "east's data directory started as node 3 (exit $rc)"

echo "== nodes without the topology behind a router that has it: never consistent"
start east "$NODE_BIN" --data "$EAST_DATA" --listen "$EAST" --node-num 1
start west "$NODE_BIN" --data "$WEST_DATA" --listen "$WEST" --node-num 2
wait_listen east
wait_listen west
start router "$ROUTER_BIN" --config "$TOPO" --listen "127.0.0.1:$PORT"
wait_listen router
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
C=("$CBT" -project p -instance i)
timeout 120 "${C[@]}" createtable ht || fail "createtable"
timeout 120 "${C[@]}" createfamily ht cf || fail "createfamily"
BIGTABLE_EMULATOR_HOST=$EAST timeout 120 "${C[@]}" set ht r1 cf:a=one || fail "set on east"
if OUT=$(timeout 60 "${C[@]}" waitforreplication ht 2>&1); then
  echo "$OUT"
  fail "waitforreplication succeeded though nothing replicates"
fi
echo "$OUT" | tail -n 2
echo "$OUT" | grep -q "does not replicate to cluster west" || fail "the error does not name the peer"
STATUS=$("$STRATA" status --dir "$DIR")
echo "$STATUS" | head -n 4
echo "$STATUS" | grep -Eq "^east +zone-a +1/1 +not replicating to west" ||
  fail "status does not show east's missing link"
stop_all

echo "== east with --config, west without: east's check names the cluster that cannot take writes"
start east "$NODE_BIN" --data "$EAST_DATA" --listen "$EAST" --node-num 1 --cluster-num 1 \
  --config "$TOPO"
start west "$NODE_BIN" --data "$WEST_DATA" --listen "$WEST" --node-num 2
wait_listen east
wait_listen west
start router "$ROUTER_BIN" --config "$TOPO" --listen "127.0.0.1:$PORT"
wait_listen router
BIGTABLE_EMULATOR_HOST=$EAST timeout 120 "${C[@]}" set ht r3 cf:a=three || fail "set r3 on east"
if OUT=$(timeout 120 "${C[@]}" waitforreplication ht 2>&1); then
  echo "$OUT"
  fail "waitforreplication succeeded though west takes no replicated writes"
fi
echo "$OUT" | tail -n 1
echo "$OUT" | grep -q "cluster west does not accept replicated writes" ||
  fail "the error does not name west as unable to take writes"
"$STRATA" status --dir "$DIR" | grep -Eq "^west +zone-b +1/1 +not replicating to east" ||
  fail "status does not show west's missing link"
stop_all

echo "== the same nodes with --config: replication, and waitforreplication returns"
start east "$NODE_BIN" --data "$EAST_DATA" --listen "$EAST" --node-num 1 --cluster-num 1 \
  --config "$TOPO"
start west "$NODE_BIN" --data "$WEST_DATA" --listen "$WEST" --node-num 2 --cluster-num 2 \
  --config "$TOPO"
wait_listen east
wait_listen west
start router "$ROUTER_BIN" --config "$TOPO" --listen "127.0.0.1:$PORT"
wait_listen router
BIGTABLE_EMULATOR_HOST=$EAST timeout 120 "${C[@]}" set ht r2 cf:a=two || fail "set r2 on east"
timeout 120 "${C[@]}" waitforreplication ht || fail "waitforreplication with --config"
BIGTABLE_EMULATOR_HOST=$WEST timeout 120 "${C[@]}" read ht 2>/dev/null | grep -q '^r2' ||
  fail "west lacks r2 after waitforreplication"
"$STRATA" status --dir "$DIR" | grep -Eq "^east +zone-a +1/1 +open" || fail "link not open"

echo "== west killed: east's link is down, not open"
kill -9 "${HAND[1]}"
wait "${HAND[1]}" 2>/dev/null
STATUS=$("$STRATA" status --dir "$DIR")
echo "$STATUS" | head -n 4
echo "$STATUS" | grep -Eq "^east +zone-a +1/1 +down to west" || fail "status does not show the link down"
echo "PASS"
