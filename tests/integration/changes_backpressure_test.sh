#!/usr/bin/env bash
# changes_backpressure_test.sh — a change stream reader that stops reading costs the router
# bounded memory, and loses nothing: `strata up --clusters 1 --nodes 1`, 48 rows of 256 KiB
# (12 MiB of history) in a table with change streams on, then changes_backpressure.py reads a
# ReadChangeStream of the whole table only after holding it unread for a few seconds. The router
# may grow by at most LIMIT_MB (default 10: its 4 MiB backlog plus windows and slack; measured
# +6 MB, and +12.8 MB with the pause disabled; 0 = print only) and the client must get every
# record exactly once. The node must have served that one stream with one call, not cancelled:
# the router pauses the node's stream with HTTP/2 flow control while the client does not read
# (it used to cancel the node call and open a new one from the last token each time). Skips (77)
# without python3.
# Usage: changes_backpressure_test.sh PATH/TO/strata [LIMIT_MB]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
LIMIT=${2:-10}
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
instance_init changes_bp
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --metrics >/dev/null || fail "strata up failed"
python3 "$HERE/changes_backpressure.py" "$PORT" "$(cat "$DIR/run/router.pid")" ${CS_ROWS:-48} ${CS_BYTES:-262144} "$LIMIT" \
  "$(cat "$DIR/run/east-0.metrics")" ||
  fail "the change stream through a slow reader was not bounded or not exact"
echo "PASS"
