#!/usr/bin/env bash
# cs_failover3_test.sh — with three clusters, a change stream consumer that fails over misses no
# write the third cluster accepted while the cluster it read had not applied it, twice: east ->
# west with east's tokens, then west -> east with west's tokens (cs_failover3.py, on
# `strata up --clusters 3 --nodes 1`). Skips (77) without python3.
# Usage: cs_failover3_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init csfailover3
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 3 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 120 python3 "$(dirname "$0")/cs_failover3.py" "$PORT" "$DIR" "$STRATA" ||
  fail "change stream failover with three clusters"
echo "PASS"
