#!/usr/bin/env bash
# router_smoke.sh — one cluster of two strata-node members behind strata-router, driven by the
# official cbt CLI: a table with initial splits (so its tablets land on both nodes), writes and
# reads across tablets (forward, reversed, with a row limit), count, a bulk import (MutateRows
# fanned out per node), a second router that sees the same tables, a restarted router that comes
# back with them, and deletetable.
# Usage: router_smoke.sh PATH/TO/strata-node PATH/TO/strata-router
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

dir=$(make_tmp)
start_member "$dir/n1" 1; A1=$NODE_ADDR
start_member "$dir/n2" 2; A2=$NODE_ADDR
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $A1 $dir/n1
node = $A2 $dir/n2
TOPO

start_router "$dir/topology" "$dir/r1.log"; R1=$ROUTER_ADDR

fail=0
expect() { # WHAT WANT GOT
  if [ "$2" != "$3" ]; then echo "FAIL: $1: want '$2', got '$3'"; fail=1; else echo "ok: $1"; fi
}
keys() { grep -E '^[a-z0-9]+$' | tr '\n' ' ' | sed 's/ $//'; }

cbtr "$R1" createtable t1 families=cf1:maxversions=2 splits=g,p || { echo "FAIL: createtable"; fail=1; }
expect "ls" "t1" "$(cbtr "$R1" ls)"
for k in a b h m q z; do cbtr "$R1" set t1 "$k" "cf1:c=v$k@1000" || fail=1; done
expect "read across tablets" "a b h m q z" "$(cbtr "$R1" read t1 | keys)"
expect "reversed read" "z q m h b a" "$(cbtr "$R1" read t1 reversed=true | keys)"
expect "read with a row limit" "a b h m" "$(cbtr "$R1" read t1 count=4 | keys)"
expect "reversed with a limit" "z q m" "$(cbtr "$R1" read t1 count=3 reversed=true | keys)"
expect "range read" "b h m" "$(cbtr "$R1" read t1 start=b end=q | keys)"
expect "lookup" '"vm"' "$(cbtr "$R1" lookup t1 m | grep -o '"vm"')"
expect "count" "6" "$(cbtr "$R1" count t1)"
printf ',cf1\n,x\nc1,1\nk2,2\nr3,3\nzz4,4\n' >"$dir/imp.csv"
cbtr "$R1" import t1 "$dir/imp.csv" >/dev/null || { echo "FAIL: import"; fail=1; }
expect "count after import" "10" "$(cbtr "$R1" count t1)"

# A second router shares the metadata: it sees t1 and a table it creates is seen by the first.
start_router "$dir/topology" "$dir/r2.log"; R2=$ROUTER_ADDR
expect "second router reads" "10" "$(cbtr "$R2" count t1)"
cbtr "$R2" createtable t2 || { echo "FAIL: createtable t2"; fail=1; }
# The first router re-reads the metadata every second: poll its listing (hang guard: 300 tries
# 0.2 s apart), then assert what it shows, so a slow machine waits longer instead of failing.
tables_r1() { cbtr "$R1" ls | tr '\n' ' ' | sed 's/ $//'; }
for _ in $(seq 1 300); do [ "$(tables_r1)" = "t1 t2" ] && break; sleep 0.2; done
expect "first router sees t2" "t1 t2" "$(tables_r1)"

# Restart the first router: same tables, same data.
kill "$ROUTER_PID" 2>/dev/null; wait "$ROUTER_PID" 2>/dev/null
start_router "$dir/topology" "$dir/r3.log"; R3=$ROUTER_ADDR
expect "restarted router: tables" "t1 t2" "$(cbtr "$R3" ls | tr '\n' ' ' | sed 's/ $//')"
expect "restarted router: rows" "10" "$(cbtr "$R3" count t1)"
expect "restarted router: families" "cf1" "$(cbtr "$R3" ls t1 | awk 'NR>2 {print $1}')"

cbtr "$R3" deletetable t2 || { echo "FAIL: deletetable"; fail=1; }
expect "ls after deletetable" "t1" "$(cbtr "$R3" ls)"
expect "deleted table is gone" "1" "$(cbtr "$R3" read t2 | grep -c NotFound)"

[ $fail -eq 0 ] && echo "router_smoke: passed" || echo "router_smoke: FAILED"
exit $fail
