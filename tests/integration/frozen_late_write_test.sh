#!/usr/bin/env bash
# frozen_late_write_test.sh — a multi-cluster write sent to a node that then froze (SIGSTOP: a
# paused VM, a stopped process) and moved by the router to the other cluster must never be
# applied by the frozen node when it thaws. Before write fences it was: a DeleteFromRow applied
# late took a version newer than the SetCell the client made, and had acknowledged, after the
# delete, so that acknowledged cell vanished from both clusters. Now the router sends each
# multi-cluster attempt with its deadline (x-strata-write-by-us), waits until it has passed
# before sending the write elsewhere, and the node refuses a write it receives after it.
# MutateRow and MutateRows, each: set, freeze east, delete (moves to west), set again (west),
# thaw, wait for replication: the last set must be on both clusters. About 30 seconds.
# Usage: frozen_late_write_test.sh PATH/TO/strata PATH/TO/frozen_client
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
CLIENT=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init frozen_late
EAST=
finish() {
  [ -n "$EAST" ] && kill -CONT "$EAST" 2>/dev/null
  instance_teardown
}
trap finish EXIT
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >/dev/null || fail "strata up failed"
cbtq() { BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>/dev/null; }
cbtq createtable t families=cf >/dev/null || fail "createtable failed"
cbtq createappprofile i toeast d route-to=east force=true >/dev/null || fail "createappprofile toeast failed"
cbtq createappprofile i towest d route-to=west force=true >/dev/null || fail "createappprofile towest failed"
cbtq createappprofile i any d route-any >/dev/null || fail "createappprofile any failed"
call() { "$CLIENT" "127.0.0.1:$PORT" t "$1" "$2"; } # PROFILE write|writes|delete|deletes
EAST=$(cat "$DIR/run/east-0.pid")

# Rows a cluster holds, read through a single-cluster profile (one line per row key).
rows_in() {
  cbtq read t app-profile="$1" | grep -E '^(w|wa|wb)$' | sort | tr '\n' ' '
}

for kind in write writes; do
  del=delete
  [ $kind = writes ] && del=deletes
  out=$(call any $kind)
  [ "${out%% *}" = OK ] || fail "$kind via any before the freeze: $out"
  cbtq waitforreplication t >/dev/null || fail "waitforreplication failed"
  kill -STOP "$EAST"
  out=$(call any $del)
  echo "east frozen, $del via any: $out"
  [ "${out%% *}" = OK ] || fail "$del via a multi-cluster profile while east is frozen: $out"
  out=$(call any $kind)
  echo "east frozen, $kind via any after the $del: $out"
  [ "${out%% *}" = OK ] || fail "$kind via any after the $del: $out"
  kill -CONT "$EAST"
  for _ in $(seq 1 100); do # hang guard: east answers its next probes
    out=$(call toeast read)
    [ "${out%% *}" = OK ] && break
    sleep 0.2
  done
  cbtq waitforreplication t >/dev/null || fail "waitforreplication after the thaw failed"
  want="w "
  [ $kind = writes ] && want="w wa wb "
  for c in toeast towest; do
    got=$(rows_in $c)
    echo "after the thaw, rows through $c: '$got'"
    [ "$got" = "$want" ] || fail "the $kind acknowledged after the $del is missing through $c (rows '$got', want '$want'): the frozen node applied the moved $del late"
  done
  echo "east refused $(grep -c "after its router's deadline" "$DIR/logs/east-0.log") late write(s) so far"
done
echo "PASS"
