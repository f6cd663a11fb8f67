#!/usr/bin/env bash
# restart_race_test.sh — `strata restart` and `strata chaos restart-cluster` run at once keep one
# process per name, named by its pid file, so `strata down` stops everything. Two restarts of
# the router at once (three rounds): both succeed (the second waits for the instance lock, then
# restarts again), one router runs and DIR/run/router.pid names it. Then, after `strata chaos
# kill-cluster east`, two `restart-cluster east` and a `strata up` at once: one process per node,
# each named by its pid file. Without the lock both stopped the old process, one start failed on
# the taken port and removed the pid file the other had just written: `down` left that process
# running and `up` refused its port.
# Usage: restart_race_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
instance_init restart_race
# Whatever a failure leaves running without a pid file is stopped too (`down` cannot find it).
teardown() {
  instance_teardown
  pkill -KILL -f -- "--config $DIR/topology" 2>/dev/null
}
trap teardown EXIT

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }

# one_per NAME PATTERN: exactly one process matches PATTERN and DIR/run/NAME.pid names it.
one_per() {
  local pids want
  pids=$(pgrep -f -- "$2" | tr '\n' ' ')
  want=$(cat "$DIR/run/$1.pid" 2>/dev/null)
  [ "$(echo $pids | wc -w)" = 1 ] || fail "$3: $1 processes: '$pids' (pid file: '$want')"
  [ "$pids" = "$want " ] || fail "$3: $1 runs as $pids but its pid file says '$want'"
}

for round in 1 2 3; do
  "$STRATA" restart router --dir "$DIR" >"$TMPD/r1.out" 2>&1 &
  a=$!
  "$STRATA" restart router --dir "$DIR" >"$TMPD/r2.out" 2>&1
  rb=$?
  wait "$a"
  ra=$?
  [ "$ra" = 0 ] && [ "$rb" = 0 ] ||
    { cat "$TMPD/r1.out" "$TMPD/r2.out"; fail "round $round: restarts exited $ra and $rb"; }
  one_per router "strata-router --config $DIR/topology" "round $round"
  echo "ok: round $round: two restarts, one router ($(cat "$DIR/run/router.pid"))"
done

"$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "kill-cluster"
"$STRATA" chaos restart-cluster east --dir "$DIR" >"$TMPD/c1.out" 2>&1 &
a=$!
"$STRATA" chaos restart-cluster east --dir "$DIR" >"$TMPD/c2.out" 2>&1 &
b=$!
"$STRATA" up --dir "$DIR" >"$TMPD/u.out" 2>&1
ru=$?
wait "$a"
ra=$?
wait "$b"
rb=$?
[ "$ra$rb$ru" = 000 ] ||
  { cat "$TMPD/c1.out" "$TMPD/c2.out" "$TMPD/u.out"; fail "restart-cluster x2 + up exited $ra $rb $ru"; }
for n in east-0 east-1; do one_per "$n" "strata-node --data $DIR/$n " "restart-cluster"; done
echo "ok: two restart-cluster and an up: one process per node"

"$STRATA" down --dir "$DIR" >/dev/null || fail "strata down"
left=$(pgrep -f -- "--config $DIR/topology" | tr '\n' ' ')
[ -z "$left" ] || fail "left running after strata down: $left"
echo "ok: strata down stopped everything"
echo PASS
