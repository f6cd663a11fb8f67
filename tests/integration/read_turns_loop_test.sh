#!/usr/bin/env bash
# read_turns_loop_test.sh — concurrent reads of a large cell let the node's loop poll its sockets
# between their turns: a standalone strata-node, one cell of 32 MiB, and read_turns_loop.py sends
# 8 ReadRows of it in one write while a second connection keeps an HTTP/2 PING in flight. The
# node must answer PINGs between the reads' turns (every read's turn ran in the same pass of
# its loop before, and a router's keepalive went unanswered for that long). Skips (77) without
# python3.
# Usage: read_turns_loop_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
DIR=$(make_tmp)
DATA=$DIR/node
FAIL_EXTRA_LOGS=("$DATA.log")
start_node "$NODE_BIN" "$DATA" || fail "strata-node did not start"
python3 "$HERE/read_turns_loop.py" "${NODE_ADDR##*:}" 8 32 ||
  fail "the node did not poll its sockets between the turns of concurrent reads"
grep 'event loop blocked' "$DATA.log" && fail "the node's loop was blocked"
echo "PASS"
