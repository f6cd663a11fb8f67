#!/usr/bin/env bash
# slow_reader_memory_test.sh — ReadRows calls whose client never reads the answer must not make
# strata-router or strata-node hold unbounded memory. A 1-node instance gets 48 rows of 1 MiB;
# 4 connections x 100 streams then scan the table and never read (HTTP/2 flow control stalls
# them). The router and the node may keep some bytes per call, but the process as a whole must
# stay bounded (the request side has --max-buffered-request-bytes; the answer side has only a
# per-call queue bound). Fails when either process passes LIMIT_MB (default 1024) of RSS.
# Usage: slow_reader_memory_test.sh PATH/TO/strata [LIMIT_MB]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib.sh"
STRATA=$1
LIMIT=${2:-1024}
instance_init slow_reader
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
NODE_PORT=$(grep -o 'node = 127.0.0.1:[0-9]*' "$DIR/topology" | head -1 | cut -d: -f2)
"$STRATA" status --dir "$DIR" >/dev/null 2>&1
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i createtable t families=cf \
  2>/dev/null || fail "createtable failed"
python3 "$HERE/hold.py" write "$PORT" t 48 1048576 || fail "could not write the rows"
PIDS=$(cat "$DIR/run/router.pid"),$(cat "$DIR/run/east-0.pid")
echo "== 400 non-reading scans through the router (router, node pids $PIDS)"
python3 "$HERE/hold.py" readers "$PORT" t 4 100 "$PIDS" "$LIMIT" || fail "router or node memory unbounded"
echo "== 400 non-reading scans straight to the node"
python3 "$HERE/hold.py" readers "$NODE_PORT" t 4 100 "$(cat "$DIR/run/east-0.pid")" "$LIMIT" ||
  fail "node memory unbounded"
echo "PASS"
