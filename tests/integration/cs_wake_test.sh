#!/usr/bin/env bash
# cs_wake_test.sh — a change stream with heartbeats a day apart ends at once when its tablet
# moves away or splits, its streams are turned off or its table is deleted, with no write to its
# node afterwards (cs_wake.py, on `strata up --clusters 1 --nodes 2`). Skips (77) without python3.
# Usage: cs_wake_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cswake
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 120 python3 "$(dirname "$0")/cs_wake.py" "$PORT" "$DIR" || fail "streams not woken"
echo "PASS"
