#!/usr/bin/env bash
# repl_leftover_table_test.sh — a table deleted while a cluster was down must not stop that
# cluster's replication for good, on `strata up --clusters 2 --nodes 1` with cbt:
#   dz and other created; east and west cut apart; z1..z3 written in dz in west (unshipped);
#   west killed; DeleteTable dz (east drops it, west keeps its tablets and their records); west
#   restarted, link healed; no table dz is created again.
# West's shipper sends z1..z3 to east, which has no dz (NOT_FOUND), and used to wait behind them
# for good: `cbt waitforreplication` of any table never returned (the token holds west's
# position), and west kept dz. The router now drops the leftover dz on west, whose shipper then
# skips its records: a row written in west to other must then be consistent within 60 s, and
# west must no longer hold dz.
# Skips (77) without cbt.
# Usage: repl_leftover_table_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "SKIP: cbt not installed"; exit 77; }
instance_init repl_leftover_table
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
node_addr() { awk -v c="[cluster $1]" '$0 == c {f=1; next} /^\[/{f=0} f && /^node =/{print $3; exit}' "$DIR/topology"; }
EAST=$(node_addr east); WEST=$(node_addr west); R=127.0.0.1:$PORT
[ -n "$EAST" ] && [ -n "$WEST" ] || fail "no node addresses in $DIR/topology"
c() { cbtr "$R" "$@"; }
# tables ADDR: the table ids a node (or the router) lists, on one line.
tables() { cbtr "$1" ls | grep -E '^(dz|other)$' | sort | tr '\n' ' '; }

c createtable dz families=cf >/dev/null || fail "createtable dz"
c createtable other families=cf >/dev/null || fail "createtable other"
c createappprofile i onwest w route-to=west >/dev/null || fail "createappprofile onwest"
c set dz z0 cf:c=v >/dev/null || fail "set z0"
c waitforreplication dz >/dev/null || fail "waitforreplication dz"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "partition"
for i in 1 2 3; do c set dz "z$i" app-profile=onwest cf:c=v >/dev/null || fail "set z$i in west"; done
"$STRATA" chaos kill-cluster west --dir "$DIR" >/dev/null || fail "kill west"
c deletetable dz >"$TMPD/del.out" || fail "deletetable with west down: $(cat "$TMPD/del.out")"
"$STRATA" chaos restart-cluster west --dir "$DIR" >/dev/null || fail "restart west"
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal"
[ "$(tables "$R")" = "other " ] || fail "the router lists $(tables "$R"), expected other"
c set other o1 app-profile=onwest cf:c=v >/dev/null || fail "set o1 in west"
# cbtr bounds the call to 60 s: it used to hang for good.
c waitforreplication other >"$TMPD/wait.out" ||
  fail "waitforreplication other did not return: $(cat "$TMPD/wait.out")"
[ "$(tables "$WEST")" = "other " ] || fail "west still holds $(tables "$WEST")"
[ "$(tables "$EAST")" = "other " ] || fail "east holds $(tables "$EAST")"
grep -q "event=leftover_table_dropped table=projects/p/instances/i/tables/dz" "$DIR"/logs/*router*.log ||
  fail "no event=leftover_table_dropped for dz in the router's log"
# The link works again: a later row written in west reaches east.
c set other o2 app-profile=onwest cf:c=v2 >/dev/null || fail "set o2 in west"
c waitforreplication other >/dev/null || fail "waitforreplication other after o2"
cbtr "$EAST" lookup other o2 | grep -q v2 || fail "o2 did not reach east"
echo "PASS"
