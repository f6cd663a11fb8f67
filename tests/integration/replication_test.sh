#!/usr/bin/env bash
# replication_test.sh — proves two clusters converge: `strata up` starts clusters east
# and west (one node each) and a router; cbt writes, overwrites and deletes on the east node and
# on the west node directly (same cells on both sides, so conflicts resolve by commit time), then
# `cbt waitforreplication` through the router returns and both nodes, read directly, give
# byte-identical answers. Then west is stopped (a partition), east takes more writes, the whole
# instance is restarted, and after waitforreplication west has them too (shipping resumed from
# the acknowledged position). Single-cluster app profiles: writes through east's profile, cbt
# waitforreplication, identical reads through west's. `strata chaos partition` keeps a write on
# its side (status shows the cut) until `strata chaos heal`. `strata status` shows the lag.
# Usage: replication_test.sh PATH/TO/strata [BIN_DIR]
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
BIN_ARGS=()
if [ $# -ge 2 ] && [ -n "$2" ]; then BIN_ARGS=(--bin-dir "$2"); fi
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

instance_init repl_test

echo "== strata up --clusters 2 --nodes 1"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 "${BIN_ARGS[@]}" ||
  fail "strata up failed"
EAST=$(awk '/^\[cluster east\]/{c=1} /^\[cluster west\]/{c=0} c && /^node =/{print $3; exit}' "$DIR/topology")
WEST=$(awk '/^\[cluster west\]/{c=1} c && /^node =/{print $3; exit}' "$DIR/topology")
[ -n "$EAST" ] && [ -n "$WEST" ] || fail "no node addresses in $DIR/topology"
echo "east=$EAST west=$WEST router=127.0.0.1:$PORT"

C=("$CBT" -project p -instance i)
# cbt against one address; bounded so a stuck call fails the test instead of hanging it.
at() { local addr=$1; shift; BIGTABLE_EMULATOR_HOST=$addr timeout 120 "${C[@]}" "$@" 2>/dev/null; }

echo "== schema through the router (every cluster gets the table)"
at "127.0.0.1:$PORT" createtable rt || fail "createtable"
at "127.0.0.1:$PORT" createfamily rt cf || fail "createfamily"
at "127.0.0.1:$PORT" createfamily rt cg || fail "createfamily cg"

echo "== writes in both clusters, directly on their nodes"
for i in 1 2 3 4 5; do at "$EAST" set rt "e$i" cf:a="east-$i" cg:b="x$i" || fail "set e$i"; done
for i in 1 2 3; do at "$WEST" set rt "w$i" cf:a="west-$i" || fail "set w$i"; done
# The same cell (explicit timestamp) written in both clusters: the later commit wins everywhere.
at "$EAST" set rt both cf:c=from-east@5000 || fail "set both east"
at "$WEST" set rt both cf:c=from-west@5000 || fail "set both west"
at "$WEST" set rt e2 cf:a=west-overwrites-e2 || fail "overwrite e2"
at "$EAST" deleterow rt e3 || fail "deleterow e3"
at "$WEST" deletecolumn rt e4 cg b || fail "deletecolumn e4"

same() {
  at "127.0.0.1:$PORT" waitforreplication rt >/dev/null || fail "waitforreplication failed"
  A=$(at "$EAST" read rt) || fail "read east"
  B=$(at "$WEST" read rt) || fail "read west"
  if [ "$A" != "$B" ]; then
    echo "--- east"; echo "$A"; echo "--- west"; echo "$B"
    fail "clusters differ after waitforreplication"
  fi
}

echo "== waitforreplication, then east and west answer the same"
same
echo "$A" | grep -q '"west-overwrites-e2"' || fail "e2 overwrite missing"
echo "$A" | grep -q '"from-west"' || fail "later write of 'both' did not win"
echo "$A" | grep -q '"from-east"' && fail "older write of 'both' still visible"
echo "$A" | grep -qx 'e3' && fail "deleted row e3 still visible"
echo "$A" | grep -q '"x4"' && fail "deleted column e4 cg:b still visible"
echo "$A" | grep -q '"east-5"' || fail "e5 missing"

echo "== single-cluster profiles: write through east, waitforreplication, read through west"
R="127.0.0.1:$PORT"
at "$R" createappprofile i oneast "east only" route-to=east >/dev/null || fail "profile oneast"
at "$R" createappprofile i onwest "west only" route-to=west >/dev/null || fail "profile onwest"
for i in 1 2 3 4; do
  at "$R" set rt "p$i" app-profile=oneast cf:a="profile-$i" cg:b="y$i" || fail "set p$i via oneast"
done
at "$R" set rt p2 app-profile=oneast cf:a=profile-2-again || fail "overwrite p2 via oneast"
at "$R" deletecolumn rt p3 cg b app-profile=oneast || fail "deletecolumn p3 via oneast"
at "$R" waitforreplication rt >/dev/null || fail "waitforreplication after profile writes"
PE=$(at "$R" read rt prefix=p app-profile=oneast) || fail "read via oneast"
PW=$(at "$R" read rt prefix=p app-profile=onwest) || fail "read via onwest"
[ "$PE" = "$PW" ] || { echo "--- east"; echo "$PE"; echo "--- west"; echo "$PW"; fail "profile reads differ"; }
echo "$PW" | grep -q '"profile-2-again"' || fail "west lacks the overwrite of p2"
echo "$PW" | grep -q '"y3"' && fail "west still shows the deleted column of p3"
echo "ok: identical through oneast and onwest"

echo "== strata chaos partition: writes stay on their side until heal"
"$STRATA" chaos partition east west --dir "$DIR" || fail "chaos partition"
STATUS=$("$STRATA" status --dir "$DIR") || { echo "$STATUS"; fail "status unhealthy while partitioned"; }
echo "$STATUS" | grep -Eq "^east +zone-a +1/1 +cut from west" || { echo "$STATUS"; fail "status lacks east's cut"; }
echo "$STATUS" | grep -Eq "^west +zone-b +1/1 +cut from east" || { echo "$STATUS"; fail "status lacks west's cut"; }
echo "$STATUS" | grep -Eq "^east .* west: [0-9]+ rec .*CUT" || { echo "$STATUS"; fail "lag column lacks CUT"; }
at "$R" set rt cut1 app-profile=oneast cf:a=during-partition || fail "write on east while partitioned"
sleep 1 # what replication would need; the row must still be absent on west
at "$R" read rt prefix=cut app-profile=onwest | grep -q during-partition &&
  fail "a write crossed the partition"
"$STRATA" chaos heal --dir "$DIR" || fail "chaos heal"
at "$R" waitforreplication rt >/dev/null || fail "waitforreplication after heal"
at "$R" read rt prefix=cut app-profile=onwest | grep -q during-partition ||
  fail "west lacks the write made during the partition after heal"
"$STRATA" status --dir "$DIR" | grep -Eq "^east +zone-a +1/1 +open" || fail "status still shows a cut"
echo "ok: partition held, heal caught up"

echo "== partition: west down, east writes, restart, catch up"
kill "$(cat "$DIR/run/west-0.pid")" || fail "cannot stop west"
for i in 6 7 8; do at "$EAST" set rt "e$i" cf:a="during-$i" || fail "set e$i"; done
"$STRATA" down --dir "$DIR" >/dev/null 2>&1
"$STRATA" up --dir "$DIR" --port "$PORT" "${BIN_ARGS[@]}" >/dev/null || fail "restart failed"
same
echo "$B" | grep -q '"during-8"' || fail "west lacks writes made while it was down"
grep -q "resumes at lsn=" "$DIR/logs/east-0.log" || fail "east's shipper did not log its position"

echo "== strata status shows replication"
STATUS=$("$STRATA" status --dir "$DIR") || { echo "$STATUS"; fail "status unhealthy"; }
echo "$STATUS"
echo "$STATUS" | grep -q "REPLICATION" || fail "status lacks the replication column"
echo "$STATUS" | grep -Eq "^east .* west: [0-9]+ rec" || fail "status lacks east's lag to west"
echo "$STATUS" | grep -Eq "^west .* east: [0-9]+ rec" || fail "status lacks west's lag to east"

"$STRATA" down --dir "$DIR" --purge >/dev/null 2>&1
echo "PASS"
