#!/usr/bin/env bash
# table_race_test.sh — two strata-routers of one instance (one node) take CreateTable and
# RestoreTable of the same table id at the same moment, and one right after the other: exactly
# one proceeds, the other answers ALREADY_EXISTS, and the table is wholly the winner's (schema
# and rows), never one's schema over the other's tablets nor a new table dropped by a restore
# (table_race).
# Usage: table_race_test.sh strata-node strata-router table_race
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
RACE=$3

dir=$(make_tmp)
start_member "$dir/n1" 1
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $NODE_ADDR $dir/n1
TOPO
start_router "$dir/topology" "$dir/ra.log"; RA=$ROUTER_ADDR
start_router "$dir/topology" "$dir/rb.log"; RB=$ROUTER_ADDR
timeout 240 "$RACE" "$RA" "$RB" 4
rc=$?
if grep -l 'Sanitizer' "$dir"/r*.log "$dir"/n1.log; then echo "FAIL: sanitizer report"; rc=1; fi
[ $rc = 0 ] && echo "PASS" || echo "FAILED"
exit $rc
