#!/usr/bin/env bash
# cs_hostile2_splits_test.sh — a table of 1000 tablets with change streams, created while a
# change stream of another table is open (cs_hostile2_splits.py, on `strata up --clusters 2
# --nodes 1`): the CreateTable succeeds, the open stream goes on, and the new table's 1000
# partitions are read by `strata changes`. Skips (77) without python3.
# Usage: cs_hostile2_splits_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cshostile2splits
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 240 python3 "$(dirname "$0")/cs_hostile2_splits.py" "$PORT" "$STRATA" "$DIR" ||
  fail "a table of 1000 tablets next to an open change stream"
echo "PASS"
