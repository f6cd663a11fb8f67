#!/usr/bin/env bash
# backup_race_test.sh — two strata-routers of one instance (one node) take CreateBackup,
# CopyBackup, RestoreTable and BeginImport calls for the same id at the same moment: exactly one
# is accepted and the other answers ALREADY_EXISTS (the name is taken with a compare-and-set in
# the metadata table); also when the second router's copy of the metadata is stale
# (backup_race); and three UpdateBackup calls with a DeleteBackup of one backup at once leave it
# deleted (an update that read the record before the delete used to write it back).
# Usage: backup_race_test.sh strata-node strata-router backup_race
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
RACE=$3

dir=$(make_tmp)
start_member "$dir/n1" 1
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $NODE_ADDR $dir/n1
TOPO
start_router "$dir/topology" "$dir/ra.log"; RA=$ROUTER_ADDR
start_router "$dir/topology" "$dir/rb.log"; RB=$ROUTER_ADDR
timeout 240 "$RACE" "$RA" "$RB" 3
rc=$?
if grep -l 'Sanitizer' "$dir"/r*.log "$dir"/n1.log; then echo "FAIL: sanitizer report"; rc=1; fi
[ $rc = 0 ] && echo "PASS" || echo "FAILED"
exit $rc
