#!/usr/bin/env bash
# cs_hostile_test.sh — hostile change stream clients through a router (`strata up --clusters 1
# --nodes 1`), by cs_attack.py (raw HTTP/2):
#   - 400 live ReadChangeStreams that never read while 80 rows of 64 KiB are written: every
#     write succeeds and other calls are served (the streams used to take every stream slot of
#     the router's one connection to the node, so every write through the router waited for
#     good), a fresh stream gets every row, the router stays within its documented bound
#     (docs/changestreams.md, Router memory: 1.5 x (B + N x (M + W)) with B the 256 MiB budget,
#     N the streams, M one message, W the 64 KiB window of change stream links: 459 MB here;
#     measured 365 MB, and 669 MB before the streams' backlogs counted in the budget) and the
#     node within NODE_LIMIT_MB (default 1024; measured about 490 MB); RSS is not checked under
#     AddressSanitizer;
#   - a second router with --max-change-streams 20: 20 unread streams are relayed, the 21st is
#     RESOURCE_EXHAUSTED, and streams are served again once the client closed them;
#   - change streams turned off while a stream is open: the stream ends FAILED_PRECONDITION,
#     new ones too; a table that never had streams answers FAILED_PRECONDITION;
#   - malformed tokens (garbage, NUL, H below W, another partition's, older than the history),
#     times (end before start, a day ahead, 1970, negative), heartbeats and partitions through
#     the router: each INVALID_ARGUMENT; a heartbeat of 0 or 2^62 s still reads.
# Usage: cs_hostile_test.sh PATH/TO/strata [NODE_LIMIT_MB] (skips, 77, without python3)
set -u
STRATA=$1
NODE_LIMIT=${2:-1024}
STREAMS=400 ROWS=80 BYTES=65536
# The router's bound in MB: 1.5 x (256 MiB + STREAMS x (message + 64 KiB)), a message being the
# value plus at most 1 KiB of record around it.
LIMIT=$(((3 * (256 * 1024 + STREAMS * (BYTES / 1024 + 1 + 64)) / 2) / 1024))
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
ATTACK="python3 $(dirname "$0")/cs_attack.py"
NODE_BIN=$(dirname "$STRATA")/../node/strata-node
if grep -aq __asan_init "$NODE_BIN"; then # its shadow memory and quarantine count in RSS
  echo "AddressSanitizer build: RSS is not checked"
  LIMIT=100000 NODE_LIMIT=100000
fi
ROUTER_BIN=$(dirname "$STRATA")/../router/strata-router
instance_init cshostile
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
$ATTACK flood "$PORT" "$(cat "$DIR/run/router.pid")" "$(cat "$DIR/run/east-0.pid")" $STREAMS $ROWS $BYTES \
  "$LIMIT" "$NODE_LIMIT" || fail "unread change streams"
start_router "$DIR/topology" "$TMPD/router2.log" --max-change-streams 20
FAIL_EXTRA_LOGS=("$TMPD/router2.log")
$ATTACK cap "${ROUTER_ADDR##*:}" 20 || fail "--max-change-streams"
$ATTACK disable "$PORT" || fail "change streams turned off under an open stream"
$ATTACK inputs "$PORT" || fail "malformed change stream requests"
echo "PASS"
