#!/usr/bin/env bash
# down_race_test.sh — `strata down` takes the instance lock, as `strata up`, `strata restart` and
# `strata chaos restart-cluster` do, so it never runs in the middle of one of them. Without it, a
# `down` between a restart's stop of the old process and the start of the new one said
# "Stopped." and left the new process running. Checked two ways:
#   1. with the lock held by another holder (flock(1) on DIR), `strata down` waits, says so, and
#      stops nothing until the lock is released (it used to stop everything at once);
#   2. rounds of `strata restart router` with a `strata down` started while the restart holds the
#      lock: the restart completes (down used to stop the nodes under it, so the new router
#      failed to start), then down stops everything: no process and no pid file is left.
# Usage: down_race_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v flock >/dev/null || { echo "flock(1) not installed: skipping"; exit 77; }
instance_init down_race
# Whatever a failure leaves running without a pid file is stopped too (`down` cannot find it).
teardown() {
  instance_teardown
  pkill -KILL -f -- "--config $DIR/topology" 2>/dev/null
}
trap teardown EXIT

up() {
  "$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >"$TMPD/up.out" 2>&1 ||
    { cat "$TMPD/up.out"; fail "strata up"; }
}
# nothing_runs WHEN: no process of the instance runs and DIR/run holds no pid file.
nothing_runs() {
  local left pids
  left=$(pgrep -f -- "--config $DIR/topology" | tr '\n' ' ')
  pids=$(ls "$DIR/run/" 2>/dev/null | grep '\.pid$' | tr '\n' ' ')
  [ -z "$left" ] || fail "$1: still running after strata down: $left (pid files: $pids)"
  [ -z "$pids" ] || fail "$1: pid files left after strata down: $pids"
}

echo "== 1. strata down waits for the instance lock"
up
router=$(cat "$DIR/run/router.pid")
touch "$TMPD/hold"
flock "$DIR" sh -c "while [ -e '$TMPD/hold' ]; do sleep 0.1; done" &
holder=$!
PIDS+=("$holder")
for _ in $(seq 1 50); do flock -n "$DIR" true || break; sleep 0.1; done
flock -n "$DIR" true && fail "flock(1) did not take the lock on $DIR"
"$STRATA" down --dir "$DIR" >"$TMPD/down1.out" 2>&1 &
down=$!
sleep 2
if ! kill -0 "$down" 2>/dev/null; then
  cat "$TMPD/down1.out"
  fail "strata down ended while another command held the instance lock"
fi
kill -0 "$router" 2>/dev/null || fail "strata down stopped the router while the lock was held"
rm -f "$TMPD/hold"
wait "$holder"
wait "$down" || { cat "$TMPD/down1.out"; fail "strata down after the lock was released"; }
grep -q "Waiting for another" "$TMPD/down1.out" || { cat "$TMPD/down1.out"; fail "down did not say it waits"; }
nothing_runs "lock held"
echo "ok: down waited for the lock, then stopped everything"

echo "== 2. strata restart router with strata down beside it"
for round in 1 2 3; do
  up
  "$STRATA" restart router --dir "$DIR" >"$TMPD/rs.out" 2>&1 &
  rs=$!
  # the restart holds the lock: from its stop of the old router to its start of the new one
  for _ in $(seq 1 100); do flock -n "$DIR" true || break; sleep 0.02; done
  "$STRATA" down --dir "$DIR" >"$TMPD/down2.out" 2>&1 || { cat "$TMPD/down2.out"; fail "round $round: down"; }
  wait "$rs" || { cat "$TMPD/rs.out" "$TMPD/down2.out"; fail "round $round: the restart, begun first, failed"; }
  nothing_runs "round $round"
  echo "ok: round $round: the restart finished, then down stopped everything"
done
echo PASS
