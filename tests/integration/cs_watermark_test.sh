#!/usr/bin/env bash
# cs_watermark_test.sh — no change record arrives with a commit_timestamp below a low watermark
# its stream already sent, on `strata up --clusters 2 --nodes 1` (docs/changestreams.md, Low
# watermark): hostile/cs_watermark_late.py on the origin cluster and through a profile of the
# second cluster (writes of every kind from 6 writers, 10 s each), and hostile/cs_watermark_cut.py
# (the replication links cut for 5 s while the first cluster takes writes, read on the second).
# Skips (77) without python3.
# Usage: cs_watermark_test.sh PATH/TO/strata
set -u
STRATA=$1
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cswatermark
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
H="$(dirname "$0")/hostile"
timeout 120 python3 "$H/cs_watermark_late.py" "$PORT" || fail "late records on the first cluster"
timeout 120 python3 "$H/cs_watermark_late.py" "$PORT" west || fail "late records on the second cluster"
timeout 120 python3 "$H/cs_watermark_cut.py" "$PORT" "$DIR" "$STRATA" ||
  fail "late records on the second cluster after a cut"
echo "PASS"
