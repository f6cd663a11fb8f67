#!/usr/bin/env bash
# cs_hostile4_test.sh — change stream records at the API's limits (cs_hostile4.py limits and
# bigrow) on `strata up --clusters 2 --nodes 1`: a MutateRow of 100,000 mutations, with and
# without a DeleteFromRow, and one of 257 cells holding 139 MB are accepted on a table with
# change streams on and recorded whole, live, on the second cluster and from storage; a catch-up
# read of a row holding 65,536 values by reference delivers them (manyrefs). Skips (77) without
# python3.
# Usage: cs_hostile4_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cshostile4
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
echo "== limits"
timeout 240 python3 "$(dirname "$0")/cs_hostile4.py" limits "$PORT" "$DIR" "$STRATA" ||
  fail "writes at the mutation limit refused or recorded wrongly"
echo "== bigrow"
timeout 240 python3 "$(dirname "$0")/cs_hostile4.py" bigrow "$PORT" "$DIR" "$STRATA" ||
  fail "a row of 139 MB in 257 cells refused or recorded wrongly"
echo "== manyrefs"
timeout 240 python3 "$(dirname "$0")/cs_hostile4.py" manyrefs "$PORT" "$DIR" "$STRATA" ||
  fail "a catch-up over a row of 65,536 values by reference did not deliver them"
echo "PASS"
