#!/usr/bin/env bash
# cs_failover_split_test.sh — a change stream consumer fails over east -> west -> east while the
# clusters' tablets differ (each split on its own, and
# a tablet moved during each failover) and misses no write (cs_failover_split.py, on
# `strata up --clusters 2 --nodes 2`). Skips (77) without python3.
# Usage: cs_failover_split_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init csfosplit
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 120 python3 "$(dirname "$0")/cs_failover_split.py" "$PORT" "$DIR" "$STRATA" ||
  fail "change stream failover while the clusters' tablets differ"
echo "PASS"
