#!/usr/bin/env bash
# cs_failover_test.sh — a change stream consumer that fails over from cluster east to west
# misses no write (cs_failover.py, on `strata up --clusters 2 --nodes 1`): writes west accepted
# while the replication links were cut, and that east had therefore not applied, are printed
# after the consumer resumes on west from east's tokens. Skips (77) without python3.
# Usage: cs_failover_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init csfailover
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 120 python3 "$(dirname "$0")/cs_failover.py" "$PORT" "$DIR" "$STRATA" ||
  fail "change stream across a failover with the replication links cut"
echo "PASS"
