#!/usr/bin/env bash
# failover_full_disk_test.sh — `strata failover` away from a first cluster whose metadata node
# answers but cannot write (docs/router.md, App profiles), two clusters of one node, east-0's
# data directory on a 64 MiB tmpfs filled up:
# 1. east's writes fail RESOURCE_EXHAUSTED; `strata failover app west` moves the profile (exit 0):
#    the etag compare-and-set that east's metadata node refuses for lack of space goes to west.
#    It used to fail "UpdateAppProfile refused: RESOURCE_EXHAUSTED" even with --force, at the
#    moment the operator moves clients off the full cluster, while a cbt update without an etag
#    worked;
# 2. with west down too, the refusal names east's metadata copy as the one that cannot be
#    written (it named a log file and said "free disk space and retry").
# Needs root (mount -t tmpfs) and cbt; skips (77) without them.
# Usage: failover_full_disk_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "SKIP: cbt missing"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: not root (cannot mount a small tmpfs)"; exit 77; }
instance_init failover_full_disk
EAST=$DIR/east-0
mkdir -p "$EAST"
mount -t tmpfs -o size=64m tmpfs "$EAST" 2>/dev/null || { echo "SKIP: cannot mount a tmpfs"; exit 77; }
chmod 700 "$EAST"
finish() {
  "$STRATA" down --dir "$DIR" >/dev/null 2>&1
  umount "$EAST" 2>/dev/null || umount -l "$EAST"
  instance_teardown
}
trap finish EXIT
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtq() { cbtr "127.0.0.1:$PORT" "$@"; }
cbtq createappprofile i app d route-to=east >/dev/null || fail "profile app"
cbtq createappprofile i app2 d route-to=east >/dev/null || fail "profile app2"
cbtq createtable t families=cf >/dev/null || fail "createtable"
routes_to() { cbtq getappprofile i "$1" | grep -q "cluster_id:\"$2\""; }

echo "== east's disk fills"
dd if=/dev/zero of="$EAST/filler" bs=1M count=100 >/dev/null 2>&1
value=$(head -c 6000 /dev/zero | tr '\0' x)
full=0
for i in $(seq 1 60); do
  if ! cbtq set t "k$i" app-profile=app "cf:q=$value" >"$TMPD/set.out" 2>&1; then
    grep -q 'No space left on device' "$TMPD/set.out" ||
      { cat "$TMPD/set.out"; fail "a write on east's full disk failed otherwise"; }
    full=1
    break
  fi
done
[ "$full" = 1 ] || fail "60 writes fit east's full disk"

echo "== strata failover app west"
"$STRATA" failover app west --dir "$DIR" >"$TMPD/fo1.out" 2>&1 ||
  { cat "$TMPD/fo1.out"; fail "strata failover away from the full cluster failed"; }
routes_to app west || { cat "$TMPD/fo1.out"; fail "the profile does not route to west"; }
cbtq set t w1 app-profile=app cf:q=west >/dev/null || fail "a write through app on west failed"

echo "== west down too: the refusal names east's metadata copy"
"$STRATA" chaos kill-cluster west --dir "$DIR" >/dev/null || fail "kill-cluster west"
for _ in $(seq 1 100); do
  grep -q 'cluster=west health=down' "$DIR/logs/router.log" && break
  sleep 0.1
done
"$STRATA" failover app2 west --dir "$DIR" --force >"$TMPD/fo2.out" 2>&1 &&
  { cat "$TMPD/fo2.out"; fail "an update with every metadata copy unwritable or down succeeded"; }
grep -q "metadata copy of cluster east (node [0-9.:]*) cannot be written: RESOURCE_EXHAUSTED" \
  "$TMPD/fo2.out" || { cat "$TMPD/fo2.out"; fail "the refusal does not name east's metadata copy"; }
routes_to app2 east || fail "app2 moved although the update failed"
echo "PASS"
