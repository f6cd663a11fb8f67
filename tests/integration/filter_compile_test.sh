#!/usr/bin/env bash
# filter_compile_test.sh — a legal filter whose regexes are costly to compile is refused before it
# holds the node's event loop: a standalone strata-node, and filter_compile.py sends ReadRows and
# CheckAndMutateRow calls with an interleave of 400 regexes (\pL|\pN){300} (INVALID_ARGUMENT,
# nothing written), a burst of such reads in one write while a PING is in flight, and ordinary
# regexes, which still work. The old node compiled each filter for 0.5 to 2 s on its loop and
# logged 'event loop blocked'. Skips (77) without python3.
# Usage: filter_compile_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
DIR=$(make_tmp)
DATA=$DIR/node
FAIL_EXTRA_LOGS=("$DATA.log")
start_node "$NODE_BIN" "$DATA" || fail "strata-node did not start"
python3 "$HERE/filter_compile.py" "${NODE_ADDR##*:}" ||
  fail "a filter costly to compile was not refused, or ordinary regexes failed"
grep 'event loop blocked' "$DATA.log" && fail "the node's loop was blocked"
echo "PASS"
