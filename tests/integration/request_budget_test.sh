#!/usr/bin/env bash
# request_budget_test.sh — a request that announces a large message and sends little of it must
# not take --max-buffered-request-bytes from other calls (docs/operations.md, Connection limits).
# A node and a router with the default limits (256 MiB budget and messages); on each, one
# connection opens two MutateRows streams announcing 256 MiB - 1 bytes and trickles 2 KiB/s.
# Meanwhile MutateRow and ReadRows on fresh connections, to the node and through the router,
# must succeed, and so must a 64 MiB MutateRow through the router. Before the budget followed
# the bytes received, the first announcement reserved the whole budget and every other call of
# the process was refused RESOURCE_EXHAUSTED. Skips (77) without python3.
# Usage: request_budget_test.sh PATH/TO/strata-node PATH/TO/strata-router
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }

dir=$(make_tmp)
"$NODE_BIN" --data "$dir/n1" --listen 127.0.0.1:0 --node-num 1 >"$dir/n1.log" 2>&1 &
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
start_router "$dir/topology" "$dir/router.log" --balance off
RPORT=${ROUTER_ADDR##*:}

python3 "$HERE/hostile/hold.py" create "$RPORT" t || { echo "FAIL: CreateTable"; exit 1; }
if ! python3 "$HERE/hostile/announce.py" t "$RPORT" "${NODE_ADDR##*:}"; then
  echo "FAIL: announced request sizes took the request budget from other calls"
  tail -n 20 "$dir/n1.log" "$dir/router.log"
  exit 1
fi
echo PASS
