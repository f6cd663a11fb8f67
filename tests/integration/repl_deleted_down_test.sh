#!/usr/bin/env bash
# repl_deleted_down_test.sh — rows of a deleted table, unshipped from a cluster that was down
# during the DeleteTable, must not enter a later table of the same name anywhere, on
# `strata up --clusters 2 --nodes 1` with cbt:
#   dt created, old1..3 written and replicated; east and west cut apart; old4, old5 written in
#   west (unshipped); west killed; DeleteTable (west keeps its tablets and their unshipped
#   records); west restarted, link healed (west's shipper sends old4/old5, east has no dt:
#   NOT_FOUND, resent after a backoff); CreateTable dt (drops west's old tablets first), new1
#   written in east, new2 in west.
# Both clusters must end with exactly new1 and new2. West used to send old4/old5 again after the
# CreateTable (its check before each send asked whether a table of that *name* existed, and the
# new one did), so east's new dt held them and west's did not.
# Skips (77) without cbt.
# Usage: repl_deleted_down_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "SKIP: cbt not installed"; exit 77; }
instance_init repl_deleted_down
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
node_addr() { awk -v c="[cluster $1]" '$0 == c {f=1; next} /^\[/{f=0} f && /^node =/{print $3; exit}' "$DIR/topology"; }
EAST=$(node_addr east); WEST=$(node_addr west); R=127.0.0.1:$PORT
[ -n "$EAST" ] && [ -n "$WEST" ] || fail "no node addresses in $DIR/topology"
c() { cbtr "$R" "$@"; }
# rows ADDR: the row keys of dt at ADDR (a node: that cluster's copy), sorted, on one line.
rows() { cbtr "$1" read dt columns=cf:c | grep -E '^(old|new)[0-9]+$' | sort | tr '\n' ' '; }

c createtable dt families=cf >/dev/null || fail "createtable dt"
c createappprofile i onwest w route-to=west >/dev/null || fail "createappprofile onwest"
for i in 1 2 3; do c set dt "old$i" cf:c=old >/dev/null || fail "set old$i"; done
c waitforreplication dt >/dev/null || fail "waitforreplication"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "partition"
for i in 4 5; do c set dt "old$i" app-profile=onwest cf:c=old >/dev/null || fail "set old$i in west"; done
[ "$(rows "$EAST")" = "old1 old2 old3 " ] || fail "east holds $(rows "$EAST") while cut from west"
"$STRATA" chaos kill-cluster west --dir "$DIR" >/dev/null || fail "kill west"
c deletetable dt >"$TMPD/del.out" || fail "deletetable with west down: $(cat "$TMPD/del.out")"
c createtable dt families=cf,cg >/dev/null 2>&1 # refused while west is down; tried as a user would
"$STRATA" chaos restart-cluster west --dir "$DIR" >/dev/null || fail "restart west"
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal"
# West's shipper sends old4/old5 to east, which has no dt: NOT_FOUND, sent again after a backoff.
sleep 2
ok=0
for _ in $(seq 1 60); do c createtable dt families=cf,cg >"$TMPD/cr.out" && { ok=1; break; }; sleep 0.5; done
[ $ok = 1 ] || fail "createtable dt again: $(cat "$TMPD/cr.out")"
c set dt new1 cf:c=new >/dev/null || fail "set new1"
c set dt new2 app-profile=onwest cf:c=new >/dev/null || fail "set new2 in west"
c waitforreplication dt >/dev/null || fail "waitforreplication after the new table"
# A batch sent again waits up to 10 s (the shipper's longest backoff): watch past that (a cbt
# call takes most of a second here).
for _ in $(seq 1 8); do
  e=$(rows "$EAST"); w=$(rows "$WEST")
  case "$e$w" in *old*) fail "rows of the deleted table in the new one: east: $e, west: $w" ;; esac
  sleep 1
done
[ "$e" = "new1 new2 " ] || fail "east's dt holds $e, expected new1 new2"
[ "$w" = "new1 new2 " ] || fail "west's dt holds $w, expected new1 new2"
echo "PASS"
