#!/usr/bin/env bash
# slow_reader_test.sh — ReadRows calls whose client never reads must not make strata-node or
# strata-router hold memory beyond --max-queued-response-bytes plus one message per such call
# (docs/operations.md, "Clients that do not read"), other clients must keep being served
# meanwhile, and once the readers read, every call must complete with every row.
#
# A node and a router, both with --max-queued-response-bytes 8m, serve a table of 16 rows of
# 256 KiB. CONNS x STREAMS scans that never read are opened, through the router and then straight
# to the node; once the processes' RSS settles it must be under 64 MiB + the budget + 2 MiB per
# stalled call through the router (each call may hold one ~1 MiB message, and the router 256 KiB
# more per paused node call), 1.5 MiB per call straight to the node. Then a scan from another
# connection must return every row, and the stalled readers read: every stream must end with
# every row, each once. Before these bounds the router passed 500 MB and the node 460 MB here.
# Under AddressSanitizer (its quarantine keeps freed memory) only the RSS bound is skipped.
# Usage: slow_reader_test.sh PATH/TO/strata-node PATH/TO/strata-router [CONNS STREAMS]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
CONNS=${3:-2}
STREAMS=${4:-100}
ROWS=16
SIZE=262144
BUDGET_MB=8
LIMIT=$((64 + BUDGET_MB + CONNS * STREAMS * 2))
NODE_LIMIT=$((64 + BUDGET_MB + CONNS * STREAMS * 3 / 2))
if grep -aq __asan_init "$NODE_BIN"; then
  echo "AddressSanitizer build: RSS is not checked"
  LIMIT=100000
  NODE_LIMIT=100000
fi

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
start_router "$dir/topology" "$dir/router.log" --balance off --max-queued-response-bytes ${BUDGET_MB}m
RPORT=${ROUTER_ADDR##*:}
fail() {
  echo "FAIL: $*"
  tail -n 20 "$dir/n1.log" "$dir/router.log"
  exit 1
}

python3 "$HERE/hostile/hold.py" create "$RPORT" t || fail "createtable through the router"
python3 "$HERE/hostile/hold.py" write "$RPORT" t $ROWS $SIZE || fail "could not write the rows"

echo "== $CONNS x $STREAMS stalled scans through the router (limit $LIMIT MB per process)"
python3 "$HERE/hostile/hold.py" stall-then-read "$RPORT" t "$CONNS" "$STREAMS" \
  "$ROUTER_PID,$NODE_PID" "$LIMIT" $ROWS $SIZE || fail "through the router"
echo "== $CONNS x $STREAMS stalled scans straight to the node (limit $NODE_LIMIT MB)"
python3 "$HERE/hostile/hold.py" stall-then-read "${NODE_ADDR##*:}" t "$CONNS" "$STREAMS" \
  "$NODE_PID" "$NODE_LIMIT" $ROWS $SIZE || fail "straight to the node"
echo PASS
