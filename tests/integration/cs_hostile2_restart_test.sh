#!/usr/bin/env bash
# cs_hostile2_restart_test.sh — `kill -9` of the nodes a change stream consumer reads, then
# `strata up` at once (what an operator, and the kill -9 tests of change streams, do): every
# killed node must be running again when `strata up` returns 0. A node killed with SIGKILL
# lives on for a moment (its threads exit, its memory is freed, its data directory lock is held
# until the last thread is gone): `strata up` used to take it for a running node and leave it
# alone (then it vanished), or to start the new node while the old one still held the lock
# (the new one then refused the data directory). Eight rounds of both nodes of a cluster at once,
# each after writes (so the nodes have memory to free).
# Usage: cs_hostile2_restart_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cshostile2restart
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
HOSTILE=$(cd "$(dirname "$0")/hostile" && pwd)
python3 - "$PORT" "$HOSTILE" <<'PY' || fail "cannot create the table"
import sys; sys.path.insert(0, sys.argv[2])
from cslib import *
port = int(sys.argv[1])
create_cs(port, 'rs')
body = fld(1, tname('rs')) + b''.join(fld(2, fld(1, 'k%04d' % i) + fld(2, set_cell('cf', 'q', 'v' * 20000))) for i in range(2000))
print('MutateRows', call(port, BT + 'MutateRows', body)[2])
PY
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^State:.Z' "/proc/$1/status" 2>/dev/null; }
for round in 1 2 3 4 5 6 7 8; do
  old0=$(cat "$DIR/run/east-0.pid") old1=$(cat "$DIR/run/east-1.pid")
  kill -9 "$old0" "$old1"
  "$STRATA" up --dir "$DIR" >"$TMPD/up.$round" 2>&1 || { cat "$TMPD/up.$round"; fail "round $round: strata up failed"; }
  for n in east-0 east-1; do
    pid=$(cat "$DIR/run/$n.pid" 2>/dev/null)
    if [ -z "$pid" ] || [ "$pid" = "$old0" ] || [ "$pid" = "$old1" ]; then
      cat "$TMPD/up.$round"
      fail "round $round: strata up returned 0 but did not start $n again (pid file: ${pid:-none})"
    fi
  done
  sleep 0.3 # a node that found its data directory locked exits at once: give it the time to
  for n in east-0 east-1; do
    alive "$(cat "$DIR/run/$n.pid")" || fail "round $round: $n exited after strata up: $(tail -3 "$DIR/logs/$n.log")"
  done
  echo "round $round: both nodes restarted"
done
echo "PASS"
