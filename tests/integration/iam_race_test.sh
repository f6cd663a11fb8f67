#!/usr/bin/env bash
# iam_race_test.sh — two strata-routers of one instance (one node) take SetIamPolicy calls with
# the same etag at the same moment: exactly one stores its policy, the other ends ABORTED (the
# store is a compare-and-set in the metadata table, not a check against each router's own copy);
# and a router whose copy is stale refuses an etag another router already used; two sets without
# an etag at once both succeed; sets of a table's policy racing its DeleteTable leave no policy
# to a table created again under that name (iam_race).
# Usage: iam_race_test.sh strata-node strata-router iam_race
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
timeout 300 "$RACE" "$RA" "$RB" 5
rc=$?
if grep -l 'Sanitizer' "$dir"/r*.log "$dir"/n1.log; then echo "FAIL: sanitizer report"; rc=1; fi
[ $rc = 0 ] && echo "PASS" || echo "FAILED"
exit $rc
