#!/usr/bin/env bash
# read_pause_test.sh — ReadRows calls whose client never reads must not block the other calls to
# their node through the router (docs/router.md, "Flow control"). The router reaches a node over
# one connection, on which the node allows 256 streams at once: scans paused for clients that do
# not read used to keep their node streams open, and 256 of them left no stream for any other
# call to that node (reads, writes, the router's own metadata reads).
#
# A node and a router (--max-queued-response-bytes 8m both) serve a table of 256 rows of 8 KiB.
# One connection opens 300 full scans and never reads (the router allows it 512 streams). Then a
# MutateRow and a ReadRows of one row from another connection must answer within 20 s each, a full
# scan from another connection must return every row, and the stalled scans (forward, reversed,
# each with and without a rows_limit), read at last, must each end with the rows asked for, each
# exactly once and in order (parked scans go on after their last row).
# Usage: read_pause_test.sh PATH/TO/strata-node PATH/TO/strata-router [CONNS STREAMS]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
CONNS=${3:-1}
STREAMS=${4:-300}
ROWS=256
SIZE=8192
BUDGET_MB=8
LIMIT=100000 # memory is slow_reader_test.sh's concern; this one checks who is served

dir=$(make_tmp)
"$NODE_BIN" --data "$dir/n1" --listen 127.0.0.1:0 --node-num 1 \
  --max-queued-response-bytes ${BUDGET_MB}m >"$dir/n1.log" 2>&1 &
NODE_PID=$!
PIDS+=("$NODE_PID")
NODE_ADDR=$(wait_line "$dir/n1.log" 'listening on 127\.0\.0\.1:[0-9]+' | grep -Eo '127\.0\.0\.1:[0-9]+') ||
  { echo "FAIL: the node did not start"; exit 1; }
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $NODE_ADDR
TOPO
start_router "$dir/topology" "$dir/router.log" --balance off \
  --max-queued-response-bytes ${BUDGET_MB}m --max-streams-per-connection 512
RPORT=${ROUTER_ADDR##*:}
fail() {
  echo "FAIL: $*"
  tail -n 20 "$dir/n1.log" "$dir/router.log"
  exit 1
}

python3 "$HERE/hostile/hold.py" create "$RPORT" t || fail "createtable through the router"
python3 "$HERE/hostile/hold.py" write "$RPORT" t $ROWS $SIZE || fail "could not write the rows"

echo "== $CONNS x $STREAMS stalled scans through the router"
python3 "$HERE/hostile/hold.py" serve-while-stalled "$RPORT" t "$CONNS" "$STREAMS" \
  "$ROUTER_PID,$NODE_PID" "$LIMIT" $ROWS $SIZE || fail "calls to the node starved"
echo PASS
