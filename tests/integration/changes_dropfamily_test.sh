#!/usr/bin/env bash
# changes_dropfamily_test.sh — a column family dropped from a table with change streams on, on
# `strata up --clusters 2 --nodes 1`: the drop is a schema change, so neither cluster's history
# records it (each node purges its own rows; the purge is not shipped to the peer cluster, where
# it used to appear as the other cluster's DeleteFromFamily). The writes before it are in both.
# Usage: changes_dropfamily_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
instance_init changes_dropfamily
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.log" 2>&1 ||
  { cat "$TMPD/up.log"; fail "strata up failed"; }
timeout 120 python3 "$(dirname "$0")/hostile/cs_dropfamily.py" "$PORT" || fail "cs_dropfamily.py failed"
echo "PASS"
