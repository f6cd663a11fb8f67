#!/usr/bin/env bash
# move_peer_test.sh CASE PATH/TO/strata — tablet moves while a peer cluster lacks the tablet's
# writes, on `strata up --clusters 2 --nodes 2` (cases in hostile/move_peer.py):
#   lag   both clusters move the same range at once while the link heals (each moving tablet
#         refuses the other's replicated writes), and again across a kill -9 of both clusters:
#         both moves succeed and every row reaches both clusters;
#   tomb  deletes in east of rows west wrote earlier, east's tablet moved before west's writes
#         arrive: the deletes still cover them on east after the move.
# Skips (77) without python3.
set -u
. "$(dirname "$0")/lib.sh"
CASE=$1
STRATA=$2
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init "move_peer_$CASE"
# lag: every move holds 1.5 s after its copy, so the heal comes while both tablets are moving.
FAULTS=
[ "$CASE" = lag ] && FAULTS=hold_ms=1500
STRATA_TEST_MOVE=$FAULTS "$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 \
  >"$TMPD/up.out" 2>&1 || { cat "$TMPD/up.out"; fail "strata up"; }
STRATA_TEST_MOVE=$FAULTS timeout 240 python3 "$(dirname "$0")/hostile/move_peer.py" "$CASE" \
  "$STRATA" "$DIR" "$PORT" || fail "move_peer.py $CASE"
echo PASS
