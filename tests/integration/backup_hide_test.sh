#!/usr/bin/env bash
# backup_hide_test.sh — a CreateBackup that fails (cancelled) seen through a second router of
# the instance while the first router's metadata writes are slow (the second cluster's node
# stopped): the second router never shows the backup gone while its operation runs, nor shown
# once its operation failed (backup_hide).
# Usage: backup_hide_test.sh strata-node strata-router backup_hide
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
HIDE=$3

dir=$(make_tmp)
start_member "$dir/e1" 1; E1=$NODE_ADDR
start_member "$dir/e2" 2; E2=$NODE_ADDR; E2_PID=$NODE_PID
start_member "$dir/w1" 3; W1=$NODE_ADDR; W1_PID=$NODE_PID
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $E1 $dir/e1
node = $E2 $dir/e2
[cluster west]
zone = zone-b
node = $W1 $dir/w1
TOPO
start_router "$dir/topology" "$dir/ra.log"; RA=$ROUTER_ADDR
start_router "$dir/topology" "$dir/rb.log"; RB=$ROUTER_ADDR
timeout 240 "$HIDE" "$RA" "$RB" "$E2_PID" "$W1_PID"
rc=$?
kill -CONT "$E2_PID" "$W1_PID" 2>/dev/null
if grep -l 'Sanitizer' "$dir"/r*.log "$dir"/*1.log "$dir"/e2.log; then echo "FAIL: sanitizer report"; rc=1; fi
[ $rc = 0 ] || tail -n 30 "$dir/ra.log"
[ $rc = 0 ] && echo "PASS" || echo "FAILED"
exit $rc
