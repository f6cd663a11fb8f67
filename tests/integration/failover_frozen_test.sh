#!/usr/bin/env bash
# failover_frozen_test.sh — `strata failover PROF west` at once after every node of the profile's
# cluster east froze (SIGSTOP: a paused VM, a network black hole) succeeds the first time: the
# router, which has not marked east down yet, answered UpdateAppProfile UNAVAILABLE ("no answer to
# a keepalive PING") and the command failed, while the same command a moment later succeeded. It
# now sends the update again (bounded, said on stderr) until the router has noticed. Two
# clusters of one node. Skips (77) without cbt.
# Usage: failover_frozen_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
instance_init failover_frozen
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtr "127.0.0.1:$PORT" createappprofile i prof d route-to=east >/dev/null || fail "createappprofile"
routes_to() { cbtr "127.0.0.1:$PORT" getappprofile i prof | grep -q "cluster_id:\"$1\""; }
EAST=$(cat "$DIR/run/east-0.pid")
thaw() { kill -CONT "$EAST" 2>/dev/null; }
trap 'thaw; instance_teardown' EXIT

for round in 1 2; do
  echo "== round $round: east frozen, failover to west at once"
  kill -STOP "$EAST"
  "$STRATA" failover prof west --dir "$DIR" >"$TMPD/fo$round.out" 2>&1
  rc=$?
  [ "$rc" = 0 ] || { cat "$TMPD/fo$round.out"; thaw; fail "strata failover prof west with east frozen exited $rc"; }
  routes_to west || { thaw; fail "the profile does not route to west"; }
  cat "$TMPD/fo$round.out"
  thaw
  # east back and seen healthy by the router: the profile returns to it.
  ok=0
  for _ in $(seq 1 60); do
    if "$STRATA" failover prof east --dir "$DIR" >"$TMPD/back.out" 2>&1; then ok=1; break; fi
    sleep 0.5
  done
  [ "$ok" = 1 ] || { cat "$TMPD/back.out"; fail "strata failover back to east after the thaw"; }
  sleep 2
done
echo PASS
