#!/usr/bin/env bash
# failover_dead_test.sh — `strata failover` where a cluster is dead, two clusters of one node:
# 1. pointing a single-cluster profile AT a cluster whose nodes are all down is refused (exit 1,
#    naming the node), and the profile stays where it was; --force does it anyway. It used to
#    succeed silently, sending every request of the profile to a dead cluster.
# 2. moving a profile AWAY from a dead first cluster (the manual failover of a zone loss) works:
#    the router compared the profile's etag on the first cluster's metadata only, so the update
#    failed UNAVAILABLE for as long as that cluster was down; it now compares on the first
#    healthy cluster. Polls (bounded) for the router to see the kill; no timing assertions.
# 3. the same at once after the kill, before the router's probes noticed (three rounds): the
#    compare-and-set that cannot reach the dead cluster's node goes to the next healthy one.
# Skips (77) without cbt.
# Usage: failover_dead_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
instance_init failover_dead
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 3 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtr "127.0.0.1:$PORT" createappprofile i prof d route-to=east >/dev/null || fail "createappprofile"
routes_to() { cbtr "127.0.0.1:$PORT" getappprofile i prof | grep -q "cluster_id:\"$1\""; }

echo "== failover to a dead cluster is refused"
"$STRATA" chaos kill-cluster west --dir "$DIR" >/dev/null || fail "kill-cluster west"
"$STRATA" failover prof west --dir "$DIR" >"$TMPD/fo1.out" 2>&1 &&
  { cat "$TMPD/fo1.out"; fail "strata failover to the dead cluster west succeeded"; }
grep -q "west-0 of west .* does not answer" "$TMPD/fo1.out" ||
  { cat "$TMPD/fo1.out"; fail "the refusal does not name the dead node"; }
routes_to east || fail "the profile moved off east although the failover was refused"
"$STRATA" failover prof west --dir "$DIR" --force >"$TMPD/fo2.out" 2>&1 ||
  { cat "$TMPD/fo2.out"; fail "strata failover --force to west"; }
routes_to west || fail "--force did not move the profile to west"
"$STRATA" chaos restart-cluster west --dir "$DIR" >/dev/null || fail "restart-cluster west"
"$STRATA" failover prof east --dir "$DIR" >"$TMPD/fo3.out" 2>&1 ||
  { cat "$TMPD/fo3.out"; fail "strata failover back to east with both clusters up"; }

echo "== failover away from a dead first cluster"
"$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "kill-cluster east"
ok=0
for _ in $(seq 1 40); do
  if "$STRATA" failover prof west --dir "$DIR" >"$TMPD/fo4.out" 2>&1; then ok=1; break; fi
  sleep 0.5
done
[ "$ok" = 1 ] || { cat "$TMPD/fo4.out"; fail "strata failover away from the dead east never succeeded"; }
routes_to west || fail "the profile does not route to west after the failover"

echo "== failover at once after the first cluster died"
# Right after the kill the router may not have noticed yet: its compare-and-set went to the dead
# cluster's metadata and the failover failed UNAVAILABLE "could not store app profile" (the
# request never reached a node, so it now goes to the next healthy cluster).
# east restarted, the profile back on it, and the router seeing east healthy again (its log).
east_back() {
  local ups
  ups=$(grep -c "cluster=east health=up" "$DIR/logs/router.log")
  "$STRATA" chaos restart-cluster east --dir "$DIR" >/dev/null || fail "restart-cluster east"
  ok=0
  for _ in $(seq 1 40); do
    if "$STRATA" failover prof east --dir "$DIR" >"$TMPD/fo5.out" 2>&1; then ok=1; break; fi
    sleep 0.5
  done
  [ "$ok" = 1 ] || { cat "$TMPD/fo5.out"; fail "strata failover back to the restarted east"; }
  for _ in $(seq 1 100); do
    [ "$(grep -c "cluster=east health=up" "$DIR/logs/router.log")" -gt "$ups" ] && return
    sleep 0.2
  done
  fail "the router never saw east healthy again"
}
east_back
for round in 1 2 3; do
  "$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "kill-cluster east ($round)"
  "$STRATA" failover prof west --dir "$DIR" >"$TMPD/fo6.out" 2>&1 ||
    { cat "$TMPD/fo6.out"; fail "strata failover right after east died failed (round $round)"; }
  routes_to west || fail "the profile does not route to west (round $round)"
  [ $round = 3 ] && break
  east_back
done
echo "PASS"
