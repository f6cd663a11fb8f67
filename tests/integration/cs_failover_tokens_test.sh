#!/usr/bin/env bash
# cs_failover_tokens_test.sh — hostile version 2 change stream tokens (forged cluster, Y = 0,
# Y > W, the largest values, v1 and v2 mixed for one partition) give INVALID_ARGUMENT or a safe
# start, never a gap (cs_failover_tokens.py, on `strata up --clusters 2 --nodes 1`). Skips (77)
# without python3.
# Usage: cs_failover_tokens_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init csfotokens
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 120 python3 "$(dirname "$0")/cs_failover_tokens.py" "$PORT" "$DIR" ||
  fail "hostile version 2 tokens"
echo "PASS"
