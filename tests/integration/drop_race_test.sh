#!/usr/bin/env bash
# drop_race_test.sh — DropRowRange through the router (prefix and whole table, change streams off
# and on) racing a writer on the same rows and a move of one of the table's tablets, on `strata up
# --nodes 2` (two clusters): no row acknowledged before the call survives, every row written after
# it returned does (tests/integration/hostile/drop_race.py). Skips without cbt or python3.
# Usage: drop_race_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "SKIP: cbt not installed"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
instance_init drop_race
"$STRATA" up --dir "$DIR" --port "$PORT" --nodes 2 >"$TMPD/up.log" 2>&1 ||
  { cat "$TMPD/up.log"; fail "strata up failed"; }
timeout 240 python3 "$(dirname "$0")/hostile/drop_race.py" "$PORT" "$DIR" "$CBT" ||
  fail "drop_race.py failed"
# Every process stops cleanly (a sanitizer build reports leaks and errors at exit).
"$STRATA" down --dir "$DIR" >"$TMPD/down.log" 2>&1 || { cat "$TMPD/down.log"; fail "strata down failed"; }
grep -l "Sanitizer" "$DIR"/logs/*.log && fail "a sanitizer report"
echo "PASS"
