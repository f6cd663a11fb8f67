#!/usr/bin/env bash
# cs_hostile2_chaos_test.sh — no acknowledged write missing from `strata changes --follow
# --checkpoint` (killed with kill -9 three times and resumed from its checkpoint), and each row's
# values first printed in write order, while the table's tablet is split, one half moved to the
# other node and the node holding it killed with kill -9 and restarted (cs_hostile2_chaos.py, on
# `strata up --clusters 1 --nodes 2`). Skips (77) without python3.
# Usage: cs_hostile2_chaos_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cshostile2chaos
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 240 python3 "$(dirname "$0")/cs_hostile2_chaos.py" chaos "$PORT" "$DIR" "$STRATA" ||
  fail "change stream through a split, a move, kill -9 of a node and of the consumer"
echo "PASS"
