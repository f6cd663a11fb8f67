#!/usr/bin/env bash
# router_unix_test.sh — strata-router reaching its nodes through Unix-domain sockets
# (strata-node --unix DATA/node.sock; docs/router.md, "Unix sockets"), driven by cbt.
#  1. The topology names TCP addresses where nothing listens, so the router can only use the
#     sockets: createtable with splits (tablets on both nodes), set (MutateRow), read / lookup /
#     count (ReadRows), import (MutateRows), a node restarted (its socket file removed at exit,
#     made again at start), deletetable.
#  2. Fallback: a node killed with -9 leaves its socket file behind and comes back serving TCP
#     only; a router with the real TCP addresses finds the stale socket refused and uses TCP.
# Usage: router_unix_test.sh PATH/TO/strata-node PATH/TO/strata-router
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

dir=$(make_tmp)
fail=0
expect() { # WHAT WANT GOT
  if [ "$2" != "$3" ]; then echo "FAIL: $1: want '$2', got '$3'"; fail=1; else echo "ok: $1"; fi
}
keys() { grep -E '^[a-z0-9]+$' | tr '\n' ' ' | sed 's/ $//'; }

start_member "$dir/n1" 1 127.0.0.1:0 --unix; A1=$NODE_ADDR; P1=$NODE_PID
start_member "$dir/n2" 2 127.0.0.1:0 --unix; A2=$NODE_ADDR
expect "node 1 made its socket" "yes" "$([ -S "$dir/n1/node.sock" ] && echo yes)"
expect "node 2 made its socket" "yes" "$([ -S "$dir/n2/node.sock" ] && echo yes)"

# 1. Only the sockets lead to the nodes.
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = 127.0.0.1:$(free_port) $dir/n1
node = 127.0.0.1:$(free_port) $dir/n2
TOPO
start_router "$dir/topology" "$dir/r1.log" --balance off; R1=$ROUTER_ADDR

cbtr "$R1" createtable t1 families=cf1 splits=m || { echo "FAIL: createtable"; fail=1; }
for k in a b q z; do cbtr "$R1" set t1 "$k" "cf1:c=v$k" || fail=1; done
expect "read across both nodes" "a b q z" "$(cbtr "$R1" read t1 | keys)"
expect "reversed read" "z q b a" "$(cbtr "$R1" read t1 reversed=true | keys)"
expect "lookup" '"vq"' "$(cbtr "$R1" lookup t1 q | grep -o '"vq"')"
printf ',cf1\n,c\nc1,1\nr3,3\n' >"$dir/imp.csv"
cbtr "$R1" import t1 "$dir/imp.csv" >/dev/null || { echo "FAIL: import"; fail=1; }
expect "count after import" "6" "$(cbtr "$R1" count t1)"

# Node 1 restarts: its socket goes with it and comes back; the router reconnects through it.
kill "$P1"; wait "$P1" 2>/dev/null
expect "socket removed at exit" "gone" "$([ -e "$dir/n1/node.sock" ] || echo gone)"
start_member "$dir/n1" 1 "$A1" --unix; P1=$NODE_PID
got=""
for i in $(seq 1 50); do
  got=$(cbtr "$R1" read t1 | keys)
  [ "$got" = "a b c1 q r3 z" ] && break
  sleep 0.2
done
expect "read after node restart" "a b c1 q r3 z" "$got"
cbtr "$R1" set t1 b "cf1:c=again" || fail=1
expect "write after node restart" '"again"' "$(cbtr "$R1" lookup t1 b | grep -o '"again"')"

# 2. Node 1 dies (-9: the socket file stays) and comes back on TCP only, same address.
kill -9 "$P1"; wait "$P1" 2>/dev/null
expect "stale socket left by kill -9" "yes" "$([ -S "$dir/n1/node.sock" ] && echo yes)"
start_member "$dir/n1" 1 "$A1"; P1=$NODE_PID
cat >"$dir/topology2" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $A1 $dir/n1
node = $A2 $dir/n2
TOPO
start_router "$dir/topology2" "$dir/r2.log" --balance off; R2=$ROUTER_ADDR
got=""
for i in $(seq 1 50); do
  got=$(cbtr "$R2" read t1 | keys)
  [ "$got" = "a b c1 q r3 z" ] && break
  sleep 0.2
done
expect "stale socket: router falls back to TCP" "a b c1 q r3 z" "$got"
expect "the stale socket was tried first" "yes" \
  "$(grep -q "client connection failed\" peer=unix:$dir/n1/node.sock" "$dir/r2.log" && echo yes)"

cbtr "$R2" deletetable t1 || { echo "FAIL: deletetable"; fail=1; }

[ $fail -eq 0 ] && echo "router_unix_test: passed" || echo "router_unix_test: FAILED"
exit $fail
