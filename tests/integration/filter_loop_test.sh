#!/usr/bin/env bash
# filter_loop_test.sh — heavy but legal row filters leave the node's event loop free: a
# standalone strata-node, and filter_loop.py reads a table of 2,000 rows through an interleave of
# 100 value regexes while a second connection keeps an HTTP/2 PING in flight (the node must
# answer PINGs between the read's turns, which now count the row-level filter's work), then sends
# a CheckAndMutateRow whose predicate of 300 value regexes over a row of 6,000 cells is past one
# evaluation's work bound (FAILED_PRECONDITION, nothing written). Skips (77) without python3.
# Usage: filter_loop_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
DIR=$(make_tmp)
DATA=$DIR/node
FAIL_EXTRA_LOGS=("$DATA.log")
start_node "$NODE_BIN" "$DATA" || fail "strata-node did not start"
python3 "$HERE/filter_loop.py" "${NODE_ADDR##*:}" ||
  fail "a heavy row filter held the node's event loop"
grep 'event loop blocked' "$DATA.log" && fail "the node's loop was blocked"
echo "PASS"
