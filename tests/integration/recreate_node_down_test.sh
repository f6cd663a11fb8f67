#!/usr/bin/env bash
# recreate_node_down_test.sh — a table deleted while a node was down, then created again under
# the same name, starts empty in every cluster, on `strata up --clusters 2 --nodes 1` with cbt:
# row old1 written and replicated, west's node killed, DeleteTable (the down node keeps its
# tablets of the table), west restarted, CreateTable of the same name. West used to serve old1
# again in the new table (CreateTable took over the tablets DeleteTable could not drop there).
# Skips (77) without cbt.
# Usage: recreate_node_down_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "SKIP: cbt not installed"; exit 77; }
instance_init recreate_node_down
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
c() { cbtr "127.0.0.1:$PORT" "$@"; }
c createtable tz families=cf >/dev/null || fail "createtable"
c createappprofile i onwest w route-to=west >/dev/null || fail "createappprofile onwest"
c set tz old1 cf:c=old >/dev/null || fail "set old1"
c waitforreplication tz >/dev/null || fail "waitforreplication"
kill -9 "$(cat "$DIR/run/west-0.pid")"
c deletetable tz >"$TMPD/del.out" || fail "deletetable with west down: $(cat "$TMPD/del.out")"
"$STRATA" up --dir "$DIR" >"$TMPD/up2.out" 2>&1 || { cat "$TMPD/up2.out"; fail "restarting west"; }
ok=0
for _ in $(seq 1 60); do c createtable tz families=cf >"$TMPD/cr.out" && { ok=1; break; }; sleep 0.5; done
[ $ok = 1 ] || fail "createtable tz again: $(cat "$TMPD/cr.out")"
c read tz app-profile=onwest >"$TMPD/west.out" || fail "reading tz in west: $(cat "$TMPD/west.out")"
if grep -q old1 "$TMPD/west.out"; then fail "the new table tz holds the deleted table's row in west"; fi
c read tz >"$TMPD/east.out" || fail "reading tz: $(cat "$TMPD/east.out")"
if grep -q old1 "$TMPD/east.out"; then fail "the new table tz holds the deleted table's row"; fi
echo "PASS"
