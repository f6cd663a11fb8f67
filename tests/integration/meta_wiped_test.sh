#!/usr/bin/env bash
# meta_wiped_test.sh — the first node of the first cluster (which holds that cluster's copy of the
# instance metadata) comes back with an empty data directory, two clusters of one node: tables
# and app profiles must still be listed through the router. The router used to create an empty
# metadata copy there and, reading the first cluster's copy first, served an instance with no
# table and no profile although west held them all; it now copies west's records into the new
# copy (marked until done). Then a marker left by a router stopped half-way (written on the node
# directly) makes the next router start seed that copy again and remove the marker.
# Skips (77) without cbt.
# Usage: meta_wiped_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
instance_init meta_wiped
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
R=127.0.0.1:$PORT
cbtr "$R" createtable t families=cf >/dev/null || fail "createtable"
cbtr "$R" createappprofile i prof d route-to=west >/dev/null || fail "createappprofile"
cbtr "$R" set t r1 cf:q=v1 >/dev/null || fail "set r1"
EAST=$(sed -n 's/^node = \(127[^ ]*\) .*east-0$/\1/p' "$DIR/topology")
WEST=$(sed -n 's/^node = \(127[^ ]*\) .*west-0$/\1/p' "$DIR/topology")
meta_rows() { # ADDR: the row keys of a node's metadata copy
  BIGTABLE_EMULATOR_HOST=$1 timeout 60 "$CBT" -project _strata -instance _strata read metadata \
    2>/dev/null | grep -a '^[a-z]'
}
# Every write reached west's copy (replication), so wiping east leaves west the only full copy.
for _ in $(seq 1 100); do meta_rows "$WEST" | grep -q '^profile/prof' && break; sleep 0.1; done
meta_rows "$WEST" | grep -q '^table/.*/tables/t$' || fail "west's metadata copy lacks table t"

check_served() { # WHAT
  cbtr "$R" ls >"$TMPD/ls.out" || fail "$1: cbt ls"
  grep -qx t "$TMPD/ls.out" || { cat "$TMPD/ls.out"; fail "$1: table t is not listed"; }
  cbtr "$R" getappprofile i prof >"$TMPD/prof.out" ||
    { cat "$TMPD/prof.out"; fail "$1: app profile prof is gone"; }
}

echo "== east-0 wiped while the instance is down"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
rm -rf "$DIR/east-0"
"$STRATA" up --dir "$DIR" >"$TMPD/up2.out" 2>&1 || { cat "$TMPD/up2.out"; fail "strata up after the wipe"; }
check_served "after the wipe"
meta_rows "$EAST" | grep -q '^table/.*/tables/t$' || fail "east's new copy was not seeded"
meta_rows "$EAST" | grep -q '^seed/pending/' && fail "the seeding marker stayed in east's copy"

echo "== a marker left behind is seeded again at the next start"
BIGTABLE_EMULATOR_HOST=$EAST timeout 60 "$CBT" -project _strata -instance _strata \
  set metadata seed/pending/east m:v=1 >/dev/null 2>&1 || fail "writing a marker"
"$STRATA" restart router --dir "$DIR" >"$TMPD/restart.out" 2>&1 ||
  { cat "$TMPD/restart.out"; fail "strata restart router with a marker in east's copy"; }
check_served "after the restart"
grep -q "copying every record" "$DIR/logs/router.log" || fail "the router did not seed again"
for _ in $(seq 1 100); do meta_rows "$EAST" | grep -q '^seed/pending/' || break; sleep 0.1; done
meta_rows "$EAST" | grep -q '^seed/pending/' && fail "the marker stayed in east's copy"
echo "PASS"
