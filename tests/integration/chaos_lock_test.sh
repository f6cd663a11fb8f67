#!/usr/bin/env bash
# chaos_lock_test.sh — `strata chaos partition`, `heal` and `kill-cluster` take the instance lock,
# as `strata up` and `strata restart` do, so none lands in the middle of one of them:
#   1. a heal run while `strata restart east-0` is between starting the new node and sending it
#      its links (the restart is paused there with SIGSTOP): east-0 comes up with every link
#      open (status shows no CUT) and a row written on east reaches
#      west. Without the lock the heal missed the restarting node, and the restart applied the
#      partition it had read before: east-0 stayed CUT after "Healed", its writes never shipped;
#   2. the mirror: a partition during a restart leaves the restarted node cut (it came up open);
#   3. a heal that cannot reach a node that runs (SIGSTOPped) says so and fails, instead of
#      saying the node "starts with every link open";
#   4. kill-cluster east during `strata up` waits for it, then kills east only: up succeeds and
#      west and the router keep running (without the lock, up saw a node killed while starting
#      and stopped the whole instance).
# Skips (77) without cbt.
# Usage: chaos_lock_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
instance_init chaos_lock
A=127.0.0.1:$PORT
stopped=
teardown() {
  [ -n "$stopped" ] && kill -CONT "$stopped" 2>/dev/null
  instance_teardown
}
trap teardown EXIT

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtr "$A" createtable t families=f >/dev/null || fail "createtable t"
cbtr "$A" createappprofile i pe d route-to=east >/dev/null || fail "create pe"
cbtr "$A" createappprofile i pw d route-to=west >/dev/null || fail "create pw"

# restart_with ACTION...: `strata restart east-0`, paused (SIGSTOP) once it has started the new
# east-0 (its pid file names another process), so it has read DIR/run/partition and not yet sent
# the new east-0 its links; then
# `strata chaos ACTION...`, until it ends or waits for the instance lock; then the restart goes
# on. Both must succeed.
restart_with() {
  local old now rr ch
  old=$(cat "$DIR/run/east-0.pid")
  "$STRATA" restart east-0 --dir "$DIR" >"$TMPD/restart.out" 2>&1 &
  rr=$!
  for _ in $(seq 1 6000); do
    now=$(cat "$DIR/run/east-0.pid" 2>/dev/null)
    [ -n "$now" ] && [ "$now" != "$old" ] && break
    sleep 0.01
  done
  kill -STOP "$rr"
  stopped=$rr
  "$STRATA" chaos "$@" --dir "$DIR" >"$TMPD/chaos.out" 2>&1 &
  ch=$!
  for _ in $(seq 1 600); do
    kill -0 "$ch" 2>/dev/null || break
    grep -q "Waiting for another" "$TMPD/chaos.out" && break
    sleep 0.05
  done
  kill -CONT "$rr"
  stopped=
  wait "$ch" || { cat "$TMPD/chaos.out"; fail "chaos $* during a restart"; }
  wait "$rr" || { cat "$TMPD/restart.out"; fail "restart east-0 beside chaos $*"; }
}
east0_cut() { "$STRATA" status --dir "$DIR" 2>&1 | grep -E '^ *east +zone-a +east-0 ' | grep -q ' CUT'; }
# reaches_west ROW: ROW, written through pe (east), is read through pw (west) within 30 s.
reaches_west() {
  local end=$((SECONDS + 30))
  until cbtr "$A" read t app-profile=pw | grep -q "^$1\$"; do
    [ $SECONDS -lt "$end" ] || return 1
    sleep 0.5
  done
}

echo "== 1. heal during a restart of east-0"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "partition"
restart_with heal
if east0_cut; then
  "$STRATA" status --dir "$DIR"
  fail "east-0 is CUT after a heal that ran during its restart"
fi
cbtr "$A" set t r1 f:c=v app-profile=pe >/dev/null || fail "write r1 on east"
reaches_west r1 || fail "r1, written on east after the heal, never reached west"
echo "ok: east-0 came up with every link open; its write reached west"

echo "== 2. partition during a restart of east-0"
restart_with partition east west
if ! east0_cut; then
  "$STRATA" status --dir "$DIR"
  fail "east-0 is not CUT after a partition that ran during its restart"
fi
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal after 2"
echo "ok: east-0 came up cut"

echo "== 3. heal with a running node that does not answer"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "partition 3"
stopped=$(cat "$DIR/run/west-0.pid")
kill -STOP "$stopped"
"$STRATA" chaos heal --dir "$DIR" >"$TMPD/heal3.out" 2>&1 && { cat "$TMPD/heal3.out"; fail "heal succeeded with west-0 stopped"; }
grep -q "west-0 (pid $stopped) runs but does not answer" "$TMPD/heal3.out" ||
  { cat "$TMPD/heal3.out"; fail "heal did not say west-0 runs but does not answer"; }
grep -q "start with every link open" "$TMPD/heal3.out" &&
  { cat "$TMPD/heal3.out"; fail "heal said a stopped node starts with every link open"; }
kill -CONT "$stopped"
stopped=
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal after west-0 was continued"
echo "ok: heal reported the stopped node as an error"

echo "== 4. kill-cluster east during strata up"
"$STRATA" down --dir "$DIR" >/dev/null || fail "down"
"$STRATA" up --dir "$DIR" >"$TMPD/up4.out" 2>&1 &
up=$!
for _ in $(seq 1 200); do [ -e "$DIR/run/east-0.pid" ] && break; sleep 0.02; done
"$STRATA" chaos kill-cluster east --dir "$DIR" >"$TMPD/kill4.out" 2>&1 ||
  { cat "$TMPD/kill4.out"; fail "kill-cluster during up"; }
wait "$up" || { cat "$TMPD/up4.out" "$TMPD/kill4.out"; fail "strata up failed beside kill-cluster east"; }
for n in west-0 router; do
  kill -0 "$(cat "$DIR/run/$n.pid" 2>/dev/null)" 2>/dev/null ||
    { cat "$TMPD/up4.out" "$TMPD/kill4.out"; fail "$n does not run after kill-cluster east"; }
done
grep -q "east-0 *killed" "$TMPD/kill4.out" || { cat "$TMPD/kill4.out"; fail "kill-cluster did not kill east-0"; }
echo "ok: up finished, then only east was killed"
echo PASS
