#!/usr/bin/env bash
# cs_failover_down_test.sh — with a peer node down (kill -9) the applied bound is held and the
# stream stays healthy; a failover misses no write; the bound moves on once the peer is back
# (cs_failover_down.py, on `strata up --clusters 3 --nodes 1`). Skips (77) without python3.
# Usage: cs_failover_down_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init csfodown
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 3 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 120 python3 "$(dirname "$0")/cs_failover_down.py" "$PORT" "$DIR" "$STRATA" ||
  fail "change stream failover with a peer node down"
echo "PASS"
