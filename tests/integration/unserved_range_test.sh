#!/usr/bin/env bash
# unserved_range_test.sh — a node comes back with an empty data directory (a replaced disk),
# leaving ranges of a table that no node of its cluster serves. Two clusters (east, west) of two
# nodes; table t split so both east nodes hold tablets; rows replicated to west; east-1 killed
# with kill -9, its data directory moved away, restarted empty. Then:
#   - a multi-cluster profile reads every row and writes a row of a lost range (served by west:
#     it used to fail UNAVAILABLE after retrying east alone);
#   - a single-cluster profile on east gets FAILED_PRECONDITION naming east and the remedy, at
#     once (it used to get UNAVAILABLE, which clients retry for as long as they are let);
#   - `strata status` names the cluster and the table (it used to show everything ok), exit 1.
# Skips (77) without cbt.
# Usage: unserved_range_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
instance_init unserved_range
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
R=127.0.0.1:$PORT
cbtr "$R" createtable t families=cf splits=b,c,d,e,f >/dev/null || fail "createtable"
cbtr "$R" createappprofile i multi d route-any >/dev/null || fail "createappprofile multi"
cbtr "$R" createappprofile i oneast d route-to=east >/dev/null || fail "createappprofile oneast"
cbtr "$R" createappprofile i onwest d route-to=west >/dev/null || fail "createappprofile onwest"
ROWS=(a1 a2 b1 c1 d1 e1 f1)
for k in "${ROWS[@]}"; do cbtr "$R" set t "$k" cf:q="v$k" >/dev/null || fail "set $k"; done
cbtr "$R" waitforreplication t >/dev/null || fail "waitforreplication"

# count PROFILE: rows of t read through PROFILE (cbt prints each row key alone on a line).
count() { cbtr "$R" read t app-profile="$1" | grep -c '^[a-z][0-9]$'; }
[ "$(count onwest)" = 7 ] || fail "west does not hold the 7 rows"

EAST1=$(sed -n 's/^node = \(127[^ ]*\) .*east-1$/\1/p' "$DIR/topology")
LOST=
for k in "${ROWS[@]}"; do # the first row east-1 holds (a node serves only its own tablets)
  cbtr "$EAST1" lookup t "$k" | grep -q "^$k\$" && { LOST=$k; break; }
done
[ -n "$LOST" ] || fail "east-1 holds no row of t"
echo "== east-1 (holding $LOST) comes back empty"
kill -9 "$(cat "$DIR/run/east-1.pid")" || fail "kill east-1"
mv "$DIR/east-1" "$DIR/east-1.old"
"$STRATA" restart east-1 --dir "$DIR" >"$TMPD/restart.out" 2>&1 ||
  { cat "$TMPD/restart.out"; fail "strata restart east-1"; }
# The router takes east back after two good probes; a multi-cluster plan then starts on east.
for _ in $(seq 1 50); do grep -q 'cluster=east health=up' "$DIR/logs/router.log" && break; sleep 0.2; done
sleep 1

echo "== a multi-cluster profile reads every row and writes in the lost range"
n=$(count multi)
[ "$n" = 7 ] || fail "multi read $n of 7 rows"
cbtr "$R" set t "$LOST" app-profile=multi cf:q=new >"$TMPD/set.out" ||
  { cat "$TMPD/set.out"; fail "multi write of $LOST"; }
cbtr "$R" lookup t "$LOST" app-profile=onwest | grep -q '"new"' || fail "the write is not on west"

echo "== a single-cluster profile on east gets a clear error"
start=$(date +%s%N)
cbtr "$R" lookup t "$LOST" app-profile=oneast >"$TMPD/one.out" && fail "oneast read of $LOST succeeded"
ms=$((($(date +%s%N) - start) / 1000000))
cat "$TMPD/one.out"
grep -q 'FailedPrecondition' "$TMPD/one.out" || fail "oneast read: not FAILED_PRECONDITION"
grep -q 'no node of cluster east serves' "$TMPD/one.out" || fail "oneast read: east not named"
grep -q 'strata failover' "$TMPD/one.out" || fail "oneast read: no remedy"
echo "oneast read refused after $ms ms"
cbtr "$R" set t "$LOST" app-profile=oneast cf:q=x >"$TMPD/one_set.out" &&
  fail "oneast write of $LOST succeeded"
grep -q 'FailedPrecondition' "$TMPD/one_set.out" || { cat "$TMPD/one_set.out"; fail "oneast write"; }
n=$(cbtr "$R" read t app-profile=oneast start=a1 end=b 2>/dev/null | grep -c '^a[0-9]$')
echo "oneast still reads the rows east-0 holds: $n of a1, a2 (those of east-1: 0)"

echo "== strata status names the cluster and the table"
"$STRATA" status --dir "$DIR" >"$TMPD/status.out" 2>&1 && { cat "$TMPD/status.out"; fail "status exit 0"; }
cat "$TMPD/status.out"
grep -q 'east: no node serves .* of table t' "$TMPD/status.out" || fail "status does not name the hole"
echo "PASS"
