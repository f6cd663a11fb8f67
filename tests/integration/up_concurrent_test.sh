#!/usr/bin/env bash
# up_concurrent_test.sh — two `strata up` started at once on the same --dir both succeed (the
# second waits for the first, then finds the instance running: `strata up` is idempotent), and
# exactly one set of processes runs. Without mutual exclusion the two race on DIR/topology.tmp
# and one fails with "cannot write topology file ... (is the disk full?)".
# Usage: up_concurrent_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
instance_init up_concurrent
for round in 1 2 3 4 5; do
  "$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >"$TMPD/a.out" 2>&1 &
  A=$!
  "$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >"$TMPD/b.out" 2>&1
  rb=$?
  wait "$A"
  ra=$?
  [ "$ra" = 0 ] || { cat "$TMPD/a.out"; fail "round $round: first strata up exited $ra"; }
  [ "$rb" = 0 ] || { cat "$TMPD/b.out"; fail "round $round: second strata up exited $rb"; }
  nodes=$(pgrep -f -- "--data $DIR/east-0 " | wc -l)
  [ "$nodes" = 1 ] || fail "round $round: $nodes strata-node processes on $DIR/east-0"
  "$STRATA" status --dir "$DIR" >/dev/null || fail "round $round: strata status unhealthy"
  "$STRATA" down --dir "$DIR" >/dev/null || fail "round $round: strata down failed"
  echo "ok: round $round"
done
echo PASS
