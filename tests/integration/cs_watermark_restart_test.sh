#!/usr/bin/env bash
# cs_watermark_restart_test.sh — a node that restarted while a peer cluster holds writes it has
# not shipped yet sends no low watermark above them (docs/changestreams.md, Low watermark):
# hostile/cs_watermark_restart.py on `strata up --clusters 2 --nodes 1` (writes on east under a
# cut, east killed, west-0 restarted, a stream on west, east restarted). Skips (77) without
# python3.
# Usage: cs_watermark_restart_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cswmrestart
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
timeout 120 python3 "$(dirname "$0")/hostile/cs_watermark_restart.py" "$PORT" "$DIR" "$STRATA" ||
  fail "late records on a restarted node of the second cluster"
echo "PASS"
